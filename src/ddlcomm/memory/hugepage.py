"""``hugepage``: 2 MiB pages, from the hugetlb pool if it has room, else transparent huge pages.

First ``mmap(MAP_HUGETLB)``: it succeeds only if the pool reserved with
``vm.nr_hugepages`` has enough free pages (they are reserved at mmap time, so
no later SIGBUS).  Otherwise an anonymous mapping aligned to the huge-page
size with ``MADV_HUGEPAGE`` (THP mode ``madvise`` or ``always``).  The size
is rounded up to whole huge pages (at most 2 MiB more).  THP is best effort:
if the kernel finds no free 2 MiB frame at the first touch it uses 4 KiB pages,
so read :meth:`Buffer.placement` (``huge_kb`` against ``rss_kb``) to know.
Placement records ``method``: ``hugetlb`` or ``thp``.
"""
from __future__ import annotations

import errno
import os

from ..errors import UnsupportedError
from . import vm
from .base import Buffer, from_mapping, require_linux

_HINT = ("enable transparent huge pages (echo madvise > /sys/kernel/mm/transparent_hugepage/enabled) "
         "or reserve hugetlb pages (sysctl vm.nr_hugepages=N)")


def check(arg: str | None, hbw_fallback: str | None) -> None:
    require_linux("hugepage")
    if vm.thp_mode() in (None, "never") and vm.hugetlb_pages(vm.huge_page_bytes()) == 0:
        raise UnsupportedError(f"memory kind hugepage: no hugetlb pages are reserved and transparent huge "
                               f"pages are {vm.thp_mode() or 'not in this kernel'}", _HINT)


def allocate(spec: str, arg: str | None, nbytes: int, hbw_fallback: str | None) -> Buffer:
    check(arg, hbw_fallback)
    huge = vm.huge_page_bytes()
    length = vm.round_up(nbytes, huge)
    try:
        # the pool of pages of that size: the default pool's may be 1 GiB, which this mapping's
        # 2 MiB alignment and length do not fit (EINVAL, or past the reservation)
        mapping = vm.map_region(length, align=huge, flags=vm.MAP_PRIVATE | vm.MAP_ANONYMOUS | vm.map_huge(huge))
        return from_mapping("hugepage", spec, nbytes, mapping, {"method": "hugetlb"})
    except OSError as exc:
        hugetlb_refused = f"{errno.errorcode.get(exc.errno or 0, exc.errno)} ({os.strerror(exc.errno or 0)})"
    mode = vm.thp_mode()
    if mode in (None, "never"):
        raise UnsupportedError(f"memory kind hugepage: hugetlb refused {length} bytes ({hugetlb_refused}) and "
                               f"transparent huge pages are {mode or 'not in this kernel'}", _HINT)
    mapping = vm.map_region(length, align=huge)
    try:
        vm.madvise(mapping.address, mapping.length, vm.MADV_HUGEPAGE)
    except OSError:
        mapping.unmap()
        raise
    return from_mapping("hugepage", spec, nbytes, mapping,
                        {"method": "thp", "thp_mode": mode, "hugetlb_refused": hugetlb_refused})
