"""Each collective described once: sizes, bandwidth factor, inputs, expected results.

The harness, the validator, the backends' argument checks and the cost models
read this table, so a collective's conventions live in one place (nccl-tests'
``struct testColl``).  Pure: NumPy only; the code that calls a Communicator
with these buffers is :mod:`ddlcomm.measure.calls`.

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


#: Every input repeats with this period (11 for the sums' pattern, 2 for prod's).
PERIOD = 22
#: The elements of one row: computed once per rank, then copied along a buffer (a whole
#: number of periods, so that a row's copies continue the pattern).
ROW_ELEMENTS = PERIOD * 2048


def pattern(dtype: DType, rank: int, op: Optional[ReduceOp]) -> np.ndarray:
    """One row of rank ``rank``'s input (:data:`ROW_ELEMENTS` elements), which
    :func:`fill` repeats: values that differ per rank and reduce exactly."""
    i = np.arange(ROW_ELEMENTS, dtype=np.int64)
    if op is not None and op.name == "prod":
        values = 1 + (i + rank) % 2
    else:
        values = 1 + ((i % 11) + 3 * rank) % 23
    return values.astype(dtype.numpy)


def repeat(row: np.ndarray, count: int, start: int = 0,
           out: Optional[np.ndarray] = None) -> np.ndarray:
    """Elements ``start .. start+count`` of ``row`` repeated without end, into ``out``
    (a new array by default): the row once, then copies of what is written so far,
    doubling (memory-bandwidth bound, where computing the pattern is not)."""
    if out is None:
        out = np.empty(count, row.dtype)
    if start % len(row):
        row = np.roll(row, -(start % len(row)))
    done = min(len(row), count)
    out[:done] = row[:done]
    while done < count:
        k = min(done, count - done)
        out[done:done + k] = out[:k]
        done += k
    return out


def fill(dtype: DType, count: int, rank: int, op: Optional[ReduceOp]) -> np.ndarray:
    """Rank ``rank``'s input, ``count`` elements (its :func:`pattern`, repeated)."""
    return repeat(pattern(dtype, rank, op), count)


def fill_into(buf: Any, dtype: DType, rank: int, op: Optional[ReduceOp]) -> None:
    """Write rank ``rank``'s input into ``buf`` (a NumPy array in place; else by assignment)."""
    if isinstance(buf, np.ndarray) and buf.ndim == 1:
        repeat(pattern(dtype, rank, op), len(buf), out=buf)
    else:
        buf[:] = fill(dtype, len(buf), rank, op)


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
    # Sums of the small integer inputs are exact in every dtype: the exact comparison (one
    # pass) decides nearly every check; allclose (several passes) only what it refused.
    if np.array_equal(result, expected):
        return True
    if dtype.is_float:
        return bool(np.allclose(result, expected, rtol=4 * dtype.eps, atol=0))
    return False


def as_flat(result: Any, dtype: DType) -> np.ndarray:
    """Turn a buffer or object-form result (array or list of arrays) into one flat array."""
    if isinstance(result, (list, tuple)):
        parts = [np.asarray(r, dtype=dtype.numpy).ravel() for r in result]
        return np.concatenate(parts) if parts else np.empty(0, dtype.numpy)
    return np.asarray(result, dtype=dtype.numpy).ravel()


# ------------------------------------------------------------------ what each rank holds
# ``expect(dtype, count, rank, nranks, op, root)``: what a receiving rank holds (flat).
def _root_input(dtype: DType, count: int, rank: int, nranks: int, op, root: int) -> np.ndarray:
    return fill(dtype, count, root, op)


def _every_input(dtype: DType, count: int, rank: int, nranks: int, op, root: int) -> np.ndarray:
    out = np.empty(count * nranks, dtype.numpy)
    for r in range(nranks):
        repeat(pattern(dtype, r, op), count, out=out[r * count:(r + 1) * count])
    return out


def _my_block_of_every_input(dtype: DType, count: int, rank: int, nranks: int, op,
                             root: int) -> np.ndarray:
    block = count // nranks
    out = np.empty(block * nranks, dtype.numpy)
    for r in range(nranks):
        repeat(pattern(dtype, r, op), block, rank * block, out[r * block:(r + 1) * block])
    return out


def _folded_row(dtype: DType, nranks: int, op: ReduceOp) -> np.ndarray:
    """One row of the reduction of every rank's input (elementwise, so it repeats too)."""
    return op.fold([pattern(dtype, r, op) for r in range(nranks)])


def _fold(dtype: DType, count: int, rank: int, nranks: int, op: ReduceOp, root: int) -> np.ndarray:
    return repeat(_folded_row(dtype, nranks, op), count)


def _my_block_of_fold(dtype: DType, count: int, rank: int, nranks: int, op: ReduceOp,
                      root: int) -> np.ndarray:
    block = count // nranks
    return repeat(_folded_row(dtype, nranks, op), block, rank * block)


def _nothing(dtype: DType, count: int, rank: int, nranks: int, op, root: int) -> None:
    return None


def _const(value: float) -> Callable[[int], float]:
    return lambda p: value


#: Who holds a result afterwards.
ALL, ROOT, NONE = "all", "root", "none"


@dataclass(frozen=True)
class Collective:
    """One collective: its conventions and what every rank must hold afterwards (pure)."""

    name: str
    #: (p) -> nccl-tests' bus-bandwidth factor.
    busbw_factor: Callable[[int], float]
    #: (dtype, count, rank, nranks, op, root) -> what a receiving rank holds (flat).
    expect: Callable[..., Optional[np.ndarray]]
    #: Applies a reduction op.
    reduces: bool = False
    #: Has a root rank (the calls take ``root``).
    rooted: bool = False
    #: Who holds a result: ALL ranks, the ROOT only, or NONE (barrier).
    receivers: str = ALL
    #: The result lands in the send buffer (broadcast): there is no receive buffer.
    in_send: bool = False
    #: Can run with ``recvbuf is sendbuf``.
    in_place_ok: bool = False
    #: The per-rank count must be a multiple of p (one block per rank).
    divisible: bool = False
    #: The receiver holds p times the message (gathers) ...
    gathers: bool = False
    #: ... or one p-th of it (scatters).
    scatters: bool = False

    @property
    def moves_data(self) -> bool:
        """False for the barrier, whose messages carry nothing."""
        return self.receivers != NONE

    @property
    def object_per_rank(self) -> bool:
        """The object form takes one object per rank (its blocks) instead of one object."""
        return self.divisible

    def receives(self, rank: int, root: int) -> bool:
        """Whether ``rank`` holds a result afterwards."""
        return self.receivers == ALL or (self.receivers == ROOT and rank == root)

    def sources(self, rank: int, root: int) -> bool:
        """Whether ``rank``'s buffer is where the data come from: a broadcast's root alone
        (every path starts there), a rooted collective's other ranks where the root alone
        receives (gather, reduce), every rank otherwise.  A single copy between processes
        pins its sender's pages, so these ranks' pages price it."""
        if self.in_send:
            return rank == root
        if self.receivers == ROOT:
            return rank != root
        return self.moves_data

    def has_recvbuf(self, rank: int, root: int) -> bool:
        """Whether ``rank`` passes a receive buffer to the buffer-form call."""
        return not self.in_send and self.receives(rank, root)

    # ------------------------------------------------------------ sizes
    def count_for(self, nbytes: int, dtype: DType, nranks: int) -> int:
        """Elements per rank for a message of ``nbytes`` (rounded down)."""
        if not self.moves_data:
            return 0
        count = nbytes // dtype.itemsize
        if self.divisible:
            count -= count % nranks
        return count

    def recv_count(self, count: int, nranks: int) -> int:
        """Elements the receive buffer holds for ``count`` elements per rank."""
        if self.gathers:
            return count * nranks
        if self.scatters:
            return count // nranks
        return count

    def algbw_bytes(self, nbytes: int, nranks: int) -> int:
        """Bytes that ``algbw = bytes / time`` counts (nccl-tests' convention)."""
        return nbytes * nranks if self.gathers else nbytes

    def receiver_bytes(self, nbytes: int, nranks: int) -> int:
        """Bytes the largest receiver must hold (the root of a gather)."""
        return self.recv_count(nbytes, nranks) if self.moves_data else 0

    # ------------------------------------------------------------ data
    def check_request(self, *, op: Optional[ReduceOp], dtype: DType) -> None:
        """Refuse an op this collective would apply to a dtype it cannot reduce."""
        if self.reduces and op is not None:
            op.check_dtype(dtype)

    def expected(self, dtype: DType, count: int, rank: int, nranks: int,
                 op: Optional[ReduceOp], root: int) -> Optional[np.ndarray]:
        """What ``rank`` must hold afterwards (flat), or None if it receives nothing."""
        if not self.receives(rank, root):
            return None
        if self.reduces and op is None:
            raise UsageError(f"the expected result of {self.name} needs a reduction op")
        return self.expect(dtype, count, rank, nranks, op, root)

    def verify(self, result: Any, expected: Optional[np.ndarray], dtype: DType) -> bool:
        """True when ``result`` (buffer or object form) equals ``expected``."""
        if expected is None:
            return True
        return _matches(as_flat(result, dtype), expected, dtype)

    def buffers(self, dtype: DType, count: int, rank: int, nranks: int, op: Optional[ReduceOp],
                root: int, in_place: bool, alloc: Alloc = numpy_alloc):
        """(send, recv) of one rank: the input filled, the output cleared (None if none).

        Where the result lands in the send buffer (broadcast), a rank other
        than the root has its input cleared too: only the root's data may arrive.
        """
        send = alloc(dtype, count)
        fill_into(send, dtype, rank, op)
        if self.in_send and rank != root:
            send.view(np.uint8)[:] = SENTINEL_BYTE
        if not self.has_recvbuf(rank, root):
            return send, None
        if in_place:
            return send, send
        return send, cleared(dtype, self.recv_count(count, nranks), alloc)

    def reset(self, send: np.ndarray, recv: Optional[np.ndarray], dtype: DType, count: int,
              rank: int, op: Optional[ReduceOp], root: int) -> None:
        """Put ``buffers()``' pair back as it was before a call (the check's call)."""
        if self.in_send:
            if rank != root:
                send.view(np.uint8)[:] = SENTINEL_BYTE
        elif recv is send:
            fill_into(send, dtype, rank, op)
        elif recv is not None:
            recv.view(np.uint8)[:] = SENTINEL_BYTE

    def call_args(self, send: Any, recv: Any, op: Any, root: int) -> tuple:
        """A call's positional arguments in MPI's order: the send buffer, the receive
        buffer (unless the result lands in the send buffer), the op (if it reduces),
        the root (if rooted)."""
        return (send,) + (() if self.in_send else (recv,)) + ((op,) if self.reduces else ()) \
            + ((root,) if self.rooted else ())

    def result_of(self, send: np.ndarray, recv: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """Which of ``buffers()``' pair holds this rank's result."""
        return send if self.in_send else recv


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("broadcast", _const(1.0), _root_input, rooted=True, in_send=True),
        Collective("reduce", _const(1.0), _fold, reduces=True, rooted=True, receivers=ROOT,
                   in_place_ok=True),
        Collective("allreduce", lambda p: 2 * (p - 1) / p, _fold, reduces=True, in_place_ok=True),
        Collective("gather", lambda p: (p - 1) / p, _every_input, rooted=True, receivers=ROOT,
                   gathers=True),
        Collective("allgather", lambda p: (p - 1) / p, _every_input, gathers=True),
        Collective("reduce_scatter", lambda p: (p - 1) / p, _my_block_of_fold, reduces=True,
                   divisible=True, scatters=True),
        Collective("alltoall", lambda p: (p - 1) / p, _my_block_of_every_input, divisible=True),
        Collective("barrier", _const(0.0), _nothing, receivers=NONE),
    )
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
