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


def is_mpis(name: str) -> bool:
    """Whether a segment's name is one of :data:`PATTERNS`."""
    return any(fnmatch.fnmatch(name, p) for p in PATTERNS)


def mapped(proc: Path, folder: Path = SHM) -> set[str]:
    """The names in ``folder`` that process ``proc`` (``/proc/PID``) maps (OSError where it
    cannot be read)."""
    prefix = f"{folder}/"
    return {line[line.find(prefix) + len(prefix):].split(" ")[0]
            for line in (proc / "maps").read_text().splitlines() if prefix in line}


def in_use(folder: Path = SHM) -> set[str]:
    """The names in ``folder`` that a process this one can look at maps or holds open."""
    prefix, used = f"{folder}/", set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            used |= mapped(proc, folder)
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
    new = [n for n in names(folder) - before if is_mpis(n)]
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
    try:
        mine = [name for name in mapped(Path("/proc/self"), folder) if is_mpis(name)]
    except OSError:
        return 0
    count = 0
    for name in mine:
        try:
            (folder / name).unlink()
            count += 1
        except OSError:
            pass                      # another rank was first
    return count
