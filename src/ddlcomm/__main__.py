"""``python -m ddlcomm``: the command line, and how every rank runs it.

A process that loaded torch ends without the interpreter's final teardown:
its Python exit handlers run (shared-memory segments are freed, logs
flushed), MPI is finalized, then ``os._exit``.  Tearing torch's C++ state down at exit aborted
a Gloo rank after its work was done and stored, about once in 10 to 30 runs
of a 2-rank ``train --peer ddp`` (``terminate called without an active
exception``, no Python frame on the stack); pytorch/pytorch#179291 and #190489
report such aborts of Gloo at interpreter exit.
"""
import atexit
import os
import sys
import threading

from .entry import main


def _end(code: int) -> None:
    if "torch" not in sys.modules:
        sys.exit(code)
    for thread in threading.enumerate():            # as the interpreter would: wait for them
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()                         # weakref.finalize's hook is one of them
    mpi = sys.modules.get("mpi4py.MPI")             # mpi4py finalizes from C at exit: now
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(int(code or 0))


_end(main())
