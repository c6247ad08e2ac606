"""Which part of an address range of this process sits on huge pages, page by page.

``/proc/self/smaps`` sums whole mappings, and NumPy's arrays share theirs with
other blocks, so it cannot say which pages one array got.  The ``PAGEMAP_SCAN``
ioctl on ``/proc/self/pagemap`` (Linux 6.7 and later, no privileges needed) walks
just the range and reports runs of pages by category: ``PAGE_IS_PRESENT`` and
``PAGE_IS_HUGE`` (a transparent or hugetlb huge page).  Where the kernel lacks it,
:func:`huge_share` says None.

It matters to the numbers: a single copy between processes (CMA) pins the
sender's pages one by one, so on the 2-core EPYC a 2 MiB message took 134 µs from
small pages and 38 µs from huge ones, and NumPy's arrays of 4 MiB and more get
huge pages on their 2 MiB-aligned interior only (docs/benchmarks.md, "Pages of a
single copy").
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from typing import Iterable, Optional

#: ``include/uapi/linux/fs.h``: the categories of a page.
PAGE_IS_PRESENT = 1 << 3
PAGE_IS_HUGE = 1 << 6
PAGE_BYTES = 4096


class _Region(ctypes.Structure):
    """``struct page_region``: [start, end) and its categories."""

    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64),
                ("categories", ctypes.c_uint64)]


class _ScanArg(ctypes.Structure):
    """``struct pm_scan_arg``."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


#: ``_IOWR('f', 16, struct pm_scan_arg)``.
PAGEMAP_SCAN = (3 << 30) | (ctypes.sizeof(_ScanArg) << 16) | (ord("f") << 8) | 16
#: Regions one ioctl fills before it returns to be called again from where it stopped.
_BATCH = 256


def huge_bytes(ranges: Iterable[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """(bytes on huge pages, bytes present) over ``ranges`` of (address, bytes), each
    widened to whole 4 KiB pages; None where the kernel has no ``PAGEMAP_SCAN``."""
    regions = (_Region * _BATCH)()
    huge = present = 0
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return None
    try:
        for address, nbytes in ranges:
            cursor = address - address % PAGE_BYTES
            end = -(-(address + nbytes) // PAGE_BYTES) * PAGE_BYTES
            while cursor < end:
                arg = _ScanArg(size=ctypes.sizeof(_ScanArg), start=cursor, end=end,
                               vec=ctypes.addressof(regions), vec_len=_BATCH,
                               category_anyof_mask=PAGE_IS_PRESENT,
                               return_mask=PAGE_IS_PRESENT | PAGE_IS_HUGE)
                filled = fcntl.ioctl(fd, PAGEMAP_SCAN, arg)
                for region in regions[:filled]:
                    present += region.end - region.start
                    if region.categories & PAGE_IS_HUGE:
                        huge += region.end - region.start
                if arg.walk_end <= cursor:          # pragma: no cover (the kernel always moves on)
                    break
                cursor = arg.walk_end
    except OSError as e:
        if e.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise
    finally:
        os.close(fd)
    return huge, present


def available() -> bool:
    """Whether the kernel answers ``PAGEMAP_SCAN`` here, asked about one page of this process
    (an empty list of ranges asks the kernel nothing)."""
    probe = bytearray(PAGE_BYTES)
    address = ctypes.addressof((ctypes.c_char * PAGE_BYTES).from_buffer(probe))
    return huge_bytes([(address, PAGE_BYTES)]) is not None


def huge_share(ranges: Iterable[tuple[int, int]]) -> Optional[float]:
    """The part of the present pages of ``ranges`` that are huge (0 where none is present);
    None where the kernel cannot say."""
    got = huge_bytes(ranges)
    if got is None:
        return None
    huge, present = got
    return huge / present if present else 0.0
