"""The timing protocol (README, "Timing protocol"; as OSU and nccl-tests): a barrier before every
timed call, per-call times per rank, warm-up calls untimed, and iterations
chosen from a probe so that a point lasts about its budget.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import kernels
from . import stats

#: Calls that probe the time of one call before iterations are chosen: first this many,
#: then twice as many again while the probe has lasted under :data:`PROBE_SHARE` of the
#: point's budget, up to :data:`MAX_PROBE_CALLS` in all.  Its median then stands against a
#: few descheduled calls (of 2, one slow call made a 2 µs point run 5 iterations).
PROBE_CALLS = 2
PROBE_SHARE = 0.1
MAX_PROBE_CALLS = 62
#: The probe makes at least this many calls where that many of its fastest fit in its
#: share: one stall of a few ms among 2 calls of 2 µs made their median 2 ms (10 iterations
#: where 2000 were due); a point whose every call outlasts the share stops at 2.
MIN_PROBE_CALLS = 6
clock = time.perf_counter

#: ``timed(n, warm)``: ``warm`` untimed calls, then the times of ``n`` timed ones
#: (one row per call; with phases, the last column is the whole step).
Timed = Callable[[int, int], np.ndarray]


def _no_sync() -> None:
    return None


def timing_loop(comm: Any, run: Callable[[], Any], iterations: int) -> np.ndarray:
    """Per-call times (s) of ``run``, a barrier before every call so all start together.

    Each timed call ends with ``comm.sync()``: a stream synchronisation on GPU
    backends (OSU's ``-d cuda`` convention), nothing on host ones.
    """
    times = np.empty(iterations, np.float64)
    barrier = comm.barrier
    sync = getattr(comm, "sync", _no_sync)
    for i in range(iterations):
        barrier()
        t0 = clock()
        run()
        sync()
        times[i] = clock() - t0
    return times


def phase_loop(comm: Any, step: Callable[[], Sequence[float]], iterations: int,
               nphases: int) -> np.ndarray:
    """(iterations x nphases) phase durations of ``step``, a barrier before every step."""
    out = np.empty((iterations, nphases), np.float64)
    for i in range(iterations):
        comm.barrier()
        out[i] = step()
    return out


def calls(comm: Any, run: Callable[[], Any]) -> Timed:
    """``run`` under the protocol: warm-up calls, then timed calls."""
    def timed(n: int, warm: int) -> np.ndarray:
        timing_loop(comm, run, warm)
        return timing_loop(comm, run, n)
    return timed


def phases(comm: Any, step: Callable[[], Sequence[float]], nphases: int) -> Timed:
    """``step`` (returning its phase durations) under the protocol."""
    def timed(n: int, warm: int) -> np.ndarray:
        phase_loop(comm, step, warm, nphases)
        return phase_loop(comm, step, n, nphases)
    return timed


def calibrate(comm: Any, timed: Timed, budget_s: float, iterations: Optional[int] = None,
              warmup: Optional[int] = None) -> tuple[np.ndarray, int, int]:
    """Probe, choose iterations and warm-up, then time: ``(times, iterations, warmup)``.

    The probe's calls count as warm-up.  ``iterations`` (else enough for
    ``budget_s`` at the slowest rank's median probed time) and ``warmup`` (else a
    tenth of the iterations) are the user's when given; given iterations need no
    more probe than :data:`PROBE_CALLS` warm-up calls.
    """
    if iterations:
        timed(PROBE_CALLS, 0)
        made = PROBE_CALLS
    else:
        t_call, made = _probe(comm, timed, budget_s)
        iterations = stats.choose_iterations(t_call, budget_s)
    warmup = warmup if warmup is not None else stats.choose_warmup(iterations)
    return timed(iterations, max(0, warmup - made)), iterations, max(warmup, made)


def _probe(comm: Any, timed: Timed, budget_s: float) -> tuple[float, int]:
    """The slowest rank's median time of one call (of the whole step), and the calls made.

    Every rank makes the same calls: whether to probe on is decided on the time spent
    on the slowest rank."""
    found: list[np.ndarray] = []
    n = PROBE_CALLS
    while True:
        t = timed(n, 0)
        found.append(t if t.ndim == 1 else t[:, -1])
        made = sum(len(f) for f in found)
        spent, fastest = agree_max(comm, [float(sum(f.sum() for f in found)),
                                          float(min(f.min() for f in found))])
        share = PROBE_SHARE * budget_s
        if spent >= share and (made >= MIN_PROBE_CALLS or fastest * MIN_PROBE_CALLS >= share) \
                or made + 2 * n > MAX_PROBE_CALLS:
            break
        n *= 2
    return agree_max(comm, float(np.median(np.concatenate(found)))), made


def add_us(comm: Any, op: Any, dtype: Any, count: int, alloc: Callable, budget_s: float) -> float:
    """The ``add_us`` floor of a reduction of ``count`` elements on host buffers: one NumPy
    pass of ``op`` (``np.add`` for sum) on two buffers from ``alloc``, every rank at once."""
    return pass_us(comm, kernels.reducer(op, dtype, "numpy"), alloc(dtype, count),
                   alloc(dtype, count), budget_s)


def pass_us(comm: Any, one_pass: Callable, a: Any, b: Any, budget_s: float,
            slowest: bool = False) -> float:
    """Median microseconds of one ``one_pass(a, b, a)``, every rank at once; the fastest rank's
    (``slowest``: the median over passes of the slowest rank's time, as ``t_p50_us`` is
    taken: ranks sharing one GPU take turns on it, so the last one's copy ends when all
    k copies are done, 2·k·n bytes).

    A floor a reduction of these bytes is held to: one NumPy reduction pass
    (one read of two inputs, one write) on host arrays, one device-to-device
    copy (:func:`ddlcomm.kernels.device.copy_pass`) on device tensors.  Every
    rank times its own passes between barriers, as the ranks of a reduction
    work at once (and share the memory, the GPU's when they share one),
    probing one pass and then timing enough to fill ``budget_s`` (3 to 20).
    """
    a[...] = 1
    b[...] = 1                                  # pages faulted in before timing
    t0 = clock()
    one_pass(a, b, a)
    t_one = agree_max(comm, clock() - t0)
    times = timing_loop(comm, lambda: one_pass(a, b, a),
                        int(min(20, max(3, budget_s // max(t_one, 1e-9)))))
    if slowest:
        comm.allreduce(times, times, op="max")
        return float(np.median(times)) * 1e6
    buf = np.array([np.median(times)], np.float64)
    comm.allreduce(buf, buf, op="min")
    return float(buf[0]) * 1e6


def agree_max(comm: Any, value: "float | Sequence[float]") -> Any:
    """The maximum of ``value`` over ranks (every rank gets it); of each value of a
    sequence, in one all-reduce (a list)."""
    buf = np.array(value, np.float64).reshape(-1)
    comm.allreduce(buf, buf, op="max")
    return float(buf[0]) if np.ndim(value) == 0 else [float(v) for v in buf]
