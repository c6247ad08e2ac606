"""The timed training loop, written once for ddlcomm's configurations and for DDP.

Per iteration, on every rank that computes: io (the next batch), h2d (moving
it to the device: on the CPU nothing moves, timed all the same), forward
(with the loss), backward, then the communication still exposed after
backward (where it is timed apart), then update.  Each phase ends with the
device's sync (on a GPU a CUDA synchronisation; nothing on the CPU), so a
phase is timed as the work it queued.  What differs between
configurations is a :class:`Steps` object: what forward runs on, what is
started before backward, the communication after it, the update.  The first
``warmup`` iterations are not timed into the wall time; a barrier starts the
loop and the timed part, and ranks do not meet between iterations
(synchronous training needs no barrier).  The wall time of the timed part is
the longest over ranks.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from ..measure.timing import agree_max, clock
from .device import HOST, Placed
from .phases import PhaseTimes


def progress(rank: int, text: str) -> None:
    """A progress line on rank 0's stderr."""
    if rank == 0:
        print(text, file=sys.stderr, flush=True)


class Steps:
    """What one configuration does inside the shared iteration; the defaults do nothing.

    ``computes``: False for a rank that reads no batch and runs neither forward
    nor backward (a parameter server): its io, h2d, forward and backward are 0.
    ``comm_after_backward``: False where communication runs inside backward
    (DDP): :meth:`finish` is then not called and no exposed communication is
    timed.
    """

    computes = True
    comm_after_backward = True

    def forward(self, x, y):
        """The loss of batch ``(x, y)`` (a tensor that has ``backward``)."""
        raise NotImplementedError

    def begin(self) -> None:
        """Just before backward (inside its time), also on a rank that does not compute."""

    def backward_done(self, iteration: int, start: float, end: float) -> None:
        """After backward ran from ``start`` to ``end`` (clock seconds), before communication."""

    def finish(self) -> None:
        """The communication still to do after backward."""

    def update(self) -> None:
        """The optimizer step (and zeroing of gradients)."""

    def adjust(self, seconds: dict[str, float]) -> None:
        """The last say over one iteration's phase seconds (by name) before they are stored."""


@dataclass
class Timings:
    """One rank's timed loop: phase seconds, seconds per iteration and loss (NaN where not
    computed) for every iteration, warm-up included; the wall time of the timed part (max over
    ranks)."""
    phases: PhaseTimes
    t_iter: np.ndarray
    losses: np.ndarray
    wall_s: float


def timed_iteration(steps: Steps, data, iteration: int,
                    place: Placed = HOST) -> tuple[dict[str, float], float, float]:
    """One iteration: its phase seconds by name, its seconds and its loss (NaN if none)."""
    sync = place.sync
    t0 = clock()
    loss_value = math.nan
    if steps.computes:
        x, y = data.next()
        t1 = clock()
        x, y = x.to(place.target, non_blocking=True), y.to(place.target, non_blocking=True)
        sync()
        t2 = clock()
        loss = steps.forward(x, y)
        loss_value = loss.item()
        sync()
        t3 = clock()
        steps.begin()
        loss.backward()
        sync()
        t4 = clock()
        steps.backward_done(iteration, t3, t4)
    else:
        t1 = t2 = t3 = t4 = t0
        steps.begin()
    t5 = t4
    if steps.comm_after_backward:
        steps.finish()
        sync()
        t5 = clock()
    steps.update()
    sync()
    t6 = clock()
    seconds = {"io": t1 - t0, "h2d": t2 - t1, "forward": t3 - t2, "backward": t4 - t3,
               "update": t6 - t5}
    if steps.comm_after_backward:
        seconds["comm_exposed"] = t5 - t4
    steps.adjust(seconds)
    return seconds, t6 - t0, loss_value


def timed_loop(comm, steps: Steps, data, warmup: int, iters: int, place: Placed = HOST) -> Timings:
    """``warmup`` untimed and ``iters`` timed iterations on ``place``, a progress line every fifth."""
    total = warmup + iters
    timings = Timings(PhaseTimes(total), np.zeros(total), np.full(total, np.nan), 0.0)
    every = max(1, total // 5)
    comm.barrier()
    t_start = clock()
    for i in range(total):
        if i == warmup:
            comm.barrier()
            t_start = clock()
        seconds, timings.t_iter[i], timings.losses[i] = timed_iteration(steps, data, i, place)
        timings.phases.record(i, **seconds)
        if (i + 1) % every == 0 or i + 1 == total:
            progress(comm.rank, f"  iter {i + 1}/{total}  {timings.t_iter[i]:.3f} s"
                                f"{f'  loss {timings.losses[i]:.4f} (this rank)' if steps.computes else ''}")
    timings.wall_s = agree_max(comm, clock() - t_start)
    return timings
