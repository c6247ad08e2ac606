"""Benchmark buffers in the memory kind a run asks for, and what their pages got.

Without ``--memory`` buffers come from NumPy's own allocator (recorded as
``numpy``: it asks the kernel for transparent huge pages on large arrays).
With it, every send and receive buffer of a point comes from
:mod:`ddlcomm.memory`, is read back after the point (huge pages, NUMA node)
and freed when the point is done.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import memory
from ..collectives import numpy_alloc
from ..dtypes import DType


class PointBuffers:
    """The allocator of one point's buffers; a context manager that frees them."""

    def __init__(self, memory: Optional[str], hbw_fallback: Optional[str] = None) -> None:
        self.memory = memory
        self.hbw_fallback = hbw_fallback
        self._held: list = []

    def alloc(self, dtype: DType, count: int) -> np.ndarray:
        if self.memory is None:
            return numpy_alloc(dtype, count)
        buf = memory.allocate(self.memory, max(1, count * dtype.itemsize), self.hbw_fallback)
        self._held.append(buf)
        return buf.array(dtype.numpy, count)

    def placement(self) -> dict:
        """What the first buffer's pages really got (call after it was written)."""
        if not self._held:
            return {"memory": "numpy"}
        return self._held[0].placement()

    def free(self) -> None:
        for buf in self._held:
            buf.free()
        self._held.clear()

    def __enter__(self) -> "PointBuffers":
        return self

    def __exit__(self, *exc) -> None:
        self.free()
