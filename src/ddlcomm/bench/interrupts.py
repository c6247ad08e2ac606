"""SIGINT, SIGTERM and SIGHUP inside a rank, under any launcher: say where the run stopped,
end the run as interrupted, exit 130.

A Python signal handler runs only between bytecodes of the main thread, and a
rank's main thread may be waiting inside an MPI call that never returns once
the launcher has ended the other ranks.  So the handlers here do nothing but
let Python's C-level handler write the signal number to a pipe
(``signal.set_wakeup_fd``), and a thread of our own reads it and acts at once.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable

#: The signals a launcher forwards when the user stops a job (Ctrl-C, kill, scancel), or
#: the terminal or ssh session it ran in closes (SIGHUP).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _ignore(signum, frame) -> None:
    """The Python-level handler: the thread acts, the main thread carries on meanwhile."""


class OnInterrupt:
    """While open, the first SIGINT/SIGTERM calls ``act(signal name)`` on a thread of
    its own (``act`` should end the process).  Only from the main thread."""

    def __init__(self, act: Callable[[str], None]) -> None:
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        self._write = write
        self._previous = {s: signal.signal(s, _ignore) for s in SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._wait, args=(act,), name="ddlcomm-interrupts",
                                        daemon=True)
        self._thread.start()

    def _wait(self, act: Callable[[str], None]) -> None:
        wanted = {int(s) for s in SIGNALS}
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return                              # closed
            if not data:
                return
            hit = [n for n in data if n in wanted]
            if hit:
                act(signal.Signals(hit[0]).name)
                return

    def close(self) -> None:
        """Put the previous handlers back (the thread ends with the pipe)."""
        signal.set_wakeup_fd(self._previous_fd)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        os.close(self._write)
        os.close(self._read)

    def __enter__(self) -> "OnInterrupt":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
