"""Each collective described once: sizes, bandwidth factor, inputs, check, call.

The harness, the validator and (later) the cost models read this table, so a
collective's conventions live in one place (nccl-tests' ``struct testColl``).

Size convention: ``count`` is the number of elements of the per-rank message.

=============== ===================== ======================= ============
collective      send / recv elements   algbw counts bytes of   busbw factor
=============== ===================== ======================= ============
broadcast       n (in place)           n                       1
reduce          n / n at the root      n                       1
allreduce       n / n                  n                       2(p-1)/p
gather          n / p*n at the root    p*n                     (p-1)/p
allgather       n / p*n                p*n                     (p-1)/p
reduce_scatter  n / n/p  (n % p == 0)  n                       (p-1)/p
alltoall        n / n    (n % p == 0)  n                       (p-1)/p
barrier         0                      0                       0
=============== ===================== ======================= ============

Inputs are small integers, so that sums and products are exact in every dtype
(even float16) whatever order a library reduces in; they differ between any
two ranks fewer than 23 apart (for prod, whose inputs are 1s and 2s, between
neighbouring ranks), which is what a mixed-up rank order would show as;
outputs are cleared to a sentinel before a check so a collective that writes
nothing cannot pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .dtypes import DType, ReduceOp
from .errors import UsageError

SENTINEL_BYTE = 0xFF


def fill(dtype: DType, count: int, rank: int, op: Optional[ReduceOp]) -> np.ndarray:
    """Rank ``rank``'s input: values that differ per rank and reduce exactly."""
    i = np.arange(count, dtype=np.int64)
    if op is not None and op.name == "prod":
        values = 1 + (i + rank) % 2
    else:
        values = 1 + ((i % 11) + 3 * rank) % 23
    return values.astype(dtype.numpy)


#: Allocates a benchmark buffer: (dtype, count) -> array.  The harness passes
#: one that takes memory of the kind asked for (ddlcomm.memory).
Alloc = Callable[[DType, int], np.ndarray]


def numpy_alloc(dtype: DType, count: int) -> np.ndarray:
    """NumPy's own allocator (which asks the kernel for THP on large arrays)."""
    return np.empty(count, dtype=dtype.numpy)


def cleared(dtype: DType, count: int, alloc: Alloc = numpy_alloc) -> np.ndarray:
    """An output buffer holding the sentinel pattern (NaN for floats)."""
    out = alloc(dtype, count)
    out.view(np.uint8)[:] = SENTINEL_BYTE
    return out


def _matches(result: np.ndarray, expected: np.ndarray, dtype: DType) -> bool:
    if result.shape != expected.shape:
        return False
    if dtype.is_float:
        return bool(np.allclose(result, expected, rtol=4 * dtype.eps, atol=0))
    return bool(np.array_equal(result, expected))


def as_flat(result: Any, dtype: DType) -> np.ndarray:
    """Turn a buffer or object-form result (array or list of arrays) into one flat array."""
    if isinstance(result, (list, tuple)):
        parts = [np.asarray(r, dtype=dtype.numpy).ravel() for r in result]
        return np.concatenate(parts) if parts else np.empty(0, dtype.numpy)
    return np.asarray(result, dtype=dtype.numpy).ravel()


@dataclass(frozen=True)
class Collective:
    """One collective: its conventions, expected results and how to call it."""

    name: str
    reduces: bool
    rooted: bool
    in_place_ok: bool
    divisible: bool            # per-rank count must be a multiple of p
    gathers: bool              # the receiver holds p times the message
    busbw_factor: Callable[[int], float]

    # ------------------------------------------------------------ sizes
    def count_for(self, nbytes: int, dtype: DType, nranks: int) -> int:
        """Elements per rank for a message of ``nbytes`` (rounded down)."""
        if self.name == "barrier":
            return 0
        count = nbytes // dtype.itemsize
        if self.divisible:
            count -= count % nranks
        return count

    def recv_count(self, count: int, nranks: int) -> int:
        if self.gathers:
            return count * nranks
        if self.name == "reduce_scatter":
            return count // nranks
        return count

    def algbw_bytes(self, nbytes: int, nranks: int) -> int:
        """Bytes that ``algbw = bytes / time`` counts (nccl-tests' convention)."""
        return nbytes * nranks if self.gathers else nbytes

    def receiver_bytes(self, nbytes: int, nranks: int) -> int:
        """Bytes the largest receiver must hold (the root of a gather)."""
        return self.recv_count(nbytes, nranks) if self.name != "barrier" else 0

    # ------------------------------------------------------------ data
    def check_request(self, *, op: Optional[ReduceOp], dtype: DType) -> None:
        """Refuse an op this collective would apply to a dtype it cannot reduce."""
        if self.reduces and op is not None:
            op.check_dtype(dtype)

    def expected(self, dtype: DType, count: int, rank: int, nranks: int,
                 op: Optional[ReduceOp], root: int) -> Optional[np.ndarray]:
        """What ``rank`` must hold afterwards (flat), or None if it receives nothing."""
        name = self.name
        if name == "barrier":
            return None
        if name == "broadcast":
            return fill(dtype, count, root, op)
        if self.rooted and rank != root:
            return None
        if name in ("gather", "allgather"):
            return np.concatenate([fill(dtype, count, r, op) for r in range(nranks)]) \
                if nranks else np.empty(0, dtype.numpy)
        if name == "alltoall":
            block = count // nranks
            return np.concatenate([fill(dtype, count, r, op)[rank * block:(rank + 1) * block]
                                   for r in range(nranks)])
        assert op is not None
        total = op.fold([fill(dtype, count, r, op) for r in range(nranks)])
        if name == "reduce_scatter":
            block = count // nranks
            return total[rank * block:(rank + 1) * block]
        return total

    def verify(self, result: Any, expected: Optional[np.ndarray], dtype: DType) -> bool:
        """True when ``result`` (buffer or object form) equals ``expected``."""
        if expected is None:
            return True
        return _matches(as_flat(result, dtype), expected, dtype)

    # ------------------------------------------------------------ calls
    def buffers(self, dtype: DType, count: int, rank: int, nranks: int, op: Optional[ReduceOp],
                root: int, in_place: bool, alloc: Alloc = numpy_alloc):
        """(send, recv) of one rank: the input filled, the output cleared (None if none)."""
        send = alloc(dtype, count)
        send[:] = fill(dtype, count, rank, op)
        if self.name in ("broadcast", "barrier") or (self.rooted and rank != root):
            return send, None
        if in_place:
            return send, send
        return send, cleared(dtype, self.recv_count(count, nranks), alloc)

    def prepare(self, comm: Any, form: str, dtype: DType, count: int, op: Optional[ReduceOp],
                root: int, in_place: bool, alloc: Alloc = numpy_alloc,
                algorithm: str = "library") -> "Prepared":
        """Allocate inputs/outputs and return the call to time and the result getter.

        ``algorithm`` "library" calls the backend's own collective; any other
        name runs ddlcomm's own algorithm of that name (buffer form only).
        """
        rank, nranks = comm.rank, comm.size
        send, recv = self.buffers(dtype, count, rank, nranks, op, root,
                                  in_place and form == "buffer", alloc)
        if self.name == "broadcast" and rank != root:
            send.view(np.uint8)[:] = SENTINEL_BYTE     # only the root's data may arrive
        if algorithm != "library":
            return Prepared(bind_algorithm(comm, self.name, algorithm, send, recv, op, root),
                            lambda: send if self.name == "broadcast" else recv,
                            _reset_outputs(self, send, recv, dtype, count, rank, op, root))
        build = _BUFFER_CALLS[self.name] if form == "buffer" else _OBJECT_CALLS[self.name]
        return build(comm, send, recv, dtype, count, op, root, in_place, rank, nranks)


@dataclass
class Prepared:
    """A ready call: ``run()`` does one collective; ``result()`` gives what this rank got."""

    run: Callable[[], Any]
    result: Callable[[], Any]
    reset: Callable[[], None]


def _no_reset() -> None:
    return None


def bind_algorithm(comm, collective: str, algorithm: str, send, recv, op, root) -> Callable[[], None]:
    """ddlcomm's own ``algorithm`` for ``collective`` bound to these buffers."""
    from .comm import algorithms
    return algorithms.bind(comm, collective, algorithm, send, recv, op, root)


def _reset_outputs(coll, send, recv, dtype, count, rank, op, root):
    def reset():
        if coll.name == "broadcast":
            if rank != root:
                send.view(np.uint8)[:] = SENTINEL_BYTE
        elif recv is send:
            send[:] = fill(dtype, count, rank, op)
        elif recv is not None:
            recv.view(np.uint8)[:] = SENTINEL_BYTE
    return reset


def _buffer_broadcast(comm, send, recv, dtype, count, op, root, in_place, rank, p):
    buf = send

    def reset():
        if rank != root:
            buf.view(np.uint8)[:] = SENTINEL_BYTE
    return Prepared(comm.bind("broadcast", buf, root=root), lambda: buf, reset)


def _rooted_recv(self_name):
    def build(comm, send, recv, dtype, count, op, root, in_place, rank, p):
        in_place = recv is send
        # Checked once, bound to these buffers: the timed call adds no work of its own.
        run = comm.bind(self_name, send, recv, op=op, root=root)

        def reset():
            if in_place:
                send[:] = fill(dtype, count, rank, op)
            elif recv is not None:
                recv.view(np.uint8)[:] = SENTINEL_BYTE
        return Prepared(run, lambda: recv, reset)
    return build


def _barrier(comm, send, recv, dtype, count, op, root, in_place, rank, p):
    return Prepared(comm.barrier, lambda: None, _no_reset)


def _object_broadcast(comm, send, recv, dtype, count, op, root, in_place, rank, p):
    box = {"out": None}
    obj = send if rank == root else None

    def run():
        box["out"] = comm.broadcast_object(obj, root)
    return Prepared(run, lambda: box["out"], _no_reset)


def _object_call(name, *, split):
    def build(comm, send, recv, dtype, count, op, root, in_place, rank, p):
        coll = COLLECTIVES[name]
        obj = list(np.split(send, p)) if split else send
        call = getattr(comm, name + "_object")
        kwargs = {}
        if coll.reduces:
            kwargs["op"] = op
        if coll.rooted:
            kwargs["root"] = root
        box = {"out": None}

        def run():
            box["out"] = call(obj, **kwargs)
        return Prepared(run, lambda: box["out"], _no_reset)
    return build


def _const(value: float) -> Callable[[int], float]:
    return lambda p: value


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("broadcast", False, True, False, False, False, _const(1.0)),
        Collective("reduce", True, True, True, False, False, _const(1.0)),
        Collective("allreduce", True, False, True, False, False, lambda p: 2 * (p - 1) / p),
        Collective("gather", False, True, False, False, True, lambda p: (p - 1) / p),
        Collective("allgather", False, False, False, False, True, lambda p: (p - 1) / p),
        Collective("reduce_scatter", True, False, False, True, False, lambda p: (p - 1) / p),
        Collective("alltoall", False, False, False, True, False, lambda p: (p - 1) / p),
        Collective("barrier", False, False, False, False, False, _const(0.0)),
    )
}

_BUFFER_CALLS = {
    "broadcast": _buffer_broadcast,
    "barrier": _barrier,
    **{n: _rooted_recv(n) for n in ("reduce", "allreduce", "gather", "allgather",
                                    "reduce_scatter", "alltoall")},
}
_OBJECT_CALLS = {
    "broadcast": _object_broadcast,
    "barrier": _barrier,
    "reduce": _object_call("reduce", split=False),
    "allreduce": _object_call("allreduce", split=False),
    "gather": _object_call("gather", split=False),
    "allgather": _object_call("allgather", split=False),
    "reduce_scatter": _object_call("reduce_scatter", split=True),
    "alltoall": _object_call("alltoall", split=True),
}


def check_in_place(collectives: list[Collective]) -> None:
    """``--in-place`` needs at least one collective that can run in place.

    The others run out of place; every stored point says which way it ran.
    """
    if not any(c.in_place_ok for c in collectives):
        names = ", ".join(c.name for c in collectives)
        raise UsageError(f"--in-place does not apply to {names}",
                         "in-place runs exist for allreduce and reduce (broadcast is always in place)")


def get_collective(name: str) -> Collective:
    """Look up a collective by name; raise a :class:`UsageError` naming the choices."""
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise UsageError(f"unknown collective {name!r}",
                         f"choose from {', '.join(COLLECTIVES)}") from None
