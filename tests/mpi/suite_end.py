"""How every rank-side suite ends: rank 0 reports everyone's failures, every rank gets the verdict."""
from __future__ import annotations

from typing import Any, Callable, Optional


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
