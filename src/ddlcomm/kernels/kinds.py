"""Whether a buffer is host or device memory, asked of the CUDA driver, and the cache of it.

A library handed a raw pointer (an MPI, ddlcomm's own algorithms on any
buffer) must know whether it points into GPU memory before it copies or
reduces.  Asking costs a ``cudaPointerGetAttributes`` per buffer per call:
microseconds, which dominate small messages (Awan et al. 2019).
:func:`kind_of` asks the driver every time; :class:`KindCache` asks once per
(address, bytes) and drops the entry when the buffer is freed
(:meth:`KindCache.forget`), as awan2019's "buffer-kind cache" does.

The driver is reached through the first of :data:`QUERIES` that loads: CuPy's
``cupy.cuda.runtime.pointerGetAttributes``, else ``cudaPointerGetAttributes``
in ``libcudart`` through ctypes.  Without either (no CUDA on the machine)
there is no device memory to find, and every buffer is host memory, unasked.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import time
from typing import Callable, Optional

import numpy as np

from ..errors import UnsupportedError

HOST, DEVICE = "host", "device"

#: cudaMemoryType -> kind: Unregistered (pageable host), Host (pinned), Device, Managed
#: (reachable from GPU kernels, so reduced there).
MEMORY_TYPES = {0: HOST, 1: HOST, 2: DEVICE, 3: DEVICE}

#: The driver queries, tried in order: name -> loader returning ``query(address) -> cudaMemoryType``.
QUERIES: dict[str, Callable[[], Callable[[int], int]]] = {}


def kind_from_memory_type(code: int) -> str:
    """``"host"`` or ``"device"`` for a ``cudaMemoryType`` value (pure)."""
    try:
        return MEMORY_TYPES[int(code)]
    except KeyError:
        raise UnsupportedError(f"the CUDA driver reports memory type {code!r}, which ddlcomm "
                               "does not know", "expected 0-3 (unregistered, host, device, managed)") from None


def address(buf) -> tuple[int, int]:
    """(data address, bytes) of a NumPy array, a torch tensor or a CUDA-array-interface object."""
    if isinstance(buf, np.ndarray):
        return buf.__array_interface__["data"][0], buf.nbytes
    if hasattr(buf, "data_ptr"):                                 # torch.Tensor
        return buf.data_ptr(), buf.numel() * buf.element_size()
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None:
        n = int(np.prod(cai["shape"])) * np.dtype(cai["typestr"]).itemsize
        return cai["data"][0], n
    raise UnsupportedError(f"cannot tell where a {type(buf).__name__} lives",
                           "pass a NumPy array, a torch tensor or a CUDA array")


def _cupy_query() -> Callable[[int], int]:
    # CuPy is optional: only on GPU machines
    from cupy.cuda import runtime
    runtime.getDeviceCount()                       # raises without a usable device

    def query(ptr: int) -> int:
        return int(runtime.pointerGetAttributes(ptr).type)
    return query


class _Attributes(ctypes.Structure):
    """``cudaPointerAttributes`` as of CUDA 11 (type, device, devicePointer, hostPointer),
    with the ``long reserved[8]`` that CUDA 13's ``driver_types.h`` appends: a runtime that
    fills the larger struct must not write past ours (harmless padding for CUDA 11/12)."""
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                ("devicePointer", ctypes.c_void_p), ("hostPointer", ctypes.c_void_p),
                ("reserved", ctypes.c_long * 8)]


#: Sonames tried last: the loader finds them on its path, or already loaded (torch's own).
CUDART_SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


def cudart_paths() -> list[str]:
    """Where a ``libcudart`` may be: the loader's path, the nvidia wheels torch brings
    (``nvidia/cu13/lib`` since CUDA 13, ``nvidia/cuda_runtime/lib`` before), then the
    sonames (a library already loaded by torch answers to its soname)."""
    found = ctypes.util.find_library("cudart")
    paths = [found] if found else []
    for site in {os.path.dirname(os.path.dirname(np.__file__))}:
        paths += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libcudart.so*")))
        paths += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    return paths + [s for s in CUDART_SONAMES if s not in paths]


def _cudart_query() -> Callable[[int], int]:
    for path in cudart_paths():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError:
            continue
    else:
        raise OSError("no libcudart found")
    fn = lib.cudaPointerGetAttributes
    fn.argtypes, fn.restype = [ctypes.POINTER(_Attributes), ctypes.c_void_p], ctypes.c_int
    count = ctypes.c_int(0)
    if lib.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
        raise OSError("libcudart sees no CUDA device")

    def query(ptr: int) -> int:
        attrs = _Attributes()
        err = fn(ctypes.byref(attrs), ctypes.c_void_p(ptr))
        if err != 0:
            lib.cudaGetLastError()       # cleared: CUDA would report it at the next launch
            raise UnsupportedError(f"cudaPointerGetAttributes({ptr:#x}) failed with CUDA error {err}")
        return attrs.type
    return query


QUERIES.update({"cupy": _cupy_query, "cudart": _cudart_query})


@functools.lru_cache(maxsize=None)
def driver() -> tuple[Optional[Callable[[int], int]], str]:
    """(query, its name) of the first driver query of :data:`QUERIES` that loads, or
    (None, why none did): every buffer is then host memory."""
    why = []
    for name, load in QUERIES.items():
        try:
            return load(), name
        except Exception as exc:               # ImportError, OSError, a CUDA error: not usable
            why.append(f"{name}: {exc}")
    return None, "; ".join(why)


def kind_of(buf) -> str:
    """``"device"`` or ``"host"``: the driver asked about ``buf``'s address, every call."""
    query, _ = driver()
    if query is None:
        return DEVICE if getattr(buf, "is_cuda", False) else HOST
    ptr, nbytes = address(buf)
    if nbytes == 0 or ptr == 0:
        return DEVICE if getattr(buf, "is_cuda", False) else HOST
    return kind_from_memory_type(query(ptr))


class KindCache:
    """:func:`kind_of` remembered per (address, bytes); counts its hits and misses.

    ``lookup`` is the uncached look-up (default :func:`kind_of`, the driver).
    ``calls`` counts the look-ups, ``asked`` those the driver answered (the misses).
    """

    def __init__(self, lookup: Callable[[object], str] = kind_of) -> None:
        self._kinds: dict[tuple[int, int], str] = {}
        self._lookup = lookup
        self.hits = self.misses = 0

    def __call__(self, buf) -> str:
        key = address(buf)
        kind = self._kinds.get(key)
        if kind is None:
            self.misses += 1
            kind = self._kinds[key] = self._lookup(buf)
        else:
            self.hits += 1
        return kind

    @property
    def calls(self) -> int:
        return self.hits + self.misses

    @property
    def asked(self) -> int:
        return self.misses

    def __len__(self) -> int:
        return len(self._kinds)

    def forget(self, buf) -> None:
        """Drop every entry inside ``buf``'s bytes (call before its memory is freed and reused:
        blocks of it were looked up as slices)."""
        start, nbytes = address(buf)
        for key in [k for k in self._kinds if start <= k[0] < start + max(nbytes, 1)]:
            del self._kinds[key]

    def clear(self) -> None:
        self._kinds.clear()


class DriverAsked:
    """:func:`kind_of` on every look-up (``--kind-cache off``), counted as :class:`KindCache`
    counts: ``calls``, and ``asked`` (all of them)."""

    def __init__(self, lookup: Callable[[object], str] = kind_of) -> None:
        self._lookup = lookup
        self.calls = 0

    def __call__(self, buf) -> str:
        self.calls += 1
        return self._lookup(buf)

    @property
    def asked(self) -> int:
        return self.calls


def lookup(cache: bool) -> KindCache | DriverAsked:
    """The look-up ``--kind-cache on|off`` asks for: a fresh :class:`KindCache`, or the driver
    asked every time (:class:`DriverAsked`)."""
    return KindCache() if cache else DriverAsked()


#: Look-ups timed to price one (:func:`cost_us`).
COST_REPS = 200


def cost_us(cache: bool, buf, reps: int = COST_REPS) -> float:
    """µs one look-up of ``buf`` takes the way ``--kind-cache`` makes it, timed ``reps`` times
    after one untimed: a hit of a cache (on), the driver asked (off).  A fresh look-up is
    timed, so a bound call's counts stay its own."""
    look = lookup(cache)
    look(buf)
    start = time.perf_counter()
    for _ in range(reps):
        look(buf)
    return (time.perf_counter() - start) / reps * 1e6


def lookup_facts(look: KindCache | DriverAsked, calls: int, buf) -> dict:
    """What a bound call's kind look-ups were and cost, for its point: ``kind_lookups`` (the
    driver asked, over all ``calls`` calls), and where it made calls ``kind_lookups_per_call``,
    ``kind_lookup_us`` (one look-up, :func:`cost_us` on ``buf``) and their product,
    ``kind_lookup_us_per_call``: the same with the cache off less with it on is what the cache
    saves a call (Awan et al.'s small-message figure), unclouded by the call's other waits."""
    out: dict = {"kind_lookups": look.asked}
    if calls:
        per_call = look.calls / calls
        one = cost_us(isinstance(look, KindCache), buf)       # priced as ``look`` looks up
        out.update(kind_lookups_per_call=round(per_call, 3), kind_lookup_us=round(one, 4),
                   kind_lookup_us_per_call=round(per_call * one, 4))
    return out
