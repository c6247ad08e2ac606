"""``hbw``: high-bandwidth memory (e.g. Xeon Phi MCDRAM in flat mode) through memkind.

Calls ``hbw_posix_memalign`` / ``hbw_free`` of ``libmemkind.so.0`` with ctypes.
memkind's default policy is *preferred*: when the HBW nodes are full it
silently uses other memory, so :meth:`Buffer.placement` reports
``hbw_verified`` (memkind's ``hbw_verify_memory_region``: every touched page
in HBW) beside the pages per node.  Where libmemkind is missing or
``hbw_check_available()`` says there is no HBW, allocation is refused, unless
``hbw_fallback="dram"`` was given: then the buffer is ``pageable`` memory and
placement records ``fallback: "dram"`` and ``fallback_reason``.
The smaps figures cover memkind's whole arena mapping (``smaps_exclusive``
False); ``numa_nodes`` is exact for the buffer.
"""
from __future__ import annotations

import ctypes
import errno
import os

from ..errors import UnsupportedError
from . import vm
from .base import Buffer, Region, from_mapping, require_linux
from .pageable import map_small_pages

LIBRARY = "libmemkind.so.0"
_INSTALL = "apt-get install libmemkind0 (dnf install memkind), or give --hbw-fallback dram (hbw_fallback='dram' in Python) to use ordinary DRAM"
_NO_HBW = ("hbw needs high-bandwidth memory (e.g. MCDRAM of a Xeon Phi in flat mode, or nodes named in "
           "MEMKIND_HBW_NODES); give --hbw-fallback dram (hbw_fallback='dram' in Python) to run in ordinary DRAM")
_lib: ctypes.CDLL | None = None


def _memkind() -> ctypes.CDLL:
    """libmemkind, loaded once; OSError if it is not installed."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(LIBRARY)
        lib.hbw_check_available.restype = ctypes.c_int
        lib.hbw_posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
        lib.hbw_free.argtypes = [ctypes.c_void_p]
        lib.hbw_verify_memory_region.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _lib = lib
    return _lib


def unavailable() -> tuple[str, str] | None:
    """Why hbw cannot be used here, as (message, hint); None if it can."""
    try:
        lib = _memkind()
    except OSError:
        return f"memory kind hbw needs memkind's {LIBRARY}, which is not installed", _INSTALL
    code = lib.hbw_check_available()
    if code != 0:
        return (f"no high-bandwidth memory on this machine (hbw_check_available() returned "
                f"{errno.errorcode.get(code, code)})", _NO_HBW)
    return None


def check(arg: str | None, hbw_fallback: str | None) -> None:
    require_linux("hbw")
    why = unavailable()
    if why is not None and hbw_fallback is None:
        raise UnsupportedError(*why)


def allocate(spec: str, arg: str | None, nbytes: int, hbw_fallback: str | None) -> Buffer:
    check(arg, hbw_fallback)
    why = unavailable()
    if why is not None:
        return from_mapping("hbw", spec, nbytes, map_small_pages(nbytes),
                            {"memory": "pageable", "method": "mmap+nohugepage", "fallback": hbw_fallback,
                             "fallback_reason": why[0]})
    lib = _memkind()
    pointer = ctypes.c_void_p()
    code = lib.hbw_posix_memalign(ctypes.byref(pointer), vm.PAGE_BYTES, max(nbytes, 1))
    if code != 0 or not pointer.value:
        raise UnsupportedError(f"hbw_posix_memalign of {nbytes} bytes failed: {os.strerror(code)}",
                               "allocate less, or give --hbw-fallback dram (hbw_fallback='dram' in Python)")
    address = pointer.value
    region = Region(address, nbytes, lambda: lib.hbw_free(ctypes.c_void_p(address)))
    return HbwBuffer("hbw", spec, nbytes, region=region, exclusive=False,
                       span=(address, address + vm.round_up(nbytes, vm.PAGE_BYTES)),
                       info={"method": "hbw_malloc"})


class HbwBuffer(Buffer):
    """A buffer from hbw_malloc: placement adds ``hbw_verified``."""

    def placement(self) -> dict:
        out = super().placement()
        code = _memkind().hbw_verify_memory_region(ctypes.c_void_p(self.address), max(self.nbytes, 1), 0)
        out["hbw_verified"] = code == 0
        return out
