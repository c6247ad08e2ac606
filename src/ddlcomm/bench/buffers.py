"""Benchmark buffers in the memory kind a run asks for, and what their pages got.

Without ``--memory`` buffers come from NumPy's own allocator (recorded as
``numpy``: it asks the kernel for transparent huge pages on large arrays, which
cover a fresh array's 2 MiB-aligned interior only; the part of them on huge
pages is recorded, each rank's, as ``huge_share_ranks`` where the kernel can say,
:mod:`ddlcomm.memory.pagescan`).
With it, every send and receive buffer of a point comes from
:mod:`ddlcomm.memory`, is read back after the point (huge pages, NUMA node)
and freed when the point is done.

A device kind (``--memory device``) gives torch CUDA tensors: the point's
inputs are filled and its results verified on host arrays, copied to and
from the device tensors around the untimed check (:class:`DeviceCopies`).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import numpy as np

from ..memory import allocate, on_device, pagescan
from ..collectives import numpy_alloc
from ..dtypes import DType, dtype_of
from ..memory.gpu import copy_in, copy_out


class PointBuffers:
    """The allocator of one point's buffers; a context manager that frees them."""

    def __init__(self, memory: Optional[str], hbw_fallback: Optional[str] = None) -> None:
        self.memory = memory
        self.hbw_fallback = hbw_fallback
        self._held: list = []
        #: NumPy's arrays of this point (memory None), for their pages
        self._arrays: list = []
        #: buffers are device tensors (host arrays are only the fill/verify copies)
        self.on_device = on_device(memory)

    def _allocate(self, dtype: DType, count: int):
        buf = allocate(self.memory, max(1, count * dtype.itemsize), self.hbw_fallback)
        self._held.append(buf)
        return buf

    def alloc(self, dtype: DType, count: int) -> np.ndarray:
        """A host array: of the memory kind, or NumPy's when the kind is a device's."""
        if self.memory is None or self.on_device:
            array = numpy_alloc(dtype, count)
            if self.memory is None:
                self._arrays.append(weakref.ref(array))
            return array
        return self._allocate(dtype, count).array(dtype.numpy, count)

    def tensor(self, dtype: DType, count: int) -> Any:
        """A device tensor of ``count`` elements (device kinds)."""
        return self._allocate(dtype, count).tensor_view(dtype.numpy, count)

    def device_copies(self) -> Optional["DeviceCopies"]:
        """The device side of a point whose buffers live on the device, else None."""
        return DeviceCopies(self) if self.on_device else None

    def placement(self, comm) -> dict:
        """What the first buffer's pages really got (call after it was written, on every
        rank of ``comm``: rank 0's record gets it); of NumPy's arrays, each rank's part of its
        live ones on huge pages, in rank order (``huge_share_ranks``), where the kernel says:
        a single copy's cost follows the sender's pages (the cost model's ``alpha_page``)."""
        if self._held:
            return self._held[0].placement()
        arrays = [a for a in (ref() for ref in self._arrays) if a is not None]
        share = pagescan.huge_share((a.ctypes.data, a.nbytes) for a in arrays) if arrays else None
        shares = comm.gather_object(share, root=0)
        pages: dict[str, Any] = {"memory": "numpy"}
        if comm.rank == 0 and any(s is not None for s in shares):
            pages["huge_share_ranks"] = shares
        return pages

    def free(self) -> None:
        for buf in self._held:
            buf.free()
        self._held.clear()

    def __enter__(self) -> "PointBuffers":
        return self

    def __exit__(self, *exc) -> None:
        self.free()


class DeviceCopies:
    """Device tensors that mirror host arrays (``measure.calls.DeviceSide``)."""

    def __init__(self, bufs: PointBuffers) -> None:
        self._bufs = bufs

    def put(self, host: np.ndarray) -> Any:
        """A new device tensor holding a copy of ``host``."""
        out = self._bufs.tensor(dtype_of(host), host.size)
        copy_in(out, host)
        return out

    def load(self, device: Any, host: np.ndarray) -> None:
        copy_in(device, host)

    def fetch(self, device: Any, host: np.ndarray) -> np.ndarray:
        copy_out(device, host)
        return host
