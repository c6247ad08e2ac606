"""Where a rank's workload data lives, and the few things a workload does to it.

:class:`HostSide` holds NumPy arrays (the run's ``--memory`` kind);
:class:`TorchSide` holds torch tensors on a device (``"cuda"``, or ``"cpu"``
standing in for a GPU in tests of the staging plumbing).  Workloads fill and
check their data through :meth:`load`/:meth:`read` (host copies) and apply
gradients with :meth:`subtract`/:meth:`apply_mean` where the data lives.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import numpy as np

from ..comm.buffers import tensor_dtype
from ..dtypes import DType, dtype_of
from ..lazy import torch_module as _torch
from ..measure.timing import agree_max, clock
from ..memory.gpu import copy_in, copy_out

#: Copies timed per direction, alone and at once (the median is kept).
COPY_REPS = 5


class Side(Protocol):
    def alloc(self, dtype: DType, count: int) -> Any: ...
    def load(self, buf: Any, values: np.ndarray) -> None: ...
    def read(self, buf: Any) -> np.ndarray: ...
    def subtract(self, x: Any, y: Any) -> None: ...
    def apply_mean(self, x: Any, table: Any, p: int, n: int, acc: Any, scale: float) -> None: ...
    def sync(self) -> None: ...


class HostSide:
    """Data in host arrays from ``alloc(dtype, count)`` (zeroed)."""

    def __init__(self, alloc: Callable[[DType, int], np.ndarray]) -> None:
        self.alloc = alloc

    def load(self, buf: np.ndarray, values: np.ndarray) -> None:
        buf[:] = values

    def read(self, buf: np.ndarray) -> np.ndarray:
        return buf

    def subtract(self, x: np.ndarray, y: np.ndarray) -> None:
        np.subtract(x, y, out=x)

    def apply_mean(self, x, table, p: int, n: int, acc, scale: float) -> None:
        """``x -= scale * (sum of table's rows 1..p-1)`` (the PS server's update)."""
        np.sum(table.reshape(p, n)[1:], axis=0, out=acc)
        np.multiply(acc, acc.dtype.type(scale), out=acc)
        np.subtract(x, acc, out=x)

    def sync(self) -> None:
        """Host arithmetic is done on return."""


class TorchSide:
    """Data in torch tensors on ``device`` ("cuda": this rank's current GPU)."""

    def __init__(self, device: str = "cuda") -> None:
        torch = _torch()
        self.torch = torch
        self.device = torch.device(device, torch.cuda.current_device()) if device == "cuda" \
            else torch.device(device)
        self.sync = torch.cuda.current_stream(self.device).synchronize \
            if self.device.type == "cuda" else _no_sync

    def alloc(self, dtype: DType, count: int) -> Any:
        return self.torch.zeros(count, dtype=getattr(self.torch, dtype.name), device=self.device)

    def load(self, buf: Any, values: np.ndarray) -> None:
        copy_in(buf, np.ascontiguousarray(values))
        self.sync()

    def read(self, buf: Any) -> np.ndarray:
        host = np.empty(buf.numel(), dtype=tensor_dtype(buf).numpy)
        copy_out(buf, host)
        return host

    def subtract(self, x: Any, y: Any) -> None:
        """Queued on the device's stream: done once :attr:`sync` returns."""
        x.sub_(y)

    def apply_mean(self, x, table, p: int, n: int, acc, scale: float) -> None:
        """As :meth:`HostSide.apply_mean`, queued on the device's stream."""
        self.torch.sum(table.view(p, n)[1:], dim=0, out=acc)
        acc.mul_(float(scale))
        x.sub_(acc)

    def to_host(self, tensor: Any, host: np.ndarray) -> None:
        """``tensor`` -> ``host`` (pinned where the device is a GPU), finished on return."""
        copy_out(tensor, host)
        self.sync()

    def to_device(self, host: np.ndarray, tensor: Any) -> None:
        copy_in(tensor, host)
        self.sync()

    def pinned(self, dtype: DType, count: int) -> np.ndarray:
        """A host array for staging: page-locked where the device is a GPU."""
        if self.device.type != "cuda":
            return np.zeros(count, dtype.numpy)
        raw = self.torch.zeros(count * dtype.itemsize, dtype=self.torch.uint8, pin_memory=True)
        return raw.numpy().view(dtype.numpy)       # the view holds the pinned tensor

    def copy_bars(self, comm, mine: Mapping[str, int]) -> dict[str, dict[str, float]]:
        """The bars each copy phase is held to, by phase (``mine``: the bytes this rank copies
        in each phase, ``<collective>.d2h`` or ``.h2d``; collective: every rank calls it):
        pinned copies of the phase's bytes (the most a rank copies in it) that way, by the
        ranks that copy in it (``copiers``): ``copy_alone_GBps`` each of them in turn while
        the others wait (the fastest's), and ``copy_at_once_GBps`` all of them at once, as
        the phase copies, sharing the link and the GPU where they share one (the slowest's).
        A phase is held to the first where one rank copies, to the second where several
        do.  Each (way, bytes, copiers) is measured once: a gather's root copies the whole
        table back, and its bar is a copy of that size, not of one message."""
        who = phase_copiers(comm.allgather_object(dict(mine)))
        bars: dict[tuple, dict[str, float]] = {}
        out = {}
        for phase, (nbytes, ranks) in sorted(who.items()):
            key = (phase.rpartition(".")[2], nbytes, ranks)
            if key not in bars:
                bars[key] = {**self._copy_bar(comm, *key), "copiers": len(ranks)}
            out[phase] = bars[key]
        return out

    def _copy_bar(self, comm, way: str, nbytes: int, ranks: frozenset) -> dict[str, float]:
        copies = comm.rank in ranks
        if copies:
            dev = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
            host = self.pinned(dtype_of(np.empty(0, np.uint8)), nbytes)
            copy = (lambda: self.to_host(dev, host)) if way == "d2h" else (lambda: self.to_device(host, dev))
            copy()
        alone = 0.0
        for turn in sorted(ranks):
            comm.barrier()
            if comm.rank == turn:
                alone = _median_GBps(copy, nbytes)
        comm.barrier()
        at_once = _median_GBps(copy, nbytes) if copies else float("inf")
        return {"copy_alone_GBps": agree_max(comm, alone),              # the fastest copier's
                "copy_at_once_GBps": -agree_max(comm, -at_once)}        # the slowest copier's


def phase_copiers(gathered: list[Mapping[str, int]]) -> dict[str, tuple[int, frozenset]]:
    """Each copy phase's bytes (the most a rank copies in it) and the ranks that copy in it,
    from every rank's bytes per phase (``gathered[rank]``; pure).  Left out: phases no rank
    copies in, and phases other than ``<collective>.d2h`` and ``.h2d``."""
    out = {}
    for phase in sorted({ph for mine in gathered for ph in mine}):
        if phase.rpartition(".")[2] not in ("d2h", "h2d"):
            continue
        sizes = {rank: mine.get(phase, 0) for rank, mine in enumerate(gathered)}
        ranks = frozenset(r for r, n in sizes.items() if n > 0)
        if ranks:
            out[phase] = (max(sizes.values()), ranks)
    return out


def _median_GBps(copy: Callable[[], None], nbytes: int) -> float:
    """GB/s of the median of :data:`COPY_REPS` timed ``copy()`` calls of ``nbytes``."""
    times = []
    for _ in range(COPY_REPS):
        t0 = clock()
        copy()
        times.append(clock() - t0)
    return nbytes / float(np.median(times)) / 1e9


def _no_sync() -> None:
    return None


def pinned_alloc(side: TorchSide) -> Callable[[Any], np.ndarray]:
    """``f(tensor)``: a staging host array of the tensor's dtype and length."""
    def alloc(tensor: Any) -> np.ndarray:
        return side.pinned(tensor_dtype(tensor), tensor.numel())
    return alloc
