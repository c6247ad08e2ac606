"""What a backend is handed for a training buffer that lives in a torch tensor.

The buckets (parameters, gradients, a server's gradient table) are flat
tensors on the training device; a *wire* is what a collective is handed for
one of them, and the copies around the call:

* ``view``: a CPU tensor, handed as a NumPy view of the same memory (no copy);
* ``device``: a CUDA tensor handed as it is, to a backend that takes device
  memory (nccl; gloo, which copies through host memory itself; an MPI that
  says at run time that it is CUDA-aware);
* ``staged``: a CUDA tensor and a page-locked host copy, for a backend that
  moves host memory only (the pip MPIs are not CUDA-aware): the tensor is
  copied to the host before the call (:meth:`push`) and back after it
  (:meth:`pull`), so no GPU pointer ever reaches that library.

:func:`wire_for` picks the first kind that applies to a device and a
backend's memories.  Any torch device works: the CPU stands in for a GPU in
the tests of the staged copies.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import UnsupportedError


class ViewWire:
    """A CPU tensor, handed as a NumPy view of its memory."""
    kind = "view"
    copies = False

    @staticmethod
    def applies(device_type: str, memories: Sequence[str]) -> bool:
        return device_type == "cpu" and "host" in memories

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.buf = tensor.numpy()

    def push(self) -> None:
        """Before a call that reads the buffer: nothing to copy."""

    def pull(self) -> None:
        """After a call that wrote the buffer: nothing to copy."""

    def scratch(self) -> "ViewWire":
        """A wire of the same kind over a copy of the tensor (timing alone)."""
        return type(self)(self.tensor.clone())


class DeviceWire(ViewWire):
    """A device tensor, handed as it is."""
    kind = "device"

    @staticmethod
    def applies(device_type: str, memories: Sequence[str]) -> bool:
        return device_type != "cpu" and "device" in memories

    def __init__(self, tensor: Any) -> None:
        self.tensor = self.buf = tensor


class StagedWire(ViewWire):
    """A device tensor and its host copy (page-locked on a GPU): copied around each call."""
    kind = "staged"
    copies = True

    @staticmethod
    def applies(device_type: str, memories: Sequence[str]) -> bool:
        return device_type != "cpu" and "host" in memories

    def __init__(self, tensor: Any) -> None:
        # torch is optional: a tensor exists only where torch does
        import torch
        self.tensor = tensor
        host = torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=tensor.is_cuda)
        self._host = host                     # the tensor owning the pinned pages
        self.buf: np.ndarray = host.numpy()

    def push(self) -> None:
        """The tensor into the host copy, finished on return (the copy to pageable or pinned
        memory without ``non_blocking`` waits for the device)."""
        self._host.copy_(self.tensor.view(-1))

    def pull(self) -> None:
        """The host copy into the tensor (queued in stream order before any later kernel)."""
        self.tensor.view(-1).copy_(self._host)


#: In the order they are tried.
WIRES = (ViewWire, DeviceWire, StagedWire)


def wire_for(device_type: str, memories: Sequence[str], backend: str = "?") -> type:
    """The wire kind for tensors on ``device_type`` handed to a backend taking ``memories``."""
    for wire in WIRES:
        if wire.applies(device_type, memories):
            return wire
    raise UnsupportedError(f"backend {backend} takes {' and '.join(memories)} memory only: it "
                           f"cannot be handed training buffers on the {device_type.upper()}",
                           "use --device cuda" if device_type == "cpu" else "use --device cpu")


def wired(call: Callable[[], object], push: Sequence = (), pull: Sequence = ()) -> Callable[[], None]:
    """``call`` with the ``push`` wires copied out before it and the ``pull`` ones back after
    it; ``call`` itself where no wire copies."""
    push = [w for w in push if w.copies]
    pull = [w for w in pull if w.copies]
    if not push and not pull:
        return call

    def staged() -> None:
        for w in push:
            w.push()
        call()
        for w in pull:
            w.pull()
    return staged


class WiredRequest:
    """A non-blocking all-reduce of a wire in flight: the result pulled back once, when done."""

    __slots__ = ("req", "wire", "pulled")

    def __init__(self, req: Any, wire: ViewWire) -> None:
        self.req, self.wire, self.pulled = req, wire, False

    def wait(self) -> None:
        self.req.wait()
        self._pull()

    def test(self) -> bool:
        done = self.req.test()
        if done:
            self._pull()
        return done

    def _pull(self) -> None:
        if not self.pulled:
            self.pulled = True
            self.wire.pull()


def iallreduce(comm: Any, wire: ViewWire, op: str = "avg") -> Any:
    """Start ``comm``'s non-blocking all-reduce of ``wire`` in place (pushed first)."""
    wire.push()
    req = comm.iallreduce(wire.buf, wire.buf, op=op)
    return WiredRequest(req, wire) if wire.copies else req
