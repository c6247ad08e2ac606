"""``pageable``: ordinary 4 KiB pages, as C ``malloc`` gives a large block.

An anonymous private mmap with ``MADV_NOHUGEPAGE``, so the kernel never backs
it with transparent huge pages, even where THP is ``always`` (NumPy's own
allocator asks for THP on large arrays: its arrays are not "pageable" in this
sense).
"""
from __future__ import annotations

from . import vm
from .base import Buffer, from_mapping, require_linux


def check(arg: str | None, hbw_fallback: str | None) -> None:
    require_linux("pageable")


def map_small_pages(nbytes: int) -> vm.Mapping:
    """An anonymous mapping of ``nbytes`` (rounded up to pages) that never gets huge pages."""
    mapping = vm.map_region(vm.round_up(nbytes, vm.PAGE_BYTES))
    if vm.thp_mode() is not None:  # without THP in the kernel, madvise would say EINVAL
        try:
            vm.madvise(mapping.address, mapping.length, vm.MADV_NOHUGEPAGE)
        except OSError:
            mapping.unmap()
            raise
    return mapping


def allocate(spec: str, arg: str | None, nbytes: int, hbw_fallback: str | None) -> Buffer:
    check(arg, hbw_fallback)
    return from_mapping("pageable", spec, nbytes, map_small_pages(nbytes), {"method": "mmap+nohugepage"})
