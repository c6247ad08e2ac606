"""Cpuset cgroups: how a bound container keeps its processes on its cpus (as Docker's
``--cpuset-cpus`` and ``--cpuset-mems``), under cgroup v1 or v2, and the mounts that
let hwloc inside a container see its cpuset."""
from __future__ import annotations

import os
import shlex
import signal
import time
from pathlib import Path
from typing import Optional, Sequence

from .namespaces import cgroup_pids, mountinfo
from .placement import format_cpulist

#: How long removing a cpuset cgroup waits for its ended processes to leave it.
CGROUP_RMDIR_S = 10.0


def cpuset_root() -> Optional[tuple[Path, str]]:
    """Mount point of the cgroup hierarchy with the cpuset controller, and "v1" or "v2"."""
    for mp, fstype, opts in mountinfo():
        if fstype == "cgroup" and "cpuset" in opts.split(","):
            return Path(mp), "v1"
    for mp, fstype, _ in mountinfo():
        if fstype == "cgroup2":
            try:
                if "cpuset" in (Path(mp) / "cgroup.controllers").read_text().split():
                    return Path(mp), "v2"
            except OSError:
                continue
    return None


def own_cgroup(root: tuple[Path, str]) -> Path:
    """This process's cgroup directory in that hierarchy (new cpusets go beneath it)."""
    mp, kind = root
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (kind == "v1" and "cpuset" in controllers.split(",")) or \
                    (kind == "v2" and controllers == ""):
                return mp / path.lstrip("/")
    except (OSError, ValueError):
        pass
    return mp


def make_cpuset(name: str, cpus: Sequence[int], mems: Optional[Sequence[int]],
                notes: list[str]) -> Optional[Path]:
    """A cpuset cgroup ``name`` with these cpus (and memory nodes); None, with a note, if not."""
    root = cpuset_root()
    if root is None:
        notes.append("no cpuset cgroup here: containers are bound with taskset, "
                     "which MPI's own binding may override")
        return None
    parent = own_cgroup(root)
    cg = parent / name
    try:
        if root[1] == "v2":
            sub = parent / "cgroup.subtree_control"
            if "cpuset" not in sub.read_text().split():
                sub.write_text("+cpuset")
            all_mems = (parent / "cpuset.mems.effective").read_text().strip()
        else:
            all_mems = (parent / "cpuset.mems").read_text().strip()
        cg.mkdir()
        (cg / "cpuset.cpus").write_text(format_cpulist(cpus))
        (cg / "cpuset.mems").write_text(format_cpulist(mems) if mems else all_mems)
        return cg
    except OSError as exc:
        if cg.is_dir():
            rmdir_cgroup(cg)
        notes.append(f"cannot make a cpuset cgroup ({exc.strerror or exc}): containers are "
                     "bound with taskset, which MPI's own binding may override")
        return None


def rmdir_cgroup(cg: Path, wait_s: float = CGROUP_RMDIR_S) -> bool:
    """rmdir a cgroup, killing what is still in it until it is empty.

    EBUSY lasts while a process is in it: a command started just before the
    set's end can join after the set's processes were ended (``exec_prefix``
    joins on its way in), and on a loaded machine a killed process can take
    seconds to be gone.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cg.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            for pid in set(cgroup_pids(cg)) - {os.getpid()}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)


def cgroup_remount() -> str:
    """Shell commands that mount the host's cgroup hierarchies again on a fresh /sys.

    A container gets its own sysfs (so ``/sys/class/net`` lists its own
    interfaces); the cgroup mounts under it are remade so that hwloc (MPI's
    binding) sees the container's cpuset, as inside a Docker container.
    """
    cmds = []
    for mp, fstype, opts in mountinfo():
        if not (mp == "/sys/fs/cgroup" or mp.startswith("/sys/fs/cgroup/")) or "\\" in mp:
            continue
        q = shlex.quote(mp)
        if fstype == "tmpfs" and mp == "/sys/fs/cgroup":
            cmds.append(f"mount -t tmpfs -o mode=755,nosuid,nodev,noexec cgroup {q}")
        elif fstype == "cgroup":
            o = ",".join(x for x in opts.split(",") if x not in ("rw", "ro"))
            cmds.append(f"{{ mkdir -p {q}; mount -t cgroup -o {shlex.quote(o)} cgroup {q}; }}")
        elif fstype == "cgroup2":
            cmds.append(f"{{ mkdir -p {q}; mount -t cgroup2 cgroup2 {q}; }}")
    return "; ".join(cmds) or "true"
