"""Reductions on device buffers, and the buffer-kind cache.

An algorithm that may be handed host or device buffers must know which it
has before it reduces: host buffers go to the SIMD C kernel, device buffers
(torch CUDA tensors, anything with ``__cuda_array_interface__``) to a GPU
kernel, here PyTorch's elementwise CUDA kernels (``torch.add(a, b,
out=out)`` and friends, launched on the current stream and synchronised, so
the result is there when the call returns).  Looking the kind up costs a
pointer query per buffer per call (CUDA-aware MPIs pay
``cudaPointerGetAttributes`` on every call); :class:`KindCache` looks each
buffer up once, keyed by its address and length, as awan2019's "buffer-kind
cache" does.

Without a CUDA device everything here still works for host buffers; the
device path raises :class:`~ddlcomm.errors.UnsupportedError` with the reason.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import UnsupportedError
from . import reducer

HOST, DEVICE = "host", "device"

#: torch's elementwise kernel per op (``avg`` is ``sum`` then the caller's division).
_TORCH_OPS = {"sum": "add", "prod": "mul", "min": "minimum", "max": "maximum"}


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


def kind_of(buf) -> str:
    """``"device"`` for CUDA memory, ``"host"`` otherwise (a fresh look-up every call)."""
    if isinstance(buf, np.ndarray):
        return HOST
    if hasattr(buf, "is_cuda"):
        return DEVICE if buf.is_cuda else HOST
    return DEVICE if hasattr(buf, "__cuda_array_interface__") else HOST


class KindCache:
    """``kind_of`` remembered per (address, bytes); counts its hits and misses."""

    def __init__(self) -> None:
        self._kinds: dict[tuple[int, int], str] = {}
        self.hits = self.misses = 0

    def __call__(self, buf) -> str:
        key = address(buf)
        kind = self._kinds.get(key)
        if kind is None:
            self.misses += 1
            kind = self._kinds[key] = kind_of(buf)
        else:
            self.hits += 1
        return kind

    def forget(self, buf) -> None:
        """Drop ``buf``'s entry (call before its memory is freed and reused)."""
        self._kinds.pop(address(buf), None)


def cuda_available() -> tuple[bool, str]:
    """(True, device name) with a usable CUDA device, else (False, why not)."""
    try:
        # torch is optional: without it there is no GPU to use
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    return True, torch.cuda.get_device_name()


def device_reducer(op: str) -> Callable:
    """``f(a, b, out)`` on CUDA tensors: ``out = a (op) b`` by a GPU kernel, synchronised."""
    ok, why = cuda_available()
    if not ok:
        raise UnsupportedError(f"device reduction needs a GPU: {why}")
    # torch is optional: imported only when a device reducer is asked for
    import torch
    fn = getattr(torch, _TORCH_OPS[op])

    def reduce(a, b, out) -> None:
        fn(torch.as_tensor(a), torch.as_tensor(b), out=torch.as_tensor(out))
        torch.cuda.current_stream().synchronize()
    reduce.__qualname__ = f"cuda_{_TORCH_OPS[op]}"
    return reduce


def dispatching_reducer(op: str, dtype, cache: "KindCache | None" = None) -> Callable:
    """``f(a, b, out)`` that reduces host buffers with the C kernel and device buffers on the GPU.

    ``cache`` (a :class:`KindCache`) looks each buffer's kind up once; None
    looks it up on every call.
    """
    host = reducer(op, dtype)
    lookup = cache if cache is not None else kind_of
    device: list[Callable] = []

    def reduce(a, b, out) -> None:
        if lookup(out) == HOST:
            host(a, b, out)
            return
        if not device:
            device.append(device_reducer(op))
        device[0](a, b, out)
    return reduce
