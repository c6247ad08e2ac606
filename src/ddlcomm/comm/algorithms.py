"""Which implementation runs a collective: the library's, ddlcomm's own, or ``auto``.

``--algorithm`` names are looked up here: ``library`` (the backend's own
collective), the native algorithms over point-to-point
(:mod:`ddlcomm.comm.native`: ring, rhd, binomial, ...), the intra-node
shared-memory all-reduce ``shm`` (:mod:`ddlcomm.comm.shm`), and ``auto``.

``auto`` picks per collective and size from what we measured on our machine
(docs/benchmarks.md, "ddlcomm's own all-reduce"): the ring all-reduce from
``RING_MIN_BYTES`` up (1.6-2.7x faster than Open MPI's at 16-256 MiB, 2
ranks), the library's collective below (small messages, where the library's
latency wins) and for collectives with no faster native path measured.  The
copying ``shm`` path lost to the ring there; its zero-copy form (buffers in
``--memory shared``) is chosen by name.  The choice is recorded with each
point as ``algorithm_run``.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

from ..dtypes import ReduceOp
from ..errors import UsageError

#: From this size up ``auto`` uses the ring all-reduce.
RING_MIN_BYTES = 1 << 20


def names(collective: str) -> list[str]:
    """Every algorithm name ``--algorithm`` accepts for ``collective``."""
    from . import native
    extra = ["shm"] if collective == "allreduce" else []
    return ["library", "auto", *native.algorithms_for(collective), *extra]


def choose_auto(collective: str, nbytes: int) -> str:
    """The algorithm ``auto`` runs (pure): see the module docstring."""
    if collective == "allreduce" and nbytes >= RING_MIN_BYTES:
        return "ring"
    return "library"


def _kernel(op: Optional[ReduceOp], dtype) -> Optional[Callable]:
    """The compiled reduction kernel for (op, dtype) when built, else None (NumPy)."""
    if op is None:
        return None
    try:
        from ..kernels import reducer
    except ImportError:
        return None
    return reducer(op.name, dtype)


def resolve(collective: str, algorithm: str, nbytes: int) -> str:
    """``auto`` made concrete for this size (the same on every rank)."""
    return choose_auto(collective, nbytes) if algorithm == "auto" else algorithm


def bind(comm, collective: str, algorithm: str, sendbuf, recvbuf, op: Optional[ReduceOp],
         root: int) -> Callable[[], None]:
    """``collective`` by ``algorithm`` (not ``library`` or ``auto``) bound to these buffers."""
    if algorithm not in names(collective) or algorithm in ("library", "auto"):
        raise UsageError(f"no algorithm {algorithm!r} for {collective}",
                         f"{collective} has: {', '.join(names(collective))}")
    kernel = _kernel(op, sendbuf.dtype)
    if algorithm == "shm":
        from .shm import bind_allreduce
        return bind_allreduce(comm, sendbuf, recvbuf, op, reduce=kernel)
    from . import native
    fn = native.get(collective, algorithm)
    if collective == "allreduce":
        return functools.partial(fn, comm, sendbuf, recvbuf, op, reduce=kernel)
    if collective == "reduce":
        return functools.partial(fn, comm, sendbuf, recvbuf, op, root, reduce=kernel)
    if collective == "broadcast":
        return functools.partial(fn, comm, sendbuf, root)
    return functools.partial(fn, comm, sendbuf, recvbuf, root)
