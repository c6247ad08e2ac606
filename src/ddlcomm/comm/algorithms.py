"""Which implementation runs a collective: the library's, ddlcomm's own, or ``auto``.

``--algorithm`` names are looked up here: ``library`` (the backend's own
collective), the native algorithms over point-to-point
(:mod:`ddlcomm.comm.native`: ring, rhd, binomial, ...), the all-reduces
through shared memory (:data:`SHARED_MEMORY`: ``shm`` inside one node,
``hierarchical`` across nodes), and ``auto``.

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
from ..lazy import load

#: From this size up ``auto`` uses the ring all-reduce.
RING_MIN_BYTES = 1 << 20

#: ``--algorithm NAME+KERNEL`` picks the reduction kernel: ``ring+numpy``, ``rhd+c``.
KERNEL_SEP = "+"
#: Kernels a suffix may name (no suffix: the compiled kernel where built, else NumPy).
KERNELS = ("c", "numpy")

#: All-reduces through shared memory: name -> "module:bind_allreduce".
SHARED_MEMORY = {
    "shm": "ddlcomm.comm.shm:bind_allreduce",
    "hierarchical": "ddlcomm.comm.hierarchical:bind_allreduce",
}


def names(collective: str) -> list[str]:
    """Every algorithm name ``--algorithm`` accepts for ``collective``."""
    from . import native
    extra = list(SHARED_MEMORY) if collective == "allreduce" else []
    return ["library", "auto", *native.algorithms_for(collective), *extra]


def choose_auto(collective: str, nbytes: int) -> str:
    """The algorithm ``auto`` runs (pure): see the module docstring."""
    if collective == "allreduce" and nbytes >= RING_MIN_BYTES:
        return "ring"
    return "library"


def split(algorithm: str) -> tuple[str, str]:
    """``"ring+numpy"`` -> ``("ring", "numpy")``; no suffix: the ``auto`` kernel (pure)."""
    base, _, kernel = algorithm.partition(KERNEL_SEP)
    return base, kernel or "auto"


def check(collective: str, algorithm: str) -> None:
    """Refuse an ``--algorithm`` name ``collective`` does not have (UsageError lists them)."""
    from ..collectives import get_collective
    base, kernel = split(algorithm)
    known = names(collective)
    if base not in known:
        raise UsageError(f"no algorithm {base} for {collective}", f"{collective} has: {', '.join(known)}")
    if KERNEL_SEP in algorithm:
        if base == "library" or not get_collective(collective).reduces:
            raise UsageError(f"{algorithm}: a reduction kernel applies to ddlcomm's own reducing "
                             "algorithms", f"e.g. ring+numpy for allreduce")
        if kernel not in KERNELS:
            raise UsageError(f"unknown reduction kernel {kernel!r} in {algorithm}",
                             f"choose {' or '.join(KERNELS)}")


def kernel(algorithm: str, op: Optional[ReduceOp], dtype) -> Optional[Callable]:
    """The reduction kernel ``algorithm`` runs for (op, dtype); None when it reduces nothing."""
    if op is None or split(algorithm)[0] == "library":
        return None
    from ..kernels import reducer
    return reducer(op.name if not op.divide_by_ranks else "sum", dtype, split(algorithm)[1])


def resolve(collective: str, algorithm: str, nbytes: int) -> str:
    """``auto`` made concrete for this size (the same on every rank); a kernel suffix is kept."""
    base, _ = split(algorithm)
    if base != "auto":
        return algorithm
    return choose_auto(collective, nbytes) + algorithm[len(base):]


def bind(comm, collective: str, algorithm: str, sendbuf, recvbuf, op: Optional[ReduceOp],
         root: int) -> Callable[[], None]:
    """``collective`` by ``algorithm`` (not ``library`` or ``auto``) bound to these buffers."""
    check(collective, algorithm)
    base, _ = split(algorithm)
    if base in ("library", "auto"):
        raise UsageError(f"bind needs a concrete algorithm, not {base}", "resolve() it first")
    reduce = kernel(algorithm, op, sendbuf.dtype)
    if base in SHARED_MEMORY:
        return load(SHARED_MEMORY[base])(comm, sendbuf, recvbuf, op, reduce=reduce)
    from . import native
    fn = native.get(collective, base)
    if collective == "allreduce":
        return functools.partial(fn, comm, sendbuf, recvbuf, op, reduce=reduce)
    if collective == "reduce":
        return functools.partial(fn, comm, sendbuf, recvbuf, op, root, reduce=reduce)
    if collective == "broadcast":
        return functools.partial(fn, comm, sendbuf, root)
    return functools.partial(fn, comm, sendbuf, recvbuf, root)
