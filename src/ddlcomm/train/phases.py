"""The arithmetic of the training benchmark (pure: no torch, no MPI; unit-tested).

* Phases by name: their columns in a phase table, one rank's table by name.
* Tensor-fusion buckets over gradients in the order they become ready.
* Per-layer backward times from the moments each gradient became ready.
* Communication hidden by overlap, from the cost of the same buckets alone.
* A communication cost function (bytes -> seconds) from measured buckets.
* Throughput, weak-scaling speed-up and efficiency.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..errors import UsageError
from ..workloads.models import fuse

#: Phases timed in every iteration, in the order they are stored and stacked.
PHASES = ("io", "h2d", "forward", "backward", "update", "comm_exposed", "comm_hidden")
#: A worker's own work (no communication): what makes one worker the slowest.
WORK = ("io", "h2d", "forward", "backward", "update")


def phase_index(name: str) -> int:
    """The column of phase ``name`` in a phase table (ValueError for a name not in PHASES)."""
    try:
        return PHASES.index(name)
    except ValueError:
        raise ValueError(f"no phase {name!r}: phases are {', '.join(PHASES)}") from None


class PhaseTimes:
    """One rank's seconds per iteration and phase: an (iterations, phases) table by phase name.

    ``times["update"]`` is the column of the update phase (a view: assigning
    to it or to ``times["update"] = ...`` writes the table);
    ``times.record(i, io=..., forward=...)`` sets iteration ``i``'s phases;
    ``times.table`` is the whole array, columns in :data:`PHASES` order.
    Phases never recorded stay 0.
    """

    def __init__(self, iterations: int) -> None:
        self.table = np.zeros((iterations, len(PHASES)))

    def __getitem__(self, phase: str) -> np.ndarray:
        return self.table[:, phase_index(phase)]

    def __setitem__(self, phase: str, seconds) -> None:
        self.table[:, phase_index(phase)] = seconds

    def record(self, iteration: int, **seconds: float) -> None:
        for phase, s in seconds.items():
            self.table[iteration, phase_index(phase)] = s


def buckets(sizes: Sequence[int], fusion_bytes: int) -> list[list[int]]:
    """Indices of ``sizes`` (bytes, in ready order) grouped into fusion buckets.

    The same rule as :func:`ddlcomm.workloads.models.fuse` (consecutive
    gradients until the next would exceed ``fusion_bytes``; a larger one goes
    alone; 0: one bucket per gradient), returned as index lists.
    """
    out, i = [], 0
    for total in fuse(list(sizes), fusion_bytes):
        group, acc = [], 0
        while i < len(sizes) and (not group or acc + sizes[i] <= total):
            acc += sizes[i]
            group.append(i)
            i += 1
        out.append(group)
    return out


def layer_times(ready: Sequence[float], start: float, end: float) -> list[float]:
    """Backward seconds per gradient: the gap before each became ready.

    ``ready`` are the moments (seconds, ready order) each gradient became
    ready, ``start``/``end`` those of the backward pass.  The first gradient
    takes the time from ``start``; the last takes the tail up to ``end``, so
    the times add up to ``end - start``.
    """
    if not ready:
        return []
    times = np.diff(np.concatenate([[start], np.asarray(ready, np.float64)]))
    times = np.maximum(times, 0.0)
    times[-1] += max(0.0, end - ready[-1])
    return times.tolist()


def hidden(t_comm_alone: float, exposed: float, window: float = math.inf) -> float:
    """Communication hidden behind the backward pass: what the buckets cost alone
    minus what still showed after backward, never below 0 nor more than ``window``, the
    part of backward after the first all-reduce started (one bucket, started by the last
    gradient, hides next to nothing, whatever the two measurements say)."""
    return max(0.0, min(t_comm_alone - exposed, window))


def comm_function(table: Sequence[tuple[int, float]]) -> Callable[[int], float]:
    """Seconds to aggregate a message of n bytes, from measured (bytes, seconds) pairs.

    A size that was measured returns its measurement; others the least-squares
    line ``alpha + beta * n`` through the measurements (alpha, beta >= 0; with
    one size measured, the line through it and the origin).
    """
    if not table:
        raise UsageError("no communication was measured to build the cost function from")
    exact: dict[int, list[float]] = {}
    for n, t in table:
        exact.setdefault(int(n), []).append(float(t))
    exact_t = {n: float(np.median(ts)) for n, ts in exact.items()}
    sizes = np.array(sorted(exact_t), np.float64)
    times = np.array([exact_t[int(n)] for n in sizes])
    alpha, beta = 0.0, (times[-1] / sizes[-1] if sizes[-1] > 0 else 0.0)
    if len(sizes) >= 2 and np.ptp(sizes) > 0:
        beta, alpha = np.polyfit(sizes, times, 1)
        if alpha < 0 or beta < 0:
            alpha = max(alpha, 0.0)
            beta = max(0.0, float(np.dot(sizes, times - alpha) / np.dot(sizes, sizes)))
    alpha, beta = float(alpha), float(beta)

    def cost(nbytes: int) -> float:
        got = exact_t.get(int(nbytes))
        return got if got is not None else alpha + beta * nbytes
    cost.alpha, cost.beta = alpha, beta            # type: ignore[attr-defined]
    return cost


def images_per_s(workers: int, batch: int, t_iter_s: float) -> float:
    """Images a second of the whole job: every worker's batch per iteration."""
    return workers * batch / t_iter_s if t_iter_s > 0 else math.nan


def speedup(workers: int, t_iter_1: float, t_iter_n: float) -> float:
    """Weak-scaling speed-up (fixed batch per worker): ``N * t_iter(1) / t_iter(N)``."""
    return workers * t_iter_1 / t_iter_n if t_iter_n > 0 else math.nan


def efficiency(workers: int, t_iter_1: float, t_iter_n: float) -> float:
    """Speed-up over ideal linear scaling: ``t_iter(1) / t_iter(N)``."""
    return speedup(workers, t_iter_1, t_iter_n) / workers if workers else math.nan


def mean_phases(table: np.ndarray) -> dict[str, float]:
    """Mean seconds per phase over ranks and iterations of a (ranks, iters, phases) table."""
    if table.ndim != 3 or table.shape[2] != len(PHASES):
        raise ValueError(f"phase table must be (ranks, iterations, {len(PHASES)})")
    means = table.mean(axis=(0, 1))
    return {name: float(v) for name, v in zip(PHASES, means)}


def critical_phases(table: np.ndarray) -> dict[str, float]:
    """Mean seconds per phase along the critical path of a (workers, iters, phases) table.

    Synchronous training moves at the pace of its slowest worker: the phases of
    the worker whose own work (io, h2d, forward, backward, update) took longest
    on average, averaged over iterations.  The others' exposed communication
    includes waiting for that worker, which is skew, not communication.  One
    worker's phases add up to its own iterations, so to the measured iteration
    time; taking the slowest worker of each iteration apart (as before) paired
    one worker's long iteration with another's short next one wherever their
    iterations did not start together (oversubscribed ranks, DDP's waits inside
    backward), and the phases added up to 7-14% more than the iteration.
    """
    if table.ndim != 3 or table.shape[2] != len(PHASES):
        raise ValueError(f"phase table must be (workers, iterations, {len(PHASES)})")
    work = table[:, :, [phase_index(p) for p in WORK]].sum(axis=2)    # (workers, iterations)
    slowest = int(work.mean(axis=1).argmax())
    return {name: float(v) for name, v in zip(PHASES, table[slowest].mean(axis=0))}


def scale_to(times: Sequence[float], total: float) -> list[float]:
    """``times`` scaled so they add up to ``total`` (unchanged when they add up to 0)."""
    s = float(sum(times))
    return [float(t) * total / s for t in times] if s > 0 else [float(t) for t in times]
