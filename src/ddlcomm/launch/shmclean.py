"""Shared-memory segments that ranks ended abnormally leave in ``/dev/shm``.

MPI libraries remove their segments in ``MPI_Finalize``; a rank that is killed, or
that ends a run early with ``os._exit`` (a timeout, a failure, Ctrl-C), never gets
there, and Open MPI's 16 MiB ``sm_segment`` files or MPICH's ``mpich_shm`` ones stay
until reboot (this 2-core VM had 548 MiB of them after a day of tests).  The owner of
a run takes the names before it starts the ranks; after an abnormal end it removes
the segments of those libraries made since that no process maps or holds open.  A
rank that ends its run early removes the names of the segments it maps itself
(:func:`unlink_mine`): under a launcher of yours there is no owner to do it, and a
rank that was killed outright leaves it to the others, which its launcher then ends.
"""
from __future__ import annotations

import fnmatch
import os
from pathlib import Path

SHM = Path("/dev/shm")
#: What MPI libraries (and ddlcomm's shared buffers) name their segments: Open MPI's
#: shared-memory transport, MPICH's, ddlcomm's ``--memory shared``.
PATTERNS = ("sm_segment.*", "vader_segment.*", "mpich_shm_*", "mpich_shar_tmp*", "ddlcomm-*")


def names(folder: Path = SHM) -> set[str]:
    """What is in ``folder`` now (nothing where it cannot be read)."""
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return set()


def in_use(folder: Path = SHM) -> set[str]:
    """The names in ``folder`` that a process this one can look at maps or holds open."""
    prefix, used = f"{folder}/", set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for line in (proc / "maps").read_text().splitlines():
                at = line.find(prefix)
                if at >= 0:
                    used.add(line[at + len(prefix):].split(" ")[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    used.add(target[len(prefix):].split(" ")[0])
        except OSError:
            continue                  # gone, or another user's: its segments are not ours
    return used


def remove_left(before: set[str], folder: Path = SHM) -> tuple[int, int]:
    """Remove the segments of :data:`PATTERNS` made in ``folder`` since ``before`` (its
    names then) that no process uses; (how many, their bytes)."""
    new = [n for n in names(folder) - before if any(fnmatch.fnmatch(n, p) for p in PATTERNS)]
    if not new:
        return 0, 0
    used, count, size = in_use(folder), 0, 0
    for name in new:
        if name in used:
            continue
        try:
            size += (folder / name).stat().st_size
            (folder / name).unlink()
            count += 1
        except OSError:
            pass
    return count, size


def unlink_mine(folder: Path = SHM) -> int:
    """Remove the names of the segments of :data:`PATTERNS` this process maps (the job is
    ending: the ranks that still map one keep it until they exit); how many."""
    prefix, count = f"{folder}/", 0
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return 0
    mine = {line[line.find(prefix) + len(prefix):].split(" ")[0]
            for line in maps.splitlines() if prefix in line}
    for name in mine:
        if any(fnmatch.fnmatch(name, p) for p in PATTERNS):
            try:
                (folder / name).unlink()
                count += 1
            except OSError:
                pass                  # another rank was first
    return count
