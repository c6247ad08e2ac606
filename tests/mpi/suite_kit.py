"""What every rank-side suite shares: exact inputs, the wide reference, the failure
record, the guard that aborts the job on an exception, and how a suite ends."""
from __future__ import annotations

import sys
import traceback
from typing import Any, Callable, Optional

import numpy as np


def data(rank: int, count: int, dtype, op: str, salt: int) -> np.ndarray:
    """Small integers (1 or 2 for prod): exact in every dtype and order of reduction."""
    rng = np.random.default_rng(7919 * rank + salt)
    return rng.integers(1, 3 if op == "prod" else 20, size=count).astype(dtype)


def thinned(dtype, op: str, thin: bool) -> bool:
    """Whether a ``--thin`` pass leaves the pair (``dtype``, a dtype or its name; ``op``) out: it keeps every
    dtype with ``sum`` and every op with float32.  For a backend that only carries the
    bytes of ddlcomm's own reductions (Gloo's point-to-point, a signal beside shared
    memory): what depends on the backend is each dtype's bytes, while the reductions are
    ddlcomm's kernels, which the full product checks under both MPIs."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return thin and op != "sum" and name != "float32"


THIN_HELP = "every dtype with sum and every op with float32 (a backend that only carries bytes)"


def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"


def reference(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """The exact result in float64 / int64 (not yet rounded to the dtype)."""
    wide = np.float64 if is_float(arrays[0].dtype) else np.int64
    stack = np.stack(arrays).astype(wide) if arrays[0].size else np.zeros((len(arrays), 0), wide)
    return {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0),
            "max": stack.max(0), "avg": stack.sum(0) / len(arrays)}[op]


class Checks:
    """A rank's record of its cases: how many ran, which failed, and a salt per case."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.failures: list[str] = []
        self.cases = 0
        self.salt = 0

    def check(self, name: str, ok: bool) -> None:
        self.cases += 1
        if not ok:
            self.failures.append(f"rank {self.comm.rank}: {name}")

    def next_salt(self) -> int:
        self.salt += 1
        return self.salt


def guarded(comm, run: Callable[[], Any]) -> Any:
    """``run()``; an exception on any rank prints its traceback and aborts the whole job
    (no rank is left waiting in a collective the others never reach)."""
    try:
        return run()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        comm.abort(2)


def conclude(comm, failures: list[str], summary: Callable[[int, list], str],
             extra: Optional[Any] = None) -> int:
    """Gather every rank's ``failures`` (and ``extra``) to rank 0, which prints
    ``summary(number of failures, every rank's extra)`` and the first 50
    failures; close ``comm``; exit code 0 on every rank when none failed."""
    everyone = comm.gather_object((failures, extra), root=0)
    ok = None
    if comm.rank == 0:
        flat = [f for fs, _ in everyone for f in fs]
        print(summary(len(flat), [e for _, e in everyone]))
        for f in flat[:50]:
            print("FAIL", f)
        ok = not flat
    ok = comm.broadcast_object(ok, 0)
    comm.close()
    return 0 if ok else 1
