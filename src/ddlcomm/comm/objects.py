"""Object form of every collective, built on any backend's buffer form.

An object is pickled once (protocol 5, in band, as mpi4py's lower-case calls
do) into bytes; the bytes travel through the backend's buffer collectives as
uint8 arrays, in chunks of at most ``CHUNK_BYTES`` per rank and message so
that no single MPI call sees a count above 2**31 - 1 (some MPIs reject those:
Open MPI 5 does for pickled objects above 2 GiB).  Ranks whose payload is
shorter than the longest one pad with zeros; lengths travel first.

Reductions of objects fold the gathered objects in rank order with the op
(``ReduceOp.combine``), so any objects that support ``+``/``*``/min/max work.

A rank that cannot pickle its object, or a root that cannot fold the objects, still
takes part in the call with a marker (a length of -1, a :class:`_Failed`), so that every
rank raises a UsageError instead of the others waiting for a message that never comes.
"""
from __future__ import annotations

import pickle
from typing import Any, Optional, Protocol, Sequence

import numpy as np

from ..dtypes import ReduceOp
from ..errors import EveryRankError, UsageError



class Communicator(Protocol):
    """What the object form needs of a communicator: its size and buffer primitives
    (:class:`ddlcomm.comm.base.Communicator` has them; it imports this module)."""

    rank: int
    size: int

    def _send(self, buf: np.ndarray, dest: int, tag: int) -> None: ...

    def _recv(self, buf: np.ndarray, source: int, tag: int) -> None: ...

    def _broadcast(self, buf: np.ndarray, root: int) -> None: ...

    def _gather(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray], root: int) -> None: ...

    def _allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None: ...

    def _alltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None: ...

#: Largest number of bytes one rank puts in one message.
CHUNK_BYTES = 1 << 30
_INT_MAX = (1 << 31) - 1


#: The length a rank sends in place of its object's where it could not pickle it.
UNPICKLABLE = -1


class _Failed:
    """Sent in place of a result its root could not make: every rank raises with ``why``."""

    def __init__(self, why: str) -> None:
        self.why = why


def _dumps(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def _try_dumps(obj: Any) -> tuple[Optional[np.ndarray], str]:
    """(payload, "") or (None, why) where ``obj`` cannot be pickled."""
    try:
        return _dumps(obj), ""
    except Exception as exc:          # noqa: BLE001 - pickling raises many kinds
        return None, f"{type(exc).__name__}: {exc}"


def _refuse(ranks: Sequence[int], why: str = "") -> EveryRankError:
    """The error of a call in which ``ranks`` could not pickle their objects (every rank
    raises it: they all learn it from the lengths)."""
    who = ", ".join(map(str, ranks))
    return EveryRankError(f"rank {who} could not pickle its object{f' ({why})' if why else ''}",
                          "the object calls take picklable objects")


def _loads(data: np.ndarray) -> Any:
    return pickle.loads(memoryview(data))


def _chunk(nranks: int) -> int:
    """Chunk so that ``nranks`` blocks together stay below 2**31 bytes."""
    return max(1, min(CHUNK_BYTES, _INT_MAX // max(1, nranks)))


def _ranges(length: int, chunk: int):
    for start in range(0, length, chunk):
        yield start, min(length, start + chunk)


def _padded(payload: np.ndarray, length: int) -> np.ndarray:
    if payload.size == length:
        return payload
    out = np.zeros(length, np.uint8)
    out[:payload.size] = payload
    return out


def send(comm: "Communicator", obj: Any, dest: int, tag: int) -> None:
    payload, why = _try_dumps(obj)
    comm._send(np.array([UNPICKLABLE if payload is None else payload.size], np.int64), dest, tag)
    if payload is None:
        raise _refuse([comm.rank], why)
    for lo, hi in _ranges(payload.size, CHUNK_BYTES):
        comm._send(payload[lo:hi], dest, tag)


def recv(comm: "Communicator", source: int, tag: int) -> Any:
    length = np.zeros(1, np.int64)
    comm._recv(length, source, tag)
    if length[0] == UNPICKLABLE:
        raise _refuse([source])
    data = np.empty(int(length[0]), np.uint8)
    for lo, hi in _ranges(data.size, CHUNK_BYTES):
        comm._recv(data[lo:hi], source, tag)
    return _unpickled(data, source, comm.rank)


def broadcast(comm: "Communicator", obj: Any, root: int) -> Any:
    why = ""
    if comm.rank == root:
        payload, why = _try_dumps(obj)
        length = np.array([UNPICKLABLE if payload is None else payload.size], np.int64)
    else:
        length = np.zeros(1, np.int64)
    comm._broadcast(length, root)
    if length[0] == UNPICKLABLE:
        raise _refuse([root], why)
    if comm.rank != root:
        payload = np.empty(int(length[0]), np.uint8)
    for lo, hi in _ranges(payload.size, CHUNK_BYTES):
        comm._broadcast(payload[lo:hi], root)
    got = obj if comm.rank == root else _unpickled(payload, root, comm.rank)
    if isinstance(got, _Failed):
        raise UsageError(got.why)
    return got


def _lengths(comm: "Communicator", mine: Sequence[int]) -> np.ndarray:
    """Every rank's list of payload lengths, as a (size, len(mine)) array."""
    send_ = np.asarray(mine, np.int64)
    out = np.empty(send_.size * comm.size, np.int64)
    comm._allgather(send_, out)
    return out.reshape(comm.size, send_.size)


def _gather_payloads(comm: "Communicator", obj: Any, root: Optional[int]) -> Optional[list]:
    """Gather (root given) or allgather (root None) every rank's pickled object."""
    payload, why = _try_dumps(obj)
    lengths = _lengths(comm, [UNPICKLABLE if payload is None else payload.size])[:, 0]
    if (lengths == UNPICKLABLE).any():
        raise _refuse(np.flatnonzero(lengths == UNPICKLABLE).tolist(), why)
    width = int(lengths.max()) if lengths.size else 0
    receives = root is None or comm.rank == root
    table = np.empty((comm.size, width), np.uint8) if receives else None
    chunk = _chunk(comm.size)
    for lo, hi in _ranges(width, chunk):
        block = _padded(payload[lo:hi], hi - lo) if lo < payload.size else np.zeros(hi - lo, np.uint8)
        whole = lo == 0 and hi == width
        recv_ = (table.reshape(-1) if whole else np.empty(comm.size * (hi - lo), np.uint8)) \
            if receives else None
        if root is None:
            comm._allgather(block, recv_)
        else:
            comm._gather(block, recv_, root)
        if receives and not whole:
            table[:, lo:hi] = recv_.reshape(comm.size, hi - lo)
    if not receives:
        return None
    return [_unpickled(table[r, :lengths[r]], r, comm.rank) for r in range(comm.size)]


def _unpickled(data: np.ndarray, rank: int, here: int) -> Any:
    """Rank ``rank``'s object from its bytes, or a UsageError saying why not (its class
    defined on that rank only, say)."""
    try:
        return _loads(data)
    except Exception as exc:          # noqa: BLE001 - unpickling raises many kinds
        raise UsageError(f"rank {rank}'s object could not be unpickled at rank {here} "
                         f"({type(exc).__name__}: {exc})",
                         "send objects whose classes every rank can import") from None


def gather(comm: "Communicator", obj: Any, root: int) -> Optional[list]:
    return _gather_payloads(comm, obj, root)


def allgather(comm: "Communicator", obj: Any) -> list:
    return _gather_payloads(comm, obj, None)


def alltoall(comm: "Communicator", objs: Sequence[Any]) -> list:
    tried = [_try_dumps(o) for o in objs]
    payloads = [p for p, _ in tried]
    lengths = _lengths(comm, [UNPICKLABLE if p is None else p.size for p in payloads])
    if (lengths == UNPICKLABLE).any():                      # [sender, receiver]
        raise _refuse(sorted(set(np.nonzero(lengths == UNPICKLABLE)[0].tolist())),
                      next((why for _, why in tried if why), ""))
    width = int(lengths.max()) if lengths.size else 0
    table = np.empty((comm.size, width), np.uint8)
    chunk = _chunk(comm.size)
    for lo, hi in _ranges(width, chunk):
        send_ = np.zeros((comm.size, hi - lo), np.uint8)
        for j, p in enumerate(payloads):
            part = p[lo:hi]
            send_[j, :part.size] = part
        recv_ = np.empty(comm.size * (hi - lo), np.uint8)
        comm._alltoall(send_.reshape(-1), recv_)
        table[:, lo:hi] = recv_.reshape(comm.size, hi - lo)
    return [_unpickled(table[r, :lengths[r, comm.rank]], r, comm.rank) for r in range(comm.size)]


def _fold(objs: Sequence[Any], op: ReduceOp) -> Any:
    out = objs[0]
    for o in objs[1:]:
        out = op.combine(out, o)
    if op.divide_by_ranks:           # true division, as for Python numbers (an int array's
        out = out / len(objs)        # average is not truncated to ints)
    return out


def _folded(objs: Sequence[Any], op: ReduceOp, what: str) -> Any:
    """:func:`_fold`, or a UsageError where the objects cannot be combined by ``op``."""
    try:
        return _fold(objs, op)
    except Exception as exc:         # noqa: BLE001 - any object's operator may raise
        raise UsageError(f"{what} could not {op.name} the objects ({type(exc).__name__}: {exc})",
                         "give objects that op combines (numbers, arrays of one shape)") from None


def reduce(comm: "Communicator", obj: Any, op: ReduceOp, root: int) -> Any:
    objs = gather(comm, obj, root)
    return _folded(objs, op, "reduce_object") if objs is not None else None


def allreduce(comm: "Communicator", obj: Any, op: ReduceOp) -> Any:
    result = None
    try:
        objs = gather(comm, obj, 0)
        if objs is not None:
            result = _folded(objs, op, "allreduce_object")
    except EveryRankError:           # an object not pickled: every rank knows
        raise
    except UsageError as exc:        # rank 0's alone (unpickling, combining): every rank raises it
        result = _Failed(str(exc))
    return broadcast(comm, result, 0)


def reduce_scatter(comm: "Communicator", objs: Sequence[Any], op: ReduceOp) -> Any:
    return _folded(alltoall(comm, objs), op, "reduce_scatter_object")
