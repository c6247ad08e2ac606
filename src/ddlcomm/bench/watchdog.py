"""A per-rank watchdog: ends the rank if a guarded step outlasts its limit.

One daemon thread sleeps on a condition until the armed deadline (no busy
wait) and, if the step is still running then, calls ``on_expire(what)``,
which is expected to end the process.  The thread never calls MPI, so MPI can
be initialised at ``MPI_THREAD_FUNNELED``.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional


class Watchdog:
    def __init__(self, timeout_s: float, on_expire: Callable[[str, float], None]) -> None:
        self.timeout_s = timeout_s
        self._on_expire = on_expire
        self._cond = threading.Condition()
        self._armed: Optional[tuple[str, float, float]] = None
        #: The step under guard now (None between steps), and the last one guarded.
        self.current: Optional[str] = None
        self.last: Optional[str] = None
        threading.Thread(target=self._watch, name="ddlcomm-watchdog", daemon=True).start()

    @contextmanager
    def guard(self, what: str, timeout_s: Optional[float] = None) -> Iterator[None]:
        """Run the ``with`` body under the limit; ``what`` names it in the error."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        with self._cond:
            self._armed = (what, time.monotonic() + limit, limit)
            self.current = self.last = what
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._armed = None
                self._cond.notify()
        self.current = None

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._armed is None:
                    self._cond.wait()
                    continue
                what, deadline, limit = self._armed
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._armed = None
                break
        self._on_expire(what, limit)
