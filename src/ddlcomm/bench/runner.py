"""The in-rank side of ``ddlcomm bench``: pre-flight, then measure every point.

Timing protocol (SPEC §2, as OSU and nccl-tests): an untimed check call whose
result is verified; warm-up calls; then per timed iteration ``barrier; t0;
collective; t1`` on every rank.  Rank 0 gathers every rank's per-call times,
summarises them (:mod:`ddlcomm.bench.stats`) and stores the point at once.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, Optional

import numpy as np

from ..collectives import get_collective
from ..dtypes import get_dtype, get_op
from ..errors import DdlcommError, RankFailure
from ..units import format_size
from . import stats
from .plan import BenchPlan
from .watchdog import Watchdog

#: "tty" or "plain": whether the owner's stderr is a terminal (rank 0's never is under a launcher).
PROGRESS_ENV = "DDLCOMM_PROGRESS"
#: Warm-up calls used to estimate the time of one call before choosing iterations.
PROBE_CALLS = 2


def _agree_max(comm, value: float) -> float:
    """The maximum of ``value`` over ranks (every rank gets it)."""
    buf = np.array([value], np.float64)
    comm.allreduce(buf, buf, op="max")
    return float(buf[0])


def _timed_loop(comm, run, iterations: int) -> np.ndarray:
    times = np.empty(iterations, np.float64)
    barrier = comm.barrier
    clock = time.perf_counter
    for i in range(iterations):
        barrier()
        t0 = clock()
        run()
        times[i] = clock() - t0
    return times


def measure_point(comm, plan: BenchPlan, collective: str, nbytes: int, form: str) -> Optional[dict]:
    """Check, warm up and time one point; rank 0 returns its record, others None."""
    coll = get_collective(collective)
    dtype = get_dtype(plan.dtype)
    op = get_op(plan.op) if coll.reduces else None
    count = coll.count_for(nbytes, dtype, comm.size)
    in_place = plan.in_place and coll.in_place_ok
    prepared = coll.prepare(comm, form, dtype, count, op, plan.root, in_place)

    check = "skipped"
    if plan.check:
        prepared.reset()
        comm.barrier()
        prepared.run()
        expected = coll.expected(dtype, count, comm.rank, comm.size, op, plan.root)
        ok = np.array([coll.verify(prepared.result(), expected, dtype)], np.int32)
        comm.allreduce(ok, ok, op="min")
        check = "passed" if ok[0] else "failed"

    # Probe: a few warm-up calls, whose slowest rank sets the per-call estimate.
    t_probe = _timed_loop(comm, prepared.run, PROBE_CALLS)
    t_call = _agree_max(comm, float(np.median(t_probe)))
    iterations = plan.iters or stats.choose_iterations(t_call, plan.budget_s)
    warmup = plan.warmup if plan.warmup is not None else stats.choose_warmup(iterations)
    _timed_loop(comm, prepared.run, max(0, warmup - PROBE_CALLS))
    times = _timed_loop(comm, prepared.run, iterations)

    gathered = comm.gather(times, root=0)
    if comm.rank != 0:
        return None
    summary = stats.summarize(gathered.reshape(comm.size, iterations))
    moved = count * dtype.itemsize
    algbw, busbw = stats.bandwidth(coll.algbw_bytes(moved, comm.size), summary["t_avg_us"],
                                   coll.busbw_factor(comm.size))
    return {
        "backend": comm.name, "library": comm.library, "library_version": comm.library_version,
        "collective": collective, "form": form, "algorithm": "library",
        "dtype": dtype.name, "op": op.name if op else None,
        "bytes": moved, "count": count, "ranks": comm.size, "root": plan.root,
        "in_place": in_place,
        "iterations": iterations, "warmup": max(warmup, PROBE_CALLS),
        **summary, "algbw_GBps": algbw, "busbw_GBps": busbw,
        "check": check, "error": None, "extra": {},
    }


def preflight(comm, plan: BenchPlan, watchdog: Watchdog) -> list:
    """Every rank answers within the limit and the job has the size asked for."""
    with watchdog.guard("pre-flight (every rank answering)", min(plan.timeout_s, 60.0)):
        who = comm.allgather_object((comm.rank, socket.gethostname(), os.getpid()))
    if plan.ranks is not None and comm.size != plan.ranks:
        raise RankFailure(f"the launcher started {comm.size} ranks but --ranks {plan.ranks} was asked",
                          "start as many ranks as --ranks says, or leave --ranks out")
    return who


def point_label(collective: str, form: str, nbytes: int) -> str:
    return f"{collective} ({form}, {format_size(nbytes)})"


def run_sweep(comm, plan: BenchPlan, watchdog: Watchdog, store: Any, run_id: Optional[int]) -> int:
    """Measure every point of ``plan``; rank 0 stores each one as it completes.

    Returns the number of points whose check failed (the same on every rank).
    """
    points = plan.points()
    progress = None
    if comm.rank == 0:
        from tqdm import tqdm
        # Into a log file, a redraw every few seconds is enough.
        plain = os.environ.get(PROGRESS_ENV, "plain" if not sys.stderr.isatty() else "tty") == "plain"
        progress = tqdm(total=len(points), unit="pt", file=sys.stderr, leave=True,
                        desc=f"{plan.backend} {comm.size} ranks", dynamic_ncols=not plain,
                        mininterval=5.0 if plain else 0.1, ncols=100 if plain else None)
    failed = 0
    try:
        for collective, nbytes, form in points:
            label = point_label(collective, form, nbytes)
            if progress is not None:
                progress.set_postfix_str(label, refresh=False)
            with watchdog.guard(label):
                record = measure_point(comm, plan, collective, nbytes, form)
            if record is not None:
                failed += record["check"] == "failed"
                store.add_point(run_id, record)
                progress.update(1)
    finally:
        if progress is not None:
            progress.close()
    flag = np.array([failed], np.int64)
    comm.broadcast(flag, 0)
    return int(flag[0])


def fail_message(rank: int, what: Optional[str], exc: BaseException) -> str:
    where = f" during {what}" if what else ""
    text = str(exc) if isinstance(exc, DdlcommError) else f"{type(exc).__name__}: {exc}"
    return f"rank {rank}{where}: {text}"
