"""Share an array's pages with the other processes of the node, in place (``shm-map``).

:func:`share` moves the whole pages inside an array's bytes into a new segment
in /dev/shm, at the same addresses: it copies them into the segment, then
``mremap`` puts the segment where they were.  The array, and every view of it,
keeps its address and its values; other processes map the segment by name
(:func:`ddlcomm.memory.shared.attach`).  :meth:`Shared.release` (the last
user of those pages) puts private memory back the same way, keeping the
values.  This is what an MPI library does with XPMEM, without a kernel module.

Only memory that is plainly the process's own is moved: anonymous private
read-write mappings (``mmap``, the heap), not locked (``mlock``), not hugetlbfs,
not bound to a NUMA node; anything else raises UnsupportedError saying what it
is.  Memory a driver pinned in place (``cudaHostRegister``) looks like plain
memory here: never share it (``bench`` refuses ``--memory pinned``).  Pages in
transparent huge pages become small pages while shared, unless /dev/shm is mounted
with ``huge=`` (``ddlcomm info``: memory, /dev/shm's huge pages; ``never`` by default).

A process forked while pages are shared would share them with its parent; the
child makes them private again at once (``os.register_at_fork``).  Nothing may
write an array while :func:`share` or :meth:`Shared.release` moves it (set-up
and tear-down of a bound call).  Linux only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from . import shared, smaps, vm

#: VmFlags of smaps that keep pages where they are: locked, hugetlbfs, I/O or raw PFN mappings.
FIXED_FLAGS = {"lo": "locked (mlock)", "ht": "hugetlbfs pages", "io": "an I/O mapping",
               "pf": "a raw page-frame mapping", "sh": "shared already"}


@dataclass
class Shared:
    """Pages ``[address, address + length)`` of this process, now in segment ``name``."""

    name: str
    address: int
    length: int
    thp: int              # the madvise the private pages had: MADV_HUGEPAGE, MADV_NOHUGEPAGE or 0
    users: int = 1

    def release(self) -> None:
        """One user fewer; the last puts private pages back (values kept) if the pages are
        still this segment's (their owner may have unmapped them already)."""
        self.users -= 1
        if self.users == 0:
            _shared.pop(self.address, None)
            shared.unlink(self.name)
            _privatize(self)


#: What this process shares now, by first address.
_shared: dict[int, Shared] = {}


def pages_within(address: int, nbytes: int) -> tuple[int, int]:
    """``[first, end)``: the whole pages inside ``nbytes`` at ``address`` (empty: first == end)
    (pure)."""
    page = vm.PAGE_BYTES
    first, end = -(-address // page) * page, (address + nbytes) // page * page
    return (first, end) if end > first else (first, first)


def why_fixed(vmas: list[smaps.Vma], start: int, end: int, policies: dict[int, str]) -> str | None:
    """Why ``[start, end)`` cannot move (None: it can): every mapping over it must be anonymous,
    private, read-write, with none of :data:`FIXED_FLAGS` and the default NUMA policy
    (``policies``: numa_maps' policy by mapping start) (pure)."""
    hits = [v for v in vmas if v.start < end and v.end > start]
    if not hits or hits[0].start > start or hits[-1].end < end or any(
            a.end != b.start for a, b in zip(hits, hits[1:])):
        return "not all mapped"
    for v in hits:
        if v.perms != "rw-p" or v.path not in ("", "[heap]"):
            return f"a {v.perms} mapping of {v.path or 'anonymous memory'}"
        for flag in v.other.get("VmFlags", "").split():
            if flag in FIXED_FLAGS:
                return FIXED_FLAGS[flag]
        policy = policies.get(v.start, "default")
        if policy != "default":
            return f"NUMA policy {policy}"
    return None


def _policies() -> dict[int, str]:
    try:
        with open("/proc/self/numa_maps", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:                    # a kernel without NUMA: every policy is the default
        return {}
    return {int(fields[0], 16): fields[1] for fields in map(str.split, lines) if len(fields) > 1}


def _vmas() -> list[smaps.Vma]:
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        return smaps.parse_smaps(f.read())


def share(array: np.ndarray) -> Shared | None:
    """Move the whole pages of ``array``'s bytes into a segment (see the module); None where it
    has no whole page.  The same pages shared again count one more user; pages overlapping
    others shared already, or that cannot move, raise UnsupportedError."""
    first, end = pages_within(array.__array_interface__["data"][0], array.nbytes)
    if end == first:
        return None
    held = _shared.get(first)
    if held is not None and held.length == end - first:
        held.users += 1
        return held
    if any(s.address < end and s.address + s.length > first for s in _shared.values()):
        raise UnsupportedError("these buffers overlap others shared by another bound call",
                               "bind non-overlapping buffers")
    vmas = _vmas()
    reason = why_fixed(vmas, first, end, _policies())
    if reason is not None:
        raise UnsupportedError(f"a buffer's pages cannot be shared: {reason}",
                               "use --algorithm shm, or buffers of plain memory (--memory pageable)")
    flags = smaps.summarize(vmas, first, end)["vm_flags"].split()
    thp = vm.MADV_HUGEPAGE if "hg" in flags else vm.MADV_NOHUGEPAGE if "nh" in flags else 0
    name, fd = shared.create(end - first)
    try:
        vm.replace(first, end - first, vm.MAP_SHARED, fd)
    except BaseException:
        shared.unlink(name)
        raise
    finally:
        os.close(fd)
    _shared[first] = Shared(name, first, end - first, thp)
    return _shared[first]


def _privatize(held: Shared) -> None:
    mine = [v for v in _vmas() if v.start < held.address + held.length and v.end > held.address]
    if mine and all(held.name in v.path for v in mine):
        vm.replace(held.address, held.length, vm.MAP_PRIVATE | vm.MAP_ANONYMOUS,
                   advice=held.thp if vm.thp_mode() is not None else 0)


def _after_fork() -> None:
    for held in list(_shared.values()):
        _privatize(held)
    _shared.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
