"""What every native algorithm shares: argument checks, blocks, scratch, exchanges.

The algorithms move data only through a communicator's point-to-point
primitives (``_send``, ``_recv``, ``_sendrecv``, ``_isend``, ``_irecv``), all
with one tag, :data:`TAG`; MPI and Gloo both deliver the messages between
two ranks with one tag in the order they were sent, which the chunked
exchanges rely on.  Empty messages are never sent: both ends of every message
compute its length from the same (count, size, rank) arithmetic, so both skip
it alike.

A message longer than ``chunk`` elements travels as ``ceil(len / chunk)``
pieces of ``chunk`` elements (the last shorter), whichever helper sends or
receives it, so both ends always agree on how a message is cut.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from ...dtypes import ReduceOp
from ...errors import DdlcommError, UsageError
from ..buffers import check_recv as buffers_check_recv
from ..buffers import check_writable, take_part

if TYPE_CHECKING:
    from ..base import Communicator

#: Tag of every message the native algorithms send ("dd"); below MPI's minimum tag bound 32767.
#: ddlcomm's other messages take the tags after it, each its own: a Group's barrier
#: (comm/group.py), the device transports' data, ready and done messages (comm/device).
TAG = 0x6464
BARRIER_TAG, DATA_TAG, READY_TAG, DONE_TAG = TAG + 1, TAG + 2, TAG + 3, TAG + 4

#: ``reduce(a, b, out)``: out = a (op) b, elementwise; out may be a.
Reducer = Callable[[np.ndarray, np.ndarray, np.ndarray], object]


# ------------------------------------------------------------------ checks
def flat(array: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous array (checked by the caller)."""
    return array if array.ndim == 1 else array.reshape(-1)


def check_buf(comm: "Communicator", array: np.ndarray, what: str) -> np.ndarray:
    """``array`` as a flat view, if the backend can carry it; else a precise error."""
    numpy_array(array, what)
    comm.check_buffer(array)                      # dtype the backend carries, C-contiguous
    return flat(array)


def numpy_array(array: np.ndarray, what: str) -> None:
    """Refuse anything but a NumPy array: ddlcomm's own algorithms on host buffers take those."""
    if not isinstance(array, np.ndarray):
        raise UsageError(f"{what} must be a NumPy array, not {type(array).__name__}",
                         "wrap it with np.asarray(...)")


def check_recv(comm: "Communicator", sendbuf: np.ndarray, recvbuf: Optional[np.ndarray],
               count: int, what: str, in_place: bool) -> np.ndarray:
    """``recvbuf`` (allocated when None) checked as the Communicator's methods check theirs
    (:func:`ddlcomm.comm.buffers.check_recv`): a NumPy array of ``count`` elements of
    sendbuf's dtype, writable, apart from the send buffer, or the send buffer itself where
    the collective runs ``in_place`` (the all-reduces, reduce at the root)."""
    if recvbuf is None:
        return np.empty(count, sendbuf.dtype)
    numpy_array(recvbuf, what)
    return buffers_check_recv(recvbuf, sendbuf, count, what, comm.check_buffer, in_place)


def recv_or_part(comm: "Communicator", sendbuf: np.ndarray, recvbuf: Optional[np.ndarray],
                 count: int, what: str, call: Callable[[np.ndarray], Any], in_place: bool = True) -> np.ndarray:
    """:func:`check_recv`; where it refuses, ``call`` (the collective into a given receive
    buffer) runs into scratch memory first, so the other ranks are not left waiting in it
    (as the Communicator's methods do: :func:`ddlcomm.comm.buffers.take_part`)."""
    try:
        return check_recv(comm, sendbuf, recvbuf, count, what, in_place)
    except DdlcommError as refused:
        raise take_part(refused, lambda: call(np.empty(count, sendbuf.dtype))) from None


def broadcast_or_part(comm: "Communicator", buf: np.ndarray, root: int,
                      call: Callable[[np.ndarray, int], Any]) -> tuple[np.ndarray, int]:
    """A broadcast's buffer as a flat view, and its root, checked (the ranks other than the
    root write into the buffer).  Where a rank off the root refuses its read-only buffer
    (its own, which the others cannot see), ``call`` (the broadcast of a given flat buffer
    from a root) runs into a scratch copy first, so the others are not left waiting in it;
    a buffer or root refused alike on every rank is refused before any message."""
    flat = check_buf(comm, buf, "broadcast's buffer")
    root = comm.check_root(root)
    if comm.rank != root:
        try:
            check_writable(buf, "broadcast's buffer")
        except DdlcommError as refused:
            raise take_part(refused, lambda: call(np.array(flat), root)) from None
    return flat, root


def check_op(comm: "Communicator", op: "str | ReduceOp", array: np.ndarray) -> ReduceOp:
    return comm.check_op(op, comm.check_buffer(array))


def check_reduce(reduce: Optional[Reducer], op: ReduceOp) -> Reducer:
    """The reduction kernel: the caller's ``reduce(a, b, out)``, or the op's NumPy ufunc."""
    if reduce is None:
        return op.ufunc                     # ufunc(a, b, out) writes out = a (op) b
    if not callable(reduce):
        raise UsageError(f"reduce must be a callable reduce(a, b, out), not {type(reduce).__name__}",
                         "pass e.g. ddlcomm.kernels.reducer(op_name, dtype), or None for NumPy")
    return reduce


def check_chunk(chunk_bytes: Optional[int], itemsize: int) -> Optional[int]:
    """``chunk_bytes`` as a number of elements (at least 1), or None for no chunking."""
    if chunk_bytes is None:
        return None
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, (int, np.integer)) \
            or chunk_bytes <= 0:
        raise UsageError(f"chunk_bytes must be a positive number of bytes, not {chunk_bytes!r}",
                         "e.g. chunk_bytes=1 << 20, or None for no chunking")
    return max(1, int(chunk_bytes) // itemsize)


# ------------------------------------------------------------------ blocks
def blocks(count: int, parts: int) -> list[int]:
    """Offsets of ``parts`` near-equal blocks of ``count`` elements, plus ``count`` at the end.

    The first ``count % parts`` blocks hold one element more; some are empty
    when ``count < parts``.  Block i is ``offsets[i]:offsets[i + 1]``.
    """
    base, extra = divmod(count, parts)
    return [i * base + min(i, extra) for i in range(parts + 1)]


def pieces(length: int, chunk: Optional[int]) -> list[tuple[int, int]]:
    """How a message of ``length`` elements is cut: (start, stop) ranges."""
    if length == 0:
        return []
    if chunk is None or length <= chunk:
        return [(0, length)]
    return [(lo, min(length, lo + chunk)) for lo in range(0, length, chunk)]


def floor_pow2(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


# ------------------------------------------------------------------ scratch
# Receive buffers are reused between calls, per communicator: a fresh np.empty
# of many MiB per call would fault its pages in every time (mmap'd memory).
# A communicator is driven by one thread at a time (MPI is initialised
# FUNNELED), so one set of buffers per communicator is enough.
_SCRATCH: "weakref.WeakKeyDictionary[Communicator, dict[int, np.ndarray]]" = \
    weakref.WeakKeyDictionary()


def scratch(comm: "Communicator", dtype: np.dtype, count: int, slot: int = 0) -> np.ndarray:
    """A reusable buffer of ``count`` elements (contents undefined); one per ``slot``."""
    nbytes = count * dtype.itemsize
    bufs = _SCRATCH.get(comm)
    if bufs is None:
        bufs = _SCRATCH[comm] = {}
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < nbytes:
        buf = bufs[slot] = np.empty(max(nbytes, 64), np.uint8)
    return buf[:nbytes].view(dtype)


def free_scratch(comm: Optional["Communicator"] = None) -> None:
    """Drop the cached receive buffers of ``comm`` (of every communicator when None)."""
    if comm is None:
        _SCRATCH.clear()
    else:
        _SCRATCH.pop(comm, None)


# ------------------------------------------------------------------ exchanges
def send(comm: "Communicator", buf: np.ndarray, dest: int, chunk: Optional[int]) -> None:
    """Send ``buf`` to ``dest`` in pieces (all started at once); nothing when empty."""
    cuts = pieces(buf.size, chunk)
    if len(cuts) == 1:
        comm._send(buf, dest, TAG)
    elif cuts:
        for req in [comm._isend(buf[lo:hi], dest, TAG) for lo, hi in cuts]:
            req.wait()


def recv(comm: "Communicator", buf: np.ndarray, source: int, chunk: Optional[int]) -> None:
    """Receive ``buf`` from ``source`` in the pieces :func:`send` cuts it into."""
    cuts = pieces(buf.size, chunk)
    if len(cuts) == 1:
        comm._recv(buf, source, TAG)
    elif cuts:
        for req in [comm._irecv(buf[lo:hi], source, TAG) for lo, hi in cuts]:
            req.wait()


def exchange(comm: "Communicator", sendpart: np.ndarray, dest: int,
             recvpart: np.ndarray, source: int) -> None:
    """Send ``sendpart`` to ``dest`` and receive ``recvpart`` from ``source`` at once (unchunked)."""
    if sendpart.size and recvpart.size:
        comm._sendrecv(sendpart, dest, recvpart, source, TAG)
    elif sendpart.size:
        comm._send(sendpart, dest, TAG)
    elif recvpart.size:
        comm._recv(recvpart, source, TAG)


def exchange_reduce(comm: "Communicator", sendpart: np.ndarray, dest: int,
                    mine: np.ndarray, out: np.ndarray, source: int,
                    reduce: Reducer, chunk: Optional[int]) -> None:
    """Send ``sendpart`` to ``dest``; receive ``out.size`` elements from ``source``;
    ``out = mine (op) received``.

    ``mine`` may be ``out`` (in place); ``sendpart`` must not overlap ``out``.
    Unchunked: one sendrecv, then one reduction.  Chunked: every piece of
    ``sendpart`` is started at once, pieces are received into two alternating
    scratch slots, and piece k+1 is already on its way while piece k is reduced
    (while it is still in cache).
    """
    n = out.size
    rcuts = pieces(n, chunk)
    scuts = pieces(sendpart.size, chunk)
    if len(rcuts) <= 1 and len(scuts) <= 1:
        tmp = scratch(comm, out.dtype, n)
        exchange(comm, sendpart, dest, tmp, source)
        if n:
            reduce(mine, tmp, out)
        return
    sends = [comm._isend(sendpart[lo:hi], dest, TAG) for lo, hi in scuts]
    if rcuts:
        width = min(chunk, n)
        tmp = scratch(comm, out.dtype, 2 * width)
        slots = (tmp[:width], tmp[width:])

        def post(k: int):
            lo, hi = rcuts[k]
            return comm._irecv(slots[k & 1][:hi - lo], source, TAG)

        req = post(0)
        for k, (lo, hi) in enumerate(rcuts):
            nxt = post(k + 1) if k + 1 < len(rcuts) else None
            req.wait()
            reduce(mine[lo:hi], slots[k & 1][:hi - lo], out[lo:hi])
            req = nxt
    for req in sends:
        req.wait()


# ------------------------------------------------------------------ links
class HostLink:
    """How an algorithm's ``run`` moves data: here over a communicator's point-to-point on
    NumPy arrays (the functions above).  ``ddlcomm.comm.device.link.DeviceLink`` has the
    same methods on device tensors, so one ``run`` serves both."""

    def __init__(self, comm: "Communicator") -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def send(self, buf: np.ndarray, dest: int, chunk: Optional[int] = None) -> None:
        send(self.comm, buf, dest, chunk)

    def recv(self, buf: np.ndarray, source: int, chunk: Optional[int] = None) -> None:
        recv(self.comm, buf, source, chunk)

    def exchange(self, sendpart: np.ndarray, dest: int, recvpart: np.ndarray, source: int) -> None:
        exchange(self.comm, sendpart, dest, recvpart, source)

    def exchange_reduce(self, sendpart: np.ndarray, dest: int, mine: np.ndarray, out: np.ndarray,
                        source: int, reduce: Reducer, chunk: Optional[int]) -> None:
        exchange_reduce(self.comm, sendpart, dest, mine, out, source, reduce, chunk)

    def scratch(self, like: np.ndarray, count: int, slot: int = 0) -> np.ndarray:
        return scratch(self.comm, like.dtype, count, slot)


# ------------------------------------------------------------------ cost model
@dataclass(frozen=True)
class Schedule:
    """What one call of an algorithm costs along its critical path (for the α-β-γ model).

    ``rounds`` messages one after another (each costs α), ``bytes`` through the
    busiest link (each costs β), ``reduced_bytes`` reduced by the busiest rank
    (each costs γ): time = rounds·α + bytes·β + reduced_bytes·γ.
    """

    rounds: int
    bytes: float
    reduced_bytes: float = 0.0

    def time(self, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
        """Predicted seconds for latency α, seconds per byte β and per reduced byte γ."""
        return self.rounds * alpha_s + self.bytes * beta_s_per_byte \
            + self.reduced_bytes * gamma_s_per_byte


def check_p(p: int) -> int:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise UsageError(f"number of ranks must be a positive integer, not {p!r}")
    return int(p)


def log2_ceil(p: int) -> int:
    """Rounds of a binomial tree over ``p`` ranks."""
    return (p - 1).bit_length()


def nchunks(nbytes: float, chunk_bytes: Optional[int]) -> int:
    if chunk_bytes is None or nbytes <= chunk_bytes:
        return 1 if nbytes else 0
    return math.ceil(nbytes / chunk_bytes)


# ---------------------------------------------------------------- entry points
# Every algorithm of a collective checks its arguments the same way; each module
# supplies only ``run`` on checked flat buffers and gets its public function here.
def allreduce_entry(run: Callable) -> Callable:
    """The public ``allreduce(comm, sendbuf, recvbuf, op, *, reduce, chunk_bytes)`` around
    ``run``, and its ``bound`` form (same arguments), checked once for repeated calls."""
    def bound(comm: "Communicator", sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
              op: "str | ReduceOp" = "sum", *, reduce: Optional[Reducer] = None,
              chunk_bytes: Optional[int] = None) -> Callable[[], np.ndarray]:
        send = check_buf(comm, sendbuf, "allreduce's send buffer")
        rop = check_op(comm, op, sendbuf)
        kernel = check_reduce(reduce, rop)
        chunk = check_chunk(chunk_bytes, sendbuf.itemsize)
        recvbuf = check_recv(comm, sendbuf, recvbuf, sendbuf.size, "allreduce's receive buffer", True)
        recv = send if recvbuf is sendbuf else flat(recvbuf)    # in place: one view
        link, p = HostLink(comm), comm.size

        def call() -> np.ndarray:
            run(link, send, recv, kernel, chunk)
            rop.finish(recv, p)
            return recvbuf
        return call

    def allreduce(comm: "Communicator", sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
                  op: "str | ReduceOp" = "sum", *, reduce: Optional[Reducer] = None,
                  chunk_bytes: Optional[int] = None) -> np.ndarray:
        """Every rank's ``sendbuf`` reduced with ``op``, into every rank's ``recvbuf`` (returned).

        ``recvbuf is sendbuf`` reduces in place; ``recvbuf=None`` allocates it.
        ``reduce(a, b, out)`` is the reduction kernel (default: ``op``'s NumPy
        ufunc); ``chunk_bytes`` pipelines each reduce-scatter step in pieces of
        that many bytes.  ``avg`` divides by the number of ranks at the end.
        """
        if recvbuf is not None:
            check_buf(comm, sendbuf, "allreduce's send buffer")     # refused alike, before any message
            recvbuf = recv_or_part(comm, sendbuf, recvbuf, sendbuf.size, "allreduce's receive buffer",
                                   lambda scratch: bound(comm, sendbuf, scratch, op, reduce=reduce,
                                                         chunk_bytes=chunk_bytes)())
        return bound(comm, sendbuf, recvbuf, op, reduce=reduce, chunk_bytes=chunk_bytes)()
    allreduce.bound = bound            # type: ignore[attr-defined]
    return allreduce


def gather_entry(run: Callable) -> Callable:
    """The public ``gather(comm, sendbuf, recvbuf, root)`` around ``run``."""
    def gather(comm: "Communicator", sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
               root: int = 0) -> Optional[np.ndarray]:
        """Every rank's ``sendbuf`` concatenated in rank order into the root's ``recvbuf``.

        The root returns ``recvbuf`` (allocated when None), the others None.
        """
        send = check_buf(comm, sendbuf, "gather's send buffer")
        root = comm.check_root(root)
        if comm.rank != root:
            run(comm, send, None, root)
            return None
        recvbuf = recv_or_part(comm, sendbuf, recvbuf, sendbuf.size * comm.size, "gather's receive buffer",
                               lambda scratch: run(comm, send, scratch, root), in_place=False)
        run(comm, send, flat(recvbuf), root)
        return recvbuf
    return gather
