"""SGD with momentum as ``torch.optim.SGD`` computes it by default, without torch.optim.

Any torch.optim optimizer imports ``torch._dynamo`` when it is built (its methods
are wrapped in ``torch._disable_dynamo``): 1.4-2.3 s of a training rank's CPU and
70 MiB of its memory on our 2-core machines (docs/benchmarks.md, "A training
rank's start"), for a compiler that ddlcomm never runs.  This is torch's
arithmetic in torch's order (weight decay, dampening and Nesterov off, as
``ddlcomm train`` uses it): on CUDA tensors its multi-tensor path (``foreach``,
a few kernels for all the parameters), elsewhere one tensor at a time, as
torch's default picks; tests hold the parameters to torch's, bit for bit.
ddlcomm's configurations and DDP's peer runs both step with it, so their
updates step alike; they clear the gradients apart: ddlcomm zeroes its gradient
buckets in place within its update (the gradients are views of the buckets the
all-reduce moves), DDP sets them to None (:meth:`SGD.zero_grad`, torch's default),
so its next backward pass allocates them instead.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional


class SGD:
    """``step()``: every parameter with a gradient moves by ``-lr`` times its momentum
    buffer (the gradient itself at its first step; after it ``momentum * buf + grad``);
    ``zero_grad()`` drops the gradients (None, as torch's default does).  ``foreach``: the
    multi-tensor kernels (True), one tensor at a time (False), or as torch's default picks
    (None: multi-tensor where every parameter is on a CUDA device)."""

    def __init__(self, params: Iterable, lr: float, momentum: float,
                 foreach: Optional[bool] = None) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.foreach = lr, momentum, foreach
        self._bufs: dict[int, Any] = {}         # id(parameter) -> its momentum buffer

    def step(self) -> None:
        import torch        # lazy: torch is an optional dependency (the torch extra)
        live = [p for p in self.params if p.grad is not None]
        foreach = self.foreach if self.foreach is not None else \
            bool(live) and all(p.is_cuda for p in live)
        with torch.no_grad():
            if foreach:
                for group in _by_device_and_dtype(live).values():
                    self._step_foreach(torch, group)
            else:
                for p in live:
                    p.add_(self._moved(p), alpha=-self.lr)

    def _moved(self, p):
        """``p``'s update direction: its momentum buffer, brought up to date (one tensor)."""
        buf = self._bufs.get(id(p))
        if buf is None:
            buf = self._bufs[id(p)] = p.grad.detach().clone()
        else:
            buf.mul_(self.momentum).add_(p.grad)
        return buf

    def _step_foreach(self, torch, params: list) -> None:
        """One device's and dtype's parameters, by torch's multi-tensor kernels."""
        grads = [p.grad for p in params]
        bufs = [self._bufs.get(id(p)) for p in params]
        if all(b is not None for b in bufs):
            torch._foreach_mul_(bufs, self.momentum)
            torch._foreach_add_(bufs, grads)
        else:
            bufs = [self._moved(p) for p in params]
        torch._foreach_add_(params, bufs, alpha=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def _by_device_and_dtype(params: list) -> dict[tuple, list]:
    """``params`` grouped as torch's multi-tensor step groups them, in their order."""
    groups: dict[tuple, list] = {}
    for p in params:
        groups.setdefault((p.device, p.dtype), []).append(p)
    return groups
