"""The :class:`Buffer` every memory kind returns, and the owner of its bytes.

A buffer's bytes belong to a :class:`Region` (an mmap, an hbw_malloc block, a
shared-memory segment).  NumPy views made by :meth:`Buffer.array` keep the
region alive, so a buffer that is dropped without :meth:`Buffer.free` is
released only when its last view is gone.  :meth:`Buffer.free` releases it at
once: views made before must not be used afterwards (their memory is
unmapped; touching it crashes the process).
"""
from __future__ import annotations

import errno
import sys
from typing import Any, Callable, Protocol

import numpy as np

from ..errors import UnsupportedError, UsageError
from . import smaps, vm


class Region:
    """``nbytes`` at ``address`` that ``release`` gives back, exactly once (or when garbage-collected).

    Exposes ``__array_interface__`` so that ``np.asarray(region)`` is a uint8
    view whose ``base`` is the region.
    """

    def __init__(self, address: int, nbytes: int, release: Callable[[], None]) -> None:
        self.address, self.nbytes = address, nbytes
        self._release: Callable[[], None] | None = release

    @property
    def __array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.address, False), "version": 3}

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - nothing can be raised from a finalizer
            pass


def as_numpy_dtype(dtype: Any) -> np.dtype:
    """A NumPy dtype from anything ``np.dtype`` takes, or a ddlcomm :class:`~ddlcomm.dtypes.DType`."""
    numpy_dtype = getattr(dtype, "numpy", dtype)
    try:
        return np.dtype(numpy_dtype)
    except TypeError:
        raise UsageError(f"not a dtype: {dtype!r}", "give e.g. 'float32' or np.float32") from None


class Buffer:
    """``nbytes`` bytes in memory kind ``kind``, allocated from ``spec`` (e.g. ``"numa:0"``).

    Host kinds give NumPy views with :meth:`array`; ``device`` gives a torch
    tensor (``tensor``; ``pinned`` has both).  ``address`` is the first byte.
    Call :meth:`placement` after the buffer was written: pages that were
    never touched have no placement yet.
    """

    def __init__(self, kind: str, spec: str, nbytes: int, *, region: Region | None = None,
                 raw: np.ndarray | None = None, tensor: Any = None,
                 span: tuple[int, int] | None = None, exclusive: bool = True,
                 info: dict | None = None) -> None:
        """``region`` owns host bytes (``raw`` defaults to a view of it); ``span`` is the
        ``[start, end)`` address range whose smaps entries describe the buffer, and
        ``exclusive`` says whether those mappings hold only this buffer.  ``info``
        goes into :meth:`placement` as is (its keys win over ``memory``/``spec``).
        """
        self.kind, self.spec, self.nbytes = kind, spec, nbytes
        self.tensor = tensor
        self._region = region
        self._raw = raw if raw is not None or region is None else np.asarray(region)
        self.address = region.address if region is not None else (
            raw.ctypes.data if raw is not None else (tensor.data_ptr() if tensor is not None else 0))
        self._span, self._exclusive = span, exclusive
        self._info = dict(info or {})
        self._freed = False

    @property
    def freed(self) -> bool:
        return self._freed

    def _alive(self, what: str) -> None:
        if self._freed:
            raise UsageError(f"{what} of a freed {self.spec} buffer", "allocate a new buffer")

    def array(self, dtype: Any, count: int) -> np.ndarray:
        """A writable, C-contiguous view of the first ``count * itemsize`` bytes as ``dtype``."""
        self._alive("array()")
        numpy_dtype = as_numpy_dtype(dtype)
        if self._raw is None:
            raise UnsupportedError(f"{self.spec} memory has no NumPy view",
                                   "use buffer.tensor or buffer.tensor_view(dtype, count)")
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
            raise UsageError(f"count must be a whole number >= 0, got {count!r}")
        need = int(count) * numpy_dtype.itemsize
        if need > self.nbytes:
            raise UsageError(f"{count} x {numpy_dtype} needs {need} bytes; the buffer has {self.nbytes}",
                             "allocate a larger buffer")
        return self._raw[:need].view(numpy_dtype)

    def tensor_view(self, dtype: Any, count: int) -> Any:
        """A torch view of the first ``count`` elements (``pinned`` and ``device`` buffers)."""
        self._alive("tensor_view()")
        if self.tensor is None:
            raise UnsupportedError(f"{self.spec} memory has no torch tensor", "use buffer.array(dtype, count)")
        # torch is optional: only pinned and device buffers hold a tensor
        import torch
        numpy_dtype = as_numpy_dtype(dtype)
        need = int(count) * numpy_dtype.itemsize
        if count < 0 or need > self.nbytes:
            raise UsageError(f"{count} x {numpy_dtype} does not fit in {self.nbytes} bytes")
        # By name: torch.from_numpy cannot read ml_dtypes' bfloat16
        return self.tensor[:need].view(getattr(torch, numpy_dtype.name))

    def placement(self) -> dict:
        """Where the pages really are, read back from the kernel now.

        Keys: ``memory`` (the kind), ``spec``, ``nbytes``, what the kind recorded
        (``method``, ``fallback``, ``shm_name``...), and for host memory the smaps
        figures (``rss_kb``, ``huge_kb``, ``page_kb``, ``vm_flags``... see
        :func:`ddlcomm.memory.smaps.summarize`; ``smaps_exclusive`` False when the
        mapping is shared with an allocator's other blocks) and ``numa_nodes``:
        pages per NUMA node, ``{"0": 16384}``, in pages of ``numa_page_kb`` KiB,
        plus ``pages_absent`` for pages never touched.  Call it after the buffer
        was written; it reads, it does not touch.
        """
        self._alive("placement()")
        out: dict[str, Any] = {"memory": self.kind, "spec": self.spec, "nbytes": self.nbytes}
        out.update(self._info)
        if self._span is None:
            return out
        start, end = self._span
        out.update(smaps.read_range(start, end))
        out["smaps_exclusive"] = self._exclusive
        out.update(numa_pages(self.address, self.nbytes, out["page_kb"] * 1024))
        return out

    def free(self) -> None:
        """Give the memory back now (munmap / hbw_free / unlink).  Idempotent.

        NumPy views made before must not be used afterwards.
        """
        if self._freed:
            return
        self._freed = True
        self._raw, self.tensor = None, None
        region, self._region = self._region, None
        if region is not None:
            region.release()

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"at 0x{self.address:x}"
        return f"<Buffer {self.spec} {self.nbytes} B {state}>"


def numa_pages(address: int, nbytes: int, page_bytes: int) -> dict:
    """``numa_nodes`` (pages per node), ``numa_page_kb`` and ``pages_absent`` of a range.

    ``numa_nodes`` is None (with ``numa_error``) where ``move_pages`` is refused
    (no NUMA in the kernel, or a container's seccomp profile).
    """
    start = address - address % page_bytes
    length = vm.round_up(address + max(nbytes, 1) - start, page_bytes)
    try:
        status = vm.page_nodes(start, length, page_bytes)
    except OSError as exc:
        return {"numa_nodes": None, "numa_error": str(exc), "numa_page_kb": page_bytes // 1024}
    values, counts = np.unique(status, return_counts=True)
    out: dict[str, Any] = {
        "numa_nodes": {str(int(v)): int(c) for v, c in zip(values, counts) if v >= 0},
        "numa_page_kb": page_bytes // 1024,
        "pages_absent": int(counts[values == -errno.ENOENT].sum()),
    }
    errors = {str(int(v)): int(c) for v, c in zip(values, counts) if v < 0 and v != -errno.ENOENT}
    if errors:
        out["numa_errors"] = errors  # negative errno -> pages
    return out


def require_linux(kind: str) -> None:
    """Raise :class:`UnsupportedError` off Linux (the host kinds use Linux mmap/madvise/mbind)."""
    if not sys.platform.startswith("linux"):
        raise UnsupportedError(f"memory kind {kind} needs Linux, this is {sys.platform}",
                               "run on Linux, or leave the memory kind at its default")


def from_mapping(kind: str, spec: str, nbytes: int, mapping: vm.Mapping, info: dict | None = None,
                 then: Callable[[], None] | None = None) -> Buffer:
    """A buffer over a :func:`vm.map_region` mapping; freeing unmaps it, then runs ``then``."""
    def release() -> None:
        try:
            mapping.unmap()
        finally:
            if then is not None:
                then()
    region = Region(mapping.address, nbytes, release)
    return Buffer(kind, spec, nbytes, region=region, span=(mapping.address, mapping.address + mapping.length),
                  info=info)


class KindImpl(Protocol):
    """What a memory-kind module provides (the module itself, or an object in it)."""

    def check(self, arg: str | None, hbw_fallback: str | None) -> None:
        """Raise if this kind cannot be allocated here (nothing is allocated)."""

    def allocate(self, spec: str, arg: str | None, nbytes: int, hbw_fallback: str | None) -> Buffer:
        """Allocate ``nbytes`` (>= 0) bytes; ``spec`` is the normalized spec string."""
