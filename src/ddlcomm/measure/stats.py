"""Statistics of one measured point (pure functions, no MPI).

Input is the matrix of per-call times, one row per rank and one column per
timed iteration, in seconds.  Following OSU and nccl-tests:

* ``t_min_us``/``t_avg_us``/``t_max_us``: min, mean and max over ranks of each
  rank's average per-call time;
* ``t_p50_us``/``t_p99_us``: median and 99th percentile over iterations of the
  iteration's time on its slowest rank (when the collective was done for all);
* ``algbw = bytes / t_avg`` and ``busbw = algbw * factor`` in GB/s (10**9 B/s);
* the relative error of a prediction, for the models and the training benchmark.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np


def summarize(times_s: np.ndarray) -> dict[str, float]:
    """Summarise a (ranks x iterations) matrix of per-call times in seconds, in µs."""
    times = np.atleast_2d(np.asarray(times_s, dtype=np.float64))
    if times.size == 0:
        raise ValueError("no timings to summarise")
    return summarize_us(times.mean(axis=1) * 1e6, times.max(axis=0) * 1e6)


def summarize_us(per_rank, slowest) -> dict[str, float]:
    """:func:`summarize`'s statistics from each rank's mean and each iteration's slowest
    rank's time, in µs (the C reference's records carry these)."""
    per_rank, slowest = np.asarray(per_rank, dtype=float), np.asarray(slowest, dtype=float)
    if per_rank.size == 0 or slowest.size == 0:
        raise ValueError("no timings to summarise")
    return {
        "t_min_us": float(per_rank.min()),
        "t_avg_us": float(per_rank.mean()),
        "t_max_us": float(per_rank.max()),
        "t_p50_us": float(np.percentile(slowest, 50)),
        "t_p99_us": float(np.percentile(slowest, 99)),
    }


def bandwidth(nbytes: int, t_us: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for ``nbytes`` moved in ``t_us`` microseconds."""
    if t_us <= 0 or nbytes <= 0:
        return 0.0, 0.0
    algbw = nbytes / (t_us * 1e-6) / 1e9
    return algbw, algbw * factor


def choose_iterations(t_call_s: float, budget_s: float, lo: int = 5, hi: int = 2000) -> int:
    """Iterations so that the timed loop of one point lasts about ``budget_s``.

    Small messages get many iterations (up to ``hi``), large ones few (down to ``lo``).
    """
    if not t_call_s > 0:                 # nothing measurable (0, or NaN): the most
        return hi
    return int(min(hi, max(lo, round(budget_s / t_call_s))))


def choose_warmup(iterations: int) -> int:
    """Untimed warm-up calls before the timed loop: a tenth of it, 2 to 200."""
    return int(min(200, max(2, iterations // 10)))


def relative_error(measured: float, predicted: Optional[float]) -> Optional[float]:
    """``(predicted - measured) / measured``; None when there is no finite prediction
    or nothing was measured."""
    if predicted is None or not measured or not math.isfinite(predicted) or not math.isfinite(measured):
        return None
    return (predicted - measured) / measured
