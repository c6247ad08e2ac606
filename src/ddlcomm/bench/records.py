"""Building the stored record of one measured point (the fields README documents)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import stats


def timing_loop(comm, run, iterations: int) -> np.ndarray:
    """Per-call times (s) of ``run``, a barrier before every call so all start together."""
    import time
    times = np.empty(iterations, np.float64)
    barrier = comm.barrier
    clock = time.perf_counter
    for i in range(iterations):
        barrier()
        t0 = clock()
        run()
        times[i] = clock() - t0
    return times


def reduce_pass_us(comm, reduce, a: np.ndarray, b: np.ndarray, budget_s: float) -> float:
    """Median microseconds of one ``reduce(a, b, a)`` pass, every rank at once; the fastest rank's.

    The floor any all-reduce of these bytes is held to (one read of two
    inputs, one write): every rank times its own passes between barriers, as
    the ranks of a reduction work at once, probing one pass and then timing
    enough to fill ``budget_s`` (3 to 20).
    """
    import time
    a[...] = 1
    b[...] = 1                                  # pages faulted in before timing
    t0 = time.perf_counter()
    reduce(a, b, a)
    t_one = agree_max(comm, time.perf_counter() - t0)
    times = timing_loop(comm, lambda: reduce(a, b, a), int(min(20, max(3, budget_s // max(t_one, 1e-9)))))
    buf = np.array([np.median(times)], np.float64)
    comm.allreduce(buf, buf, op="min")
    return float(buf[0]) * 1e6


def agree_max(comm, value: float) -> float:
    """The maximum of ``value`` over ranks (every rank gets it)."""
    buf = np.array([value], np.float64)
    comm.allreduce(buf, buf, op="max")
    return float(buf[0])


def agree_all(comm, ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank."""
    flag = np.array([1 if ok else 0], np.int32)
    comm.allreduce(flag, flag, op="min")
    return bool(flag[0])


def make_record(comm, *, collective: str, form: str, dtype: str, op: Optional[str],
                nbytes: int, count: int, root: int, in_place: bool, iterations: int,
                warmup: int, times: np.ndarray, algbw_bytes: int, busbw_factor: float,
                check: str, algorithm: str = "library", extra: Optional[dict] = None) -> dict:
    """The record of one point from its (ranks x iterations) matrix of times in seconds."""
    summary = stats.summarize(times)
    algbw, busbw = stats.bandwidth(algbw_bytes, summary["t_avg_us"], busbw_factor)
    return {
        "backend": comm.name, "library": comm.library, "library_version": comm.library_version,
        "collective": collective, "form": form, "algorithm": algorithm,
        "dtype": dtype, "op": op, "bytes": nbytes, "count": count, "ranks": comm.size,
        "root": root, "in_place": in_place, "iterations": iterations, "warmup": warmup,
        **summary, "algbw_GBps": algbw, "busbw_GBps": busbw,
        "check": check, "error": None, "extra": extra or {},
    }
