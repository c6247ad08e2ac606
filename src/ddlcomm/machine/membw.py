"""How the node's memory bandwidth is shared among copies that run at once.

On a many-core node the ranks of a ring or a shared-memory all-reduce copy at
the same time, and past a few cores they no longer each copy at the speed of
one alone: they share the memory controllers.  :func:`copy_bandwidth` measures
it.  k worker processes, each bound to its own CPU of this process's affinity,
copy a private buffer (``np.copyto``, larger than the last-level cache) at
once, for k = 1, 2, 3, 4, 6, 8, 12, 16, ... up to the CPUs; the answer is the
bytes copied per second by all k together (median of the rounds).  ``ddlcomm
info --memory-bandwidth`` reports it and the cost model prices concurrent copies
with it (:func:`ddlcomm.model.node.contention`).

The workers are plain interpreters that import only NumPy (nothing of MPI or
CUDA), started once and driven through their stdin; their clocks
(``time.perf_counter``, CLOCK_MONOTONIC) are one system-wide clock.
"""
from __future__ import annotations

import select
import subprocess
import sys
import time
from statistics import median
from typing import Any, Optional, Sequence

from ..memory import vm
from .cpus import affinity, last_level_cache

#: Each worker: bind, fill its buffers, say ready; then per "go" line copy ``reps``
#: times and answer the first and last clock readings.
WORKER = r"""
import os, sys, time
import numpy as np
cpu, nbytes, reps = (int(a) for a in sys.argv[1:4])
os.sched_setaffinity(0, {cpu})
src = np.ones(nbytes // 8, np.float64)
dst = np.empty_like(src)
np.copyto(dst, src)
print("ready", flush=True)
for _ in sys.stdin:
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, src)
    print(t0, time.perf_counter(), flush=True)
"""

#: The smallest buffer each worker copies (bytes); it is at least twice the last-level cache.
MIN_BYTES = 64 << 20
#: The most of the available memory the workers' buffers may take together.
MEMORY_SHARE = 0.25
#: Seconds one worker may take to start or to answer a round.
WORKER_TIMEOUT_S = 60.0


def copier_counts(cpus: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... (each power of two and 1.5 times it) up to
    ``cpus``, and ``cpus`` itself (pure)."""
    counts = {1, cpus}
    k = 2
    while k <= cpus:
        counts.update(c for c in (k, 3 * k // 2) if c <= cpus)
        k *= 2
    return sorted(c for c in counts if c >= 1)


def buffer_bytes(cpus: int, cache: Optional[int], available: Optional[int]) -> int:
    """Each worker's buffer: at least :data:`MIN_BYTES` and twice the last-level cache,
    at most what keeps ``cpus`` workers' source and destination within
    :data:`MEMORY_SHARE` of the available memory (pure); a multiple of 4 KiB."""
    want = max(MIN_BYTES, 2 * (cache or 0))
    if available:
        want = min(want, int(available * MEMORY_SHARE / (2 * cpus)))
    return max(4096, want // 4096 * 4096)


def aggregate(readings: Sequence[tuple[float, float]], nbytes: int, reps: int) -> float:
    """Bytes per second copied by all workers of one round together: every worker's
    ``reps`` copies of ``nbytes`` over the span from the first start to the last end (pure)."""
    span = max(t1 for _, t1 in readings) - min(t0 for t0, _ in readings)
    return len(readings) * reps * nbytes / span if span > 0 else 0.0


def copy_bandwidth(counts: Optional[Sequence[int]] = None, nbytes: Optional[int] = None,
                   reps: int = 4, rounds: int = 5, cpus: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """Measure the bytes per second that k concurrent copies achieve together, for each k
    of ``counts`` (default :func:`copier_counts` of the usable CPUs), the median of
    ``rounds`` rounds that take the counts in turn.  On the 16-core node 3 rounds, count
    after count, measured each of 4 copies faster than each of 2 or 3 (7.65 against 6.5
    and 6.26 GB/s), a reading that moved the model's figures by several points
    (docs/benchmarks.md, "The model on the 16-core node").  Returns
    ``{"by_copiers": {k: bytes/s}, "bytes_per_copier", "reps", "rounds", "cpus", "seconds"}``
    (keys of ``by_copiers`` as strings, for JSON)."""
    cpus = list(cpus or affinity())
    counts = sorted(set(counts or copier_counts(len(cpus))))
    if not counts or counts[0] < 1 or counts[-1] > len(cpus):
        raise ValueError(f"copier counts must lie in 1..{len(cpus)} (the usable CPUs), not {counts}")
    if nbytes is None:
        nbytes = buffer_bytes(counts[-1], last_level_cache(), _available())
    start = time.perf_counter()
    workers = [_start(cpu, nbytes, reps) for cpu in cpus[:counts[-1]]]
    try:
        for w in workers:
            _expect(w, "ready")
        speeds: dict[int, list[float]] = {k: [] for k in counts}
        for _ in range(rounds):             # the counts in turn each round: a drift of the
            for k in counts:                # machine's speed falls on every count alike
                for w in workers[:k]:
                    w.stdin.write("go\n")
                    w.stdin.flush()
                readings = [tuple(float(x) for x in _expect(w).split()) for w in workers[:k]]
                speeds[k].append(aggregate(readings, nbytes, reps))
        by = {str(k): median(v) for k, v in speeds.items()}
    finally:
        for w in workers:
            w.kill()
            w.wait()
    return {"by_copiers": by, "bytes_per_copier": nbytes, "reps": reps, "rounds": rounds,
            "cpus": cpus[:counts[-1]], "seconds": round(time.perf_counter() - start, 3)}


def _start(cpu: int, nbytes: int, reps: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, str(cpu), str(nbytes), str(reps)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _expect(worker: subprocess.Popen, word: Optional[str] = None) -> str:
    """The worker's next line (``word`` exactly, when given); a worker that died or said
    something else raises."""
    ready, _, _ = select.select([worker.stdout], [], [], WORKER_TIMEOUT_S)
    line = worker.stdout.readline().strip() if ready else ""
    if not line or (word is not None and line != word):
        worker.kill()
        raise RuntimeError(f"a copy-bandwidth worker failed (exit {worker.wait()}, "
                           f"said {line!r}{'' if ready else f' within {WORKER_TIMEOUT_S:g} s'})")
    return line


def _available() -> Optional[int]:
    kib = vm.meminfo().get("MemAvailable")
    return kib * 1024 if kib is not None else None
