"""p threads of one process as p ranks of a C engine that releases the GIL for a whole call
and meets its peers only through counters in shared memory (the shm engines' tests)."""
from __future__ import annotations

import threading
from typing import Callable


def run_as_ranks(p: int, rank: Callable[[int], None], timeout_s: float = 60.0) -> list[Exception]:
    """Run ``rank(r)`` for r in 0..p-1 at once, one thread each; the exceptions they raised.
    A thread still running after ``timeout_s`` fails the test: a rank hung."""
    errors: list[Exception] = []

    def body(r: int) -> None:
        try:
            rank(r)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return errors
