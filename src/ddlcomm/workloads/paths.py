"""Data paths: where a worker's gradients live and how they reach the collective.

``host`` (arrays in host memory, in the run's ``--memory`` kind) is the path
on a machine without a GPU.
The GPU paths of SPEC §2 (host-staged copies, CUDA-aware direct, NCCL via a
chief) plug in here as further entries; until then they are refused with the
reason, before any rank starts.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedError, UsageError


@dataclass(frozen=True)
class DataPath:
    name: str
    description: str
    needs_gpu: bool


def gpu_available() -> tuple[bool, str]:
    try:
        # torch is optional: without it there is no GPU path
        import torch
    except ImportError:
        return False, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False (no CUDA GPU on this machine)"
    return True, ""


PATHS: dict[str, DataPath] = {p.name: p for p in (
    DataPath("host", "gradients in host memory, collectives on host buffers", False),
    DataPath("host-staged", "copy device to host, collective on host buffers, copy back", True),
    DataPath("direct", "device buffers handed to a CUDA-aware MPI", True),
    DataPath("nccl-chief", "server to a chief worker over MPI, NCCL among the workers", True),
)}


def get_path(name: str) -> DataPath:
    """The data path ``name``, or an error saying why it cannot run here."""
    try:
        path = PATHS[name]
    except KeyError:
        raise UsageError(f"unknown data path {name!r}", f"choose from {', '.join(PATHS)}") from None
    if path.needs_gpu:
        ok, why = gpu_available()
        reason = why if not ok else "the GPU paths are not implemented yet (a later issue)"
        raise UnsupportedError(f"data path {name} ({path.description}) cannot run here: {reason}",
                               "use --path host")
    return path
