"""Where ranks and their memory go: ranks over containers, cpus and NUMA nodes.

The layout of a run, apart from anything that creates or launches it: ranks in
blocks over containers (:func:`split_ranks`: ranks 0..a-1 in c0, ...), the
path two ranks' MPI takes as that layout implies (:func:`transport`: shared
memory within a container, TCP across, since containers share no /dev/shm, IPC
namespace or hostname), the cpus and NUMA nodes each container or rank is bound
to (:func:`cpu_sets`, from :func:`numa_nodes`), and taskset's cpu-list syntax.
Pure except :func:`numa_nodes`, which reads sysfs.  Used by
:mod:`.containers` (which creates the containers), :mod:`.commands` (the
launchers' command lines) and the benchmark's stored placement fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import UnsupportedError, UsageError
from ..units import parse_id_list

__all__ = ["BINDS", "CpuPlan", "check_bind", "cpu_sets", "format_cpulist", "numa_nodes", "physical_cores",
           "split_ranks", "transport"]

#: How ranks (or containers) may be bound: not at all, to cores, to NUMA nodes.
BINDS = ("none", "core", "numa")


def check_bind(bind: str) -> None:
    """UsageError unless ``bind`` is one of :data:`BINDS`."""
    if bind not in BINDS:
        raise UsageError(f"unknown binding {bind!r}", f"use one of {', '.join(BINDS)}")


def transport(container_of_a: int, container_of_b: int, across: str = "tcp") -> str:
    """How two ranks in the given containers (or hosts) talk: shared memory within
    one, ``across`` between them (pure)."""
    return "shared memory" if container_of_a == container_of_b else across


def split_ranks(nranks: int, containers: int) -> list[list[int]]:
    """Ranks in blocks over containers, sizes differing by at most one (pure).

    ``split_ranks(5, 2) == [[0, 1, 2], [3, 4]]``.
    """
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise UsageError(f"rank count must be a positive integer, not {nranks!r}")
    if isinstance(containers, bool) or not isinstance(containers, int) or containers < 1:
        raise UsageError(f"container count must be a positive integer, not {containers!r}")
    if containers > nranks:
        raise UsageError(f"{containers} containers for {nranks} ranks: a container would be empty",
                         "use at most as many containers as ranks")
    base, extra = divmod(nranks, containers)
    out, start = [], 0
    for i in range(containers):
        n = base + (1 if i < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


@dataclass(frozen=True)
class CpuPlan:
    """Binding of each container: cpus and memory nodes (None: unbound), and notes."""
    cpus: list[Optional[list[int]]]
    mems: list[Optional[list[int]]]
    notes: list[str]


def cpu_sets(count: int, bind: str, available: Sequence[int],
             nodes: dict[int, list[int]]) -> CpuPlan:
    """The cpus (and NUMA nodes) of each of ``count`` containers, and notes on sharing (pure).

    ``core``: the available cpus dealt round-robin, so sets are disjoint; with
    fewer cpus than containers each container gets one cpu and some share.
    ``numa``: container i gets the cpus and the memory of NUMA node number
    ``i % len(nodes)`` (``nodes`` maps node id to its cpus).
    ``none``: no binding (None for each).
    """
    check_bind(bind)
    avail = sorted(set(available))
    if bind == "none":
        return CpuPlan([None] * count, [None] * count, [])
    if not avail:
        raise UnsupportedError("no cpus available to bind containers to")
    notes: list[str] = []
    if bind == "core":
        if len(avail) >= count:
            return CpuPlan([avail[i::count] for i in range(count)], [None] * count, notes)
        notes.append(f"{len(avail)} cpus for {count} containers: containers share cpus "
                     f"(cpu i % {len(avail)} for container i)")
        return CpuPlan([[avail[i % len(avail)]] for i in range(count)], [None] * count, notes)
    usable = [(nid, sorted(set(cpus) & set(avail))) for nid, cpus in sorted(nodes.items())]
    usable = [(nid, cpus) for nid, cpus in usable if cpus]
    if not usable:
        return CpuPlan([avail] * count, [None] * count,
                       ["no NUMA node information: containers get every cpu"])
    if count > len(usable):
        notes.append(f"{len(usable)} NUMA node(s) for {count} containers: containers share "
                     f"nodes (node i % {len(usable)} for container i)")
    picks = [usable[i % len(usable)] for i in range(count)]
    return CpuPlan([cpus for _, cpus in picks], [[nid] for nid, _ in picks], notes)


def numa_nodes() -> dict[int, list[int]]:
    """CPUs of each NUMA node by node id, from sysfs (empty when sysfs has none)."""
    nodes = {}
    for d in Path("/sys/devices/system/node").glob("node[0-9]*"):
        try:
            nodes[int(d.name[4:])] = parse_id_list((d / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return nodes


def physical_cores(cpus: Sequence[int], root: Path = Path("/sys/devices/system/cpu")) -> int:
    """How many physical cores ``cpus`` (logical cpus) lie on: their distinct (package,
    core) pairs in sysfs' topology; ``len(cpus)`` where sysfs does not say."""
    cores = set()
    for cpu in cpus:
        topo = root / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(),
                       (topo / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return len(cores)


def format_cpulist(cpus: Sequence[int]) -> str:
    """``[0, 2, 3]`` -> ``"0,2,3"`` (taskset's -c syntax, pure)."""
    return ",".join(str(c) for c in cpus)
