"""GPU kinds through torch: ``pinned`` (page-locked host memory) and ``device`` (GPU memory).

Both need ``torch`` with CUDA and a visible GPU (``torch.cuda.is_available()``);
torch is imported only when one of these kinds is asked for.  ``pinned`` is
``torch.empty(nbytes, uint8, pin_memory=True)``, seen by NumPy through
``.numpy()`` (``Buffer.tensor`` holds the tensor); ``device`` is a uint8 CUDA
tensor on the current device, in ``Buffer.tensor`` (``Buffer.array`` refuses:
use ``Buffer.tensor_view``).  Freeing drops the tensor: torch's caching
allocators keep the memory for reuse rather than returning it to the driver.
"""
from __future__ import annotations

import importlib.util
from typing import Any

from ..errors import UnsupportedError
from ..lazy import torch_module as _torch
from .base import Buffer

_HOST_KINDS = "pageable, hugepage, numa:N, shared"


def gpu_of(local_rank: int, gpus: int) -> int:
    """The GPU local rank ``local_rank`` uses among ``gpus`` (round robin; pure)."""
    if gpus < 1:
        raise ValueError("no GPU to place a rank on")
    return local_rank % gpus


def cuda_available() -> tuple[bool, str]:
    """(True, "") where torch sees a CUDA GPU, else (False, why not): the one answer every
    GPU refusal gives (memory kinds, data paths, NCCL, device reductions, training)."""
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed"
    # torch is optional: imported only when a GPU is asked about
    import torch
    if not torch.cuda.is_available():
        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
        return False, f"torch.cuda.is_available() is False (torch {torch.__version__}, {built})"
    return True, ""


def cuda_torch(kind: str) -> Any:
    """The torch module, if it can use a GPU; else :class:`UnsupportedError` saying why."""
    ok, why = cuda_available()
    if not ok:
        raise UnsupportedError(f"memory kind {kind} needs a GPU: {why}",
                               f"run on a machine with a CUDA GPU and torch built for it, or use {_HOST_KINDS}")
    return _torch()


def use_gpu(local_rank: int) -> dict[str, Any]:
    """Make GPU ``local_rank % gpus`` this rank's current CUDA device (every later
    ``device`` buffer and NCCL call goes there); returns ``{"gpu", "gpus", "gpu_name",
    "gpu_uuid"}``: the uuid names the physical GPU, whatever this rank's
    ``CUDA_VISIBLE_DEVICES`` or its container's host name."""
    torch = cuda_torch("device")
    gpus = torch.cuda.device_count()
    index = gpu_of(local_rank, gpus)
    torch.cuda.set_device(index)
    props = torch.cuda.get_device_properties(index)
    return {"gpu": index, "gpus": gpus, "gpu_name": props.name, "gpu_uuid": str(props.uuid)}


def copy_in(tensor: Any, host: Any) -> None:
    """``host``'s bytes (a NumPy array) into ``tensor`` (same byte length), done on return."""
    torch = _torch()
    tensor.view(-1).view(torch.uint8).copy_(torch.from_numpy(host.reshape(-1).view("uint8")))


def copy_out(tensor: Any, host: Any) -> None:
    """``tensor``'s bytes into ``host`` (a writable NumPy array of the same byte length)."""
    torch = _torch()
    torch.from_numpy(host.reshape(-1).view("uint8")).copy_(tensor.view(-1).view(torch.uint8))


class GpuKind:
    """``pinned`` or ``device``: the same check, two allocations."""

    def __init__(self, name: str) -> None:
        self.name = name

    def check(self, arg: str | None, hbw_fallback: str | None) -> None:
        cuda_torch(self.name)

    def allocate(self, spec: str, arg: str | None, nbytes: int, hbw_fallback: str | None) -> Buffer:
        torch = cuda_torch(self.name)
        if self.name == "pinned":
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            raw = tensor.numpy()
            return Buffer("pinned", spec, nbytes, raw=raw, tensor=tensor, exclusive=False,
                          span=(tensor.data_ptr(), tensor.data_ptr() + nbytes) if nbytes else None,
                          info={"method": "cudaHostAlloc", "pinned": bool(tensor.is_pinned())})
        device = torch.device("cuda", torch.cuda.current_device())
        tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return Buffer("device", spec, nbytes, tensor=tensor,
                      info={"method": "cudaMalloc", "device": str(device),
                            "device_name": torch.cuda.get_device_name(device)})


PINNED = GpuKind("pinned")
DEVICE = GpuKind("device")
