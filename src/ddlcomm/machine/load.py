"""How busy the machine was around a run: load average, CPU time taken by
others, time stolen by a hypervisor, oversubscription.

A run takes a :func:`snapshot` before its ranks start and one after they end
(a few file reads: ``/proc/stat``, ``/proc/loadavg``, ``os.times()``);
:func:`summarize` turns the two into the numbers stored with the run, and
:func:`warnings` into what a user should be told.  Parsing and arithmetic are
pure functions of the files' text.

What the numbers mean (Linux; this host only):

* ``busy_s``: CPU time spent running anything (user, nice, system, irq,
  softirq; guests count in user) on the CPUs this process may use (its
  affinity), between the snapshots;
* ``own_cpu_s``: CPU time of the run's own processes: the owner and every
  child it waited for (the launcher and, through it, the ranks; the orphans a
  launcher left, reaped once it returns), from ``os.times()``; None when the ranks were started by someone else (a
  launcher you ran yourself), as their CPU time cannot be read from here;
* ``others_cpu_s = busy_s - own_cpu_s`` (at least 0): time other processes
  (and the kernel on their behalf) held the run's CPUs; ``others_cores`` is it
  over the wall time: how many of those CPUs others kept busy on average;
* ``steal_s``: the ``steal`` column: time a hypervisor gave the run's CPUs to
  another guest while this one had work;
* ``loadavg_before``/``_after``: 1, 5 and 15 minute load averages (the
  *after* one includes the run's own ranks).

The CPU times are in clock ticks (usually 10 ms), so runs shorter than a
second read coarsely.  A CPU quota of a container (cgroup) is not seen.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .cpus import affinity

#: /proc/stat columns after "cpuN", in order (older kernels have fewer).
STAT_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
                "guest", "guest_nice")
#: Columns that are a CPU running something of this system (guest time is inside user).
BUSY_COLUMNS = ("user", "nice", "system", "irq", "softirq")
#: Others' average busy cores that make a warning: a quarter of a core taken from the run.
OTHERS_CORES_WARN = 0.25
#: Share of the run's CPU time stolen by a hypervisor that makes a warning.
STEAL_WARN_FRACTION = 0.01
#: 1-minute load average per usable core, before the run, that makes a warning (the load
#: average counts runnable tasks and those waiting on disk, over all the host's CPUs).
LOADAVG_WARN_PER_CORE = 1.0

PROC_STAT = Path("/proc/stat")
PROC_LOADAVG = Path("/proc/loadavg")


def parse_loadavg(text: str) -> list[float]:
    """The 1, 5 and 15 minute load averages from ``/proc/loadavg``'s text."""
    fields = text.split()
    if len(fields) < 3:
        raise ValueError(f"not a /proc/loadavg line: {text!r}")
    return [float(f) for f in fields[:3]]


def parse_cpu_stat(text: str) -> dict[int, dict[str, int]]:
    """Per-CPU tick counters (``{cpu: {column: ticks}}``) from ``/proc/stat``'s text.

    The aggregate ``cpu`` line is left out: sums are taken over chosen CPUs.
    """
    out: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        values = [int(v) for v in rest.split()]
        out[int(name[3:])] = dict(zip(STAT_COLUMNS, values))
    return out


def cpu_ticks(per_cpu: Mapping[int, Mapping[str, int]], cpus: Sequence[int]) -> dict[str, int]:
    """``busy`` and ``steal`` ticks summed over ``cpus`` (those missing count 0)."""
    chosen = [per_cpu[c] for c in cpus if c in per_cpu]
    return {"busy": sum(row.get(col, 0) for row in chosen for col in BUSY_COLUMNS),
            "steal": sum(row.get("steal", 0) for row in chosen)}


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except OSError:
        return None


def snapshot(cpus: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """The machine now, as :func:`summarize` takes it (cheap: two small files).

    ``cpus``: the CPUs to count (default: this process's affinity).  A file
    that cannot be read leaves its keys None.
    """
    cpus = list(affinity() if cpus is None else cpus)
    stat, loadavg = _read(PROC_STAT), _read(PROC_LOADAVG)
    t = os.times()
    return {"wall": time.monotonic(), "cpus": cpus,
            "ticks": cpu_ticks(parse_cpu_stat(stat), cpus) if stat else None,
            "loadavg": parse_loadavg(loadavg) if loadavg else None,
            "own_cpu_s": t.user + t.system + t.children_user + t.children_system,
            "tick_s": 1.0 / os.sysconf("SC_CLK_TCK")}


def summarize(before: Mapping[str, Any], after: Mapping[str, Any], ranks: Optional[int],
              own: bool = True) -> dict[str, Any]:
    """The run's load record from two :func:`snapshot`\\ s (see the module's text).

    ``ranks``: the ranks on this host (None when unknown); ``own``: whether
    ``os.times()`` covers the ranks (they are this process's children).
    """
    wall = max(after["wall"] - before["wall"], 0.0)
    out: dict[str, Any] = {
        "ranks": ranks, "usable_cores": len(before["cpus"]), "wall_s": round(wall, 3),
        "loadavg_before": before["loadavg"], "loadavg_after": after["loadavg"],
        "busy_s": None, "steal_s": None, "own_cpu_s": None, "others_cpu_s": None,
        "others_cores": None,
    }
    if before["ticks"] and after["ticks"]:
        tick = before["tick_s"]
        busy = (after["ticks"]["busy"] - before["ticks"]["busy"]) * tick
        out["busy_s"] = round(busy, 3)
        out["steal_s"] = round((after["ticks"]["steal"] - before["ticks"]["steal"]) * tick, 3)
        if own:
            mine = after["own_cpu_s"] - before["own_cpu_s"]
            others = max(busy - mine, 0.0)
            out["own_cpu_s"], out["others_cpu_s"] = round(mine, 3), round(others, 3)
            out["others_cores"] = round(others / wall, 3) if wall > 0 else None
    return out


def warnings(load: Mapping[str, Any]) -> list[str]:
    """What a user should know about a run's load record (empty when it ran undisturbed).

    Oversubscription (more ranks than usable CPUs), a 1-minute load average
    above :data:`LOADAVG_WARN_PER_CORE` per usable CPU before the run,
    others keeping at least :data:`OTHERS_CORES_WARN` of the run's CPUs busy,
    and a hypervisor stealing at least :data:`STEAL_WARN_FRACTION` of its CPU
    time.
    """
    if not load:
        return []
    out = []
    ranks, cores = load.get("ranks"), load.get("usable_cores")
    if ranks and cores and ranks > cores:
        out.append(f"oversubscribed: {ranks} ranks on {cores} usable CPUs, so ranks wait for "
                   "each other's time slices")
    avg = load.get("loadavg_before")
    if avg and cores and avg[0] > LOADAVG_WARN_PER_CORE * cores:
        out.append(f"loaded before the run: 1-minute load average {avg[0]:.2f} on {cores} usable "
                   "CPUs")
    others = load.get("others_cores")
    if others is not None and others >= OTHERS_CORES_WARN:
        out.append(f"busy machine: other processes kept {others:.2f} of the run's {cores} CPUs "
                   f"busy on average ({load.get('others_cpu_s'):.1f} s of CPU time)")
    steal, wall = load.get("steal_s"), load.get("wall_s")
    if steal and wall and cores and steal >= STEAL_WARN_FRACTION * wall * cores:
        out.append(f"stolen CPU time: the hypervisor gave {steal:.1f} s of the run's CPUs to "
                   f"other guests ({100 * steal / (wall * cores):.1f}%)")
    return out


def describe(load: Mapping[str, Any]) -> str:
    """One line of a run's load record, e.g. ``load 1.20 -> 2.31; others 0.05 cores, steal 0.0 s``."""
    if not load:
        return "-"

    def one(avg: Any) -> str:
        return f"{avg[0]:.2f}" if avg else "?"

    parts = [f"load average {one(load.get('loadavg_before'))} -> {one(load.get('loadavg_after'))}"]
    if load.get("others_cores") is not None:
        parts.append(f"others {load['others_cores']:.2f} cores ({load['others_cpu_s']:.1f} s)")
    elif load.get("busy_s") is not None:
        parts.append(f"busy {load['busy_s']:.1f} s (the ranks' own share unknown)")
    if load.get("steal_s") is not None:
        parts.append(f"steal {load['steal_s']:.1f} s")
    ranks = load.get("ranks")
    parts.append(f"{ranks if ranks is not None else '?'} ranks on {load.get('usable_cores')} CPUs"
                 f" over {load.get('wall_s', 0):.1f} s")
    return "; ".join(parts)
