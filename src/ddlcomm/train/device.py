"""Where a rank trains (``--device``): the CPU, or its GPU, looked up by name.

A device says what it needs of the machine (:meth:`check`, before any rank
starts) and, opened in a rank (:meth:`open`), gives a :class:`Placed`: where
tensors go (``target``), how to wait for the work queued there (``sync``: on
a GPU a CUDA synchronisation, called at every phase boundary so that a phase
is timed as the work it queued, not as its queueing), how to stamp moments
inside backward (CUDA events on a GPU, read after the sync) and the facts
stored with every point (``device``, ``sync``, ``gpu``, ``gpu_name``).

``cuda`` makes GPU ``local_rank % gpus`` the rank's device through
:func:`ddlcomm.memory.gpu.use_gpu`, the choice the nccl backend makes.
:func:`placed` builds a :class:`Placed` on any torch device, so the plumbing
can be tested with ``torch.device("cpu")`` standing in for a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import UsageError
from ..measure.timing import clock
from ..memory.gpu import cuda_available, use_gpu


def _no_sync() -> None:
    return None


@dataclass(frozen=True)
class Placed:
    """A training device opened in a rank."""
    name: str                                   # "cpu" or "cuda"
    target: Any                                 # what ``tensor.to()`` is given
    sync: Callable[[], None] = _no_sync         # wait for the work queued on the device
    stamp: Callable[[], Any] = clock            # a moment, from any thread
    facts: dict = field(default_factory=dict)   # stored with every point
    #: GPU index of this rank (-1: none), gathered over ranks into the records
    gpu: int = -1

    @property
    def on_gpu(self) -> bool:
        return self.name == "cuda"

    def seconds(self, stamps: Sequence[Any], start: Any, t_start: float) -> list[float]:
        """``stamps`` (from :attr:`stamp`, after :attr:`sync`) as clock seconds, given that
        ``start`` was stamped at clock time ``t_start``."""
        if not self.on_gpu:
            return list(stamps)
        return [t_start + start.elapsed_time(s) / 1e3 for s in stamps]


#: The CPU, as the loop sees it without torch (``x.to("cpu")``).
HOST = Placed("cpu", "cpu", facts={"device": "cpu", "sync": "none"})


def placed(torch_device: Any, facts: dict | None = None) -> Placed:
    """A :class:`Placed` on ``torch_device``: synchronised and stamped with CUDA events where
    it is a GPU, by the clock elsewhere (the CPU standing in for a GPU in tests)."""
    if torch_device.type != "cuda":
        return Placed("cpu", torch_device, facts=dict(facts or HOST.facts))
    # torch is optional: imported only to train on a GPU
    import torch

    def stamp():
        event = torch.cuda.Event(enable_timing=True)
        event.record()                   # on the calling thread's current stream
        return event
    return Placed("cuda", torch_device, lambda: torch.cuda.synchronize(torch_device), stamp,
                  {"device": "cuda", "sync": "cuda", **(facts or {})},
                  torch_device.index if torch_device.index is not None else -1)


class CpuDevice:
    """Train on the CPU (the default where the backend takes host memory)."""
    name = "cpu"

    def check(self) -> None:
        return None

    def open(self, local_rank: int) -> Placed:
        # torch is optional: imported only when a rank trains
        import torch
        return placed(torch.device("cpu"))


class CudaDevice:
    """Train on GPU ``local_rank % gpus`` (the default where the backend takes device memory only)."""
    name = "cuda"

    def check(self) -> None:
        """Refuse (UsageError, one line) where torch sees no CUDA GPU."""
        ok, why = cuda_available()
        if not ok:
            raise UsageError(f"--device cuda needs a CUDA GPU: {why}",
                             "run on a machine with an NVIDIA GPU, or use --device cpu "
                             "with --backend mpi or gloo")

    def open(self, local_rank: int) -> Placed:
        # torch is optional: imported only when a rank trains on a GPU
        import torch
        place = use_gpu(local_rank)
        return placed(torch.device("cuda", place["gpu"]),
                      {"gpu_name": place["gpu_name"], "gpus": place["gpus"]})


DEVICES = {d.name: d for d in (CpuDevice(), CudaDevice())}


def get_device(name: str):
    """The training device ``name`` (UsageError naming the choices)."""
    try:
        return DEVICES[name]
    except (KeyError, TypeError):
        raise UsageError(f"unknown --device {name!r}", f"choose from {', '.join(DEVICES)}") from None
