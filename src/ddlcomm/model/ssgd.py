"""Shi and Chu's iteration model of synchronous data-parallel SGD (S-SGD).

One iteration on one worker is ``t_io + t_h2d + t_f + t_b + t_u`` (read a
batch, copy it to the device, forward, backward, update) and, with N > 1
workers, the aggregation of the gradients, ``t_c``:

- ``overlap="none"``:  t_iter = t_io + t_h2d + t_f + t_b + t_u + t_c
- ``overlap="io"`` (I/O prefetched by other threads): t_iter =
  max(t_io, t_h2d + t_f + t_b + t_u + t_c): reading overlaps the rest and only
  what exceeds it shows.
- ``overlap="wfbp"`` (wait-free back-propagation): the gradients of a layer
  (or of a fused bucket) are aggregated as soon as the backward pass has
  produced them, while the layers below are still computing; messages go one
  at a time.  With per-layer backward times b_l (scaled to sum to t_b) and
  messages c_k, a message starts at max(its gradients ready, the previous
  message done), and only
  what ends after the backward pass is *exposed*:
  t_iter = t_io + t_h2d + t_f + t_b + exposed + t_u, exposed = max(0, end of
  the last message - t_b), hidden = t_c - exposed.
- ``overlap="io+wfbp"``: both; t_iter = max(t_io, t_h2d + t_f + t_b + exposed + t_u).

Weak scaling (a fixed batch per worker): speed-up = N·t_iter(1) / t_iter(N),
where one worker aggregates nothing (t_c = 0); efficiency = speed-up / N.
With ``io_per_node`` one reader feeds every worker of a node, so reading
takes ``t_io × min(N, workers_per_node)`` (the single-worker time stays t_io).

The aggregation cost is either a given ``t_c`` (seconds per iteration,
spread over the layers in proportion to their bytes for WFBP) or
``comm(nbytes) -> seconds`` at that worker count, applied to each message:
the layers' gradients fused into buckets of at most ``fusion_bytes``
(``None`` or 0: one message per layer), e.g. ``functools.partial(
costs.allreduce_time, fit, "ring", N)``.

Reference: S. Shi, X. Chu, "Performance Modeling and Evaluation of
Distributed Deep Learning Frameworks on GPUs", DASC 2018 (arXiv:1711.05979).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from ..errors import UsageError
from ..workloads import models

#: Overlap modes of :func:`predict`.
OVERLAPS = ("none", "io", "wfbp", "io+wfbp")


@dataclass(frozen=True)
class Phases:
    """Seconds per iteration on one worker; ``layers`` = (backward seconds,
    gradient bytes) per layer in backward order (last layer first)."""

    t_io: float
    t_h2d: float
    t_f: float
    t_b: float
    t_u: float
    layers: tuple[tuple[float, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("t_io", "t_h2d", "t_f", "t_b", "t_u"):
            _check_seconds(getattr(self, name), name)
        for i, layer in enumerate(self.layers):
            if len(layer) != 2:
                raise UsageError(f"layer {i} must be (backward seconds, gradient bytes), got {layer!r}")
            _check_seconds(layer[0], f"layer {i}'s backward time")
            if isinstance(layer[1], bool) or not isinstance(layer[1], int) or layer[1] < 0:
                raise UsageError(f"layer {i}'s gradient bytes must be a whole number >= 0, "
                                 f"got {layer[1]!r}")

    @property
    def compute(self) -> float:
        """t_h2d + t_f + t_b + t_u: the work of one iteration besides reading."""
        return self.t_h2d + self.t_f + self.t_b + self.t_u

    @property
    def gradient_bytes(self) -> int:
        return sum(b for _, b in self.layers)


@dataclass(frozen=True)
class Prediction:
    """One worker count's iteration: seconds, and speed-up/efficiency against one worker."""

    t_iter: float
    t_comm: float
    exposed: float
    hidden: float
    speedup: float
    efficiency: float
    workers: int

    def to_dict(self) -> dict:
        return asdict(self)


def _check_seconds(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise UsageError(f"{what} must be a number of seconds >= 0, got {value!r}")


def model_layers(model: str, t_b: float, itemsize: int = 4) -> tuple[tuple[float, int], ...]:
    """(backward seconds, gradient bytes) per layer of a known model, in
    backward order, with ``t_b`` spread over the layers in proportion to their
    parameters (an approximation: measured per-layer times are better)."""
    layers = models.per_layer(model, itemsize)
    total = sum(b for _, b in layers) or 1
    return tuple((t_b * b / total, b) for _, b in layers)


def messages(phases: Phases, fusion_bytes: Optional[int]) -> list[tuple[float, int]]:
    """(ready time after the backward pass starts, bytes) of each message.

    Layers are fused in backward order into buckets of at most
    ``fusion_bytes`` (:func:`ddlcomm.workloads.models.fuse`); a bucket is ready
    when the last of its layers is.  The layers' backward times give the pass's
    shape and ``t_b`` its length: they are scaled to sum to ``t_b`` (per-layer
    times measured by hooks need not add up to the pass timed whole).
    """
    total = sum(dt for dt, _ in phases.layers)
    scale = phases.t_b / total if total > 0 else 1.0
    ready, t = [], 0.0
    for dt, _ in phases.layers:
        t += dt * scale
        ready.append(t)
    sizes = [b for _, b in phases.layers]
    buckets = models.fuse(sizes, fusion_bytes or 0)
    out, i = [], 0
    for size in buckets:
        acc = 0
        while True:                       # the layers this bucket holds, in order
            acc += sizes[i]
            i += 1
            if acc >= size:
                break
        if size:                          # layers without parameters send nothing
            out.append((ready[i - 1], size))
    return out


def _comm_times(phases: Phases, msgs: Sequence[tuple[float, int]], t_c: Optional[float],
                comm: Optional[Callable[[int], float]]) -> list[float]:
    if comm is not None:
        out = [float(comm(size)) for _, size in msgs]
        for v in out:
            _check_seconds(v, "comm(nbytes)")
        return out
    total = phases.gradient_bytes           # > 0 where there are messages
    return [t_c * size / total for _, size in msgs]


def predict(phases: Phases, workers: int, *, t_c: Optional[float] = None,
            comm: Optional[Callable[[int], float]] = None, overlap: str = "none",
            workers_per_node: int = 1, io_per_node: bool = False,
            fusion_bytes: Optional[int] = None) -> Prediction:
    """The iteration on ``workers`` workers (see the module doc for the model).

    Give the aggregation cost as ``t_c`` (seconds per iteration at this worker
    count) or ``comm`` (seconds per message of n bytes at this worker count),
    not both; with one worker neither is used.  WFBP needs ``phases.layers``.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a whole number >= 1, got {workers!r}")
    if isinstance(workers_per_node, bool) or not isinstance(workers_per_node, int) \
            or workers_per_node < 1:
        raise UsageError(f"workers per node must be a whole number >= 1, got {workers_per_node!r}")
    if overlap not in OVERLAPS:
        raise UsageError(f"unknown overlap {overlap!r}", f"choose from {', '.join(OVERLAPS)}")
    if (t_c is None) == (comm is None):
        raise UsageError("give the aggregation cost as t_c or comm, one of them",
                         "t_c: seconds per iteration; comm: seconds per message of n bytes")
    if t_c is not None:
        _check_seconds(t_c, "t_c")
    if fusion_bytes is not None and (isinstance(fusion_bytes, bool) or fusion_bytes < 0):
        raise UsageError(f"fusion threshold must be a number of bytes >= 0, got {fusion_bytes!r}")
    wfbp = "wfbp" in overlap
    if (wfbp or comm is not None) and not phases.layers:
        raise UsageError("per-layer backward times and gradient sizes are needed "
                         + ("for wfbp" if wfbp else "to price messages with comm"),
                         "give Phases(layers=...) (or --model / --layers on the command line)")
    base = _iteration(phases, 1, overlap, 0.0, workers_per_node, io_per_node)
    if workers == 1:
        return Prediction(base, 0.0, 0.0, 0.0, 1.0, 1.0, 1)
    msgs = messages(phases, fusion_bytes) if phases.layers else []
    times = _comm_times(phases, msgs, t_c, comm)
    # no layers: t_c whole; layers without bytes: nothing to send
    t_comm = sum(times) if phases.layers else float(t_c)
    exposed = t_comm
    if wfbp:
        end = 0.0
        for (ready, _), dt in zip(msgs, times):
            end = max(end, ready) + dt
        exposed = max(0.0, end - phases.t_b)
    t_iter = _iteration(phases, workers, overlap, exposed, workers_per_node, io_per_node)
    speedup = workers * base / t_iter if t_iter > 0 else float(workers)
    return Prediction(t_iter, t_comm, exposed, t_comm - exposed, speedup, speedup / workers,
                      workers)


def _iteration(phases: Phases, workers: int, overlap: str, exposed: float,
               workers_per_node: int, io_per_node: bool) -> float:
    t_io = phases.t_io * (min(workers, workers_per_node) if io_per_node else 1)
    rest = phases.compute + exposed
    return max(t_io, rest) if overlap.startswith("io") else t_io + rest


def sweep(phases: Phases, workers: Sequence[int], *,
          t_c: Optional[float] = None,
          comm_at: Optional[Callable[[int], Callable[[int], float]]] = None,
          **kwargs) -> list[Prediction]:
    """:func:`predict` at each worker count; ``comm_at(N)`` gives that count's ``comm``."""
    out = []
    for n in workers:
        comm = comm_at(n) if comm_at is not None else None
        out.append(predict(phases, n, t_c=None if comm is not None else t_c, comm=comm,
                           **kwargs))
    return out
