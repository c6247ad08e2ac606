"""The Communicator interface every backend implements.

Buffer form: NumPy arrays in and out, no copies beyond what the backend needs.
A backend implements the ``_``-prefixed primitives; the public methods here
check the arguments once, and the object form (any picklable object) is built
on the buffer primitives in :mod:`ddlcomm.comm.objects`, so every backend gets
it, chunked so that objects above 2 GiB work everywhere.
"""
from __future__ import annotations

import abc
import functools
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from ..collectives import Collective, get_collective
from ..dtypes import DTYPES, OPS, ByNumpy, DType, ReduceOp, dtype_of, get_op
from ..errors import DdlcommError, UnsupportedError, UsageError
from . import buffers, objects
from .agree import agreed_alike, attempt
from .buffers import check_writable


class Request(Protocol):
    """A non-blocking send or receive in flight (from ``isend``/``irecv``)."""

    def wait(self) -> object:
        """Block until the operation is complete (its buffer may then be reused or read)."""


def rank_number(value: Any) -> int:
    """A rank given as anything but a plain int: a whole number (NumPy's too), never a bool."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise UsageError(f"a rank must be a whole number, got {value!r}")
    return value.__index__()


def rank_of(root: Any, size: int, what: str, role: str = "root") -> int:
    """``root`` as a rank of a ``what`` of ``size`` ranks (UsageError otherwise, naming the
    rank's ``role``: root, dest, source)."""
    if root.__class__ is not int:
        root = rank_number(root)
    if not 0 <= root < size:
        raise UsageError(f"{role} {root} is not a rank of this {what} (size {size})")
    return root


def _writable(buf: Any) -> bool:
    """Whether ``buf`` may be written (tensors always are)."""
    return not isinstance(buf, np.ndarray) or buf.flags.writeable


def _done() -> None:
    return None


def _true() -> bool:
    return True


class CollectiveRequest:
    """A non-blocking collective in flight (from :meth:`Communicator.iallreduce`).

    ``wait()`` blocks until it is complete, applies the op's finish (the
    division of ``avg``) once, and returns the receive buffer; ``test()``
    returns whether it is complete (finishing it if so) without blocking.
    """

    __slots__ = ("_wait", "_test", "_finish", "_sending", "buffer", "done")

    def __init__(self, wait: Callable[[], object], test: Callable[[], bool],
                 buffer: np.ndarray, finish: Optional[Callable[[], None]] = None,
                 sending: Any = None) -> None:
        self._wait, self._test, self._finish = wait, test, finish
        #: the send buffer, held until done: a temporary one (``iallreduce(x * 2)``) was freed
        #: and its memory reused while Open MPI still read it (mpi4py does not hold it)
        self._sending = sending
        self.buffer = buffer
        self.done = False

    def wait(self) -> np.ndarray:
        if not self.done:
            self._wait()
            self.done = True
            self._sending = None
            if self._finish is not None:
                self._finish()
        return self.buffer

    def test(self) -> bool:
        if not self.done and self._test():
            self.wait()
        return self.done


class RefusedRecv:
    """A non-blocking receive into a buffer this rank refused (read-only), posted into
    scratch memory instead: the message is taken, so that neither is its sender left
    waiting nor this rank's next receive matched by it; ``wait()`` (and a ``test()`` that
    finds it complete) then raises the refusal."""

    __slots__ = ("_request", "_scratch", "_refused")

    def __init__(self, request: Any, scratch: Any, refused: DdlcommError) -> None:
        self._request, self._scratch, self._refused = request, scratch, refused

    def wait(self) -> None:
        self._request.wait()
        raise self._refused

    def test(self) -> bool:
        if self._request.test():
            raise self._refused
        return False


#: What a closed communicator refuses: every call that would reach its backend.
CALLS = ("barrier", "send", "recv", "recv_any", "sendrecv", "isend", "irecv", "broadcast", "gather",
         "allgather", "reduce", "allreduce", "iallreduce", "reduce_scatter", "alltoall", "bind",
         "send_object", "recv_object", "broadcast_object", "gather_object", "allgather_object",
         "reduce_object", "allreduce_object", "reduce_scatter_object", "alltoall_object")


@functools.lru_cache(maxsize=None)
def _closed(cls: type) -> type:
    """``cls`` once closed: every call of :data:`CALLS` refused in one line (on MPI they
    raised AttributeError on None; on Gloo they ran on another communicator's group)."""
    def refuse(self, *args, **kwargs):
        raise UsageError(f"this {self.name} communicator is closed", "ddlcomm.init() a new one")

    def again(self) -> None:
        return None
    if getattr(cls, "_refuses_calls", False):      # closed again (a backend's close calls its base's)
        return cls
    return type(f"Closed{cls.__name__}", (cls,),
                {"_refuses_calls": True, "close": again, **{name: refuse for name in CALLS}})


class Communicator(abc.ABC):
    """A group of ranks that can run collectives together.

    Subclasses set ``name`` (the backend's registry name), ``rank``, ``size``
    and ``local_rank``, and implement the primitives below.
    """

    name: str = "?"
    rank: int
    size: int
    local_rank: int
    #: dtype names this backend can move and reduce (a backend narrows it).
    dtypes: tuple[str, ...] = tuple(DTYPES)
    #: collectives this backend cannot run, each with the reason (refused with it).
    unsupported: dict[str, str] = {}
    #: Where the buffers it is handed may live: ``"host"`` (NumPy arrays, any host
    #: memory kind, pinned included) and/or ``"device"`` (CUDA torch tensors).
    memories: tuple[str, ...] = (buffers.HOST,)
    #: The largest message tag the backend takes (MPI: its TAG_UB).
    max_tag: int = 2 ** 31 - 1
    #: Why this backend refuses device buffers, and how to move them instead.
    device_refusal: str = "it moves host memory only (use --path host-staged)"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._dtype_table = ByNumpy(cls.dtypes, lambda d: d)
        release = cls.__dict__.get("close")
        if release is not None and not getattr(cls, "_refuses_calls", False):
            @functools.wraps(release)
            def close(self) -> None:
                release(self)
                Communicator.close(self)
            cls.close = close

    # ------------------------------------------------------------ identity
    @property
    @abc.abstractmethod
    def library(self) -> str:
        """The communication library underneath, e.g. ``"Open MPI"``."""

    @property
    @abc.abstractmethod
    def library_version(self) -> str:
        """That library's version string, e.g. ``"5.0.11"``."""

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (used when one rank fails)."""
        raise SystemExit(code)

    def close(self) -> None:
        """Release the backend's resources; the communicator refuses calls afterwards (a
        backend's own ``close`` releases, then this one)."""
        self.__class__ = _closed(type(self))

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc_info) -> None:
        """``with ddlcomm.init(...) as comm:`` closes it at the end of the block."""
        self.close()

    # ------------------------------------------------------------ checks
    def check_buffer(self, array: np.ndarray) -> DType:
        """The array's DType if this backend can carry it and it is C-contiguous (checked
        on every call: keep it cheap); else a precise UsageError/UnsupportedError."""
        if array.__class__ is not np.ndarray and not isinstance(array, np.ndarray):
            return self._check_tensor(array)
        try:
            dtype = self._dtype_table[array.dtype]
        except KeyError:
            name = dtype_of(array).name          # raises for dtypes ddlcomm has no name for
            raise UnsupportedError(f"backend {self.name} cannot carry {name}",
                                   f"supported: {', '.join(self.dtypes)}") from None
        if not array.flags.c_contiguous:
            raise UsageError("buffers must be C-contiguous arrays", "pass np.ascontiguousarray(a)")
        return dtype

    def _check_tensor(self, tensor: Any) -> DType:
        """A torch tensor as a buffer: a CUDA one only where the backend takes device memory;
        a CPU one only where it takes host memory."""
        dtype = buffers.check_tensor(tensor)
        where = buffers.memory_of(tensor)
        if where not in self.memories:
            if where == buffers.DEVICE:
                raise UnsupportedError(f"backend {self.name} cannot take device (CUDA) buffers: "
                                       f"{self.device_refusal}")
            raise UnsupportedError(f"backend {self.name} takes device (CUDA) buffers only, "
                                   "not host tensors", "use --memory device")
        if dtype.name not in self.dtypes:
            raise UnsupportedError(f"backend {self.name} cannot carry {dtype.name}",
                                   f"supported: {', '.join(self.dtypes)}")
        return dtype

    def sync(self) -> None:
        """Wait until this rank's last call has really finished (a no-op on host backends).

        The timing loop calls it after every timed call: OSU's ``-d cuda``
        convention, each timed call ends with a stream synchronisation, since a
        GPU backend returns once the work is queued on a CUDA stream.
        """

    def point_facts(self) -> dict:
        """What this backend says about the point just measured (stored with it): e.g. the
        transport NCCL chose.  Empty on host backends."""
        return {}

    def check_op(self, op: str | ReduceOp, dtype: DType) -> ReduceOp:
        """The ReduceOp named by ``op``, refused where ``dtype`` cannot take it."""
        rop = OPS.get(op) if op.__class__ is str else None
        if rop is None:
            rop = get_op(op)
        if rop.floats_only and not dtype.is_float:
            rop.check_dtype(dtype)
        return rop

    def check_supported(self, collective: str) -> None:
        """Raise UnsupportedError if this backend cannot run ``collective``."""
        reason = self.unsupported.get(collective)
        if reason is not None:
            raise UnsupportedError(f"backend {self.name} cannot run {collective}: {reason}")

    def check_root(self, root: int, role: str = "root") -> int:
        """``root`` if it is a rank of this communicator (UsageError otherwise)."""
        return rank_of(root, self.size, "communicator", role)

    def check_tag(self, tag: Any) -> int:
        """``tag`` if it is a whole number from 0 to the backend's :attr:`max_tag` (MPI and
        Gloo answered a negative or huge one with their own errors)."""
        if tag.__class__ is not int and (isinstance(tag, bool) or not hasattr(tag, "__index__")):
            raise UsageError(f"a tag must be a whole number, got {tag!r}")
        if not 0 <= tag <= self.max_tag:
            raise UsageError(f"tag {tag} is outside 0..{self.max_tag}, the tags backend {self.name} takes")
        return int(tag)

    def _recv_or_part(self, recvbuf: Optional[np.ndarray], sendbuf: np.ndarray, count: int,
                      what: str, call: Callable[[np.ndarray, np.ndarray], None],
                      shaped: bool = False, in_place: bool = False) -> np.ndarray:
        """The checked receive buffer (a new one where None: of the send buffer's shape where
        ``shaped``, the result being one like it, else flat); where it is refused, ``call``
        (the collective from a send buffer into a receive buffer) runs into scratch memory
        first."""
        if recvbuf is None:
            return buffers.empty_like(sendbuf) if shaped else buffers.empty(count, sendbuf)
        try:
            return buffers.check_recv(recvbuf, sendbuf, count, what, self.check_buffer, in_place)
        except DdlcommError as refused:
            raise buffers.take_part(refused, lambda: call(sendbuf, buffers.empty(count, sendbuf))) from None

    def _send_anyway(self, refused: DdlcommError, sendbuf: np.ndarray,
                     call: Callable[[np.ndarray], None]) -> DdlcommError:
        """Where this rank's own send buffer is refused for its layout (not contiguous, a
        tensor that requires grad): ``call`` (the collective from a given send buffer) runs
        from a contiguous copy of it first; returns the refusal to raise.  (Called from an
        ``except``, so that the checks that pass build no closure.)"""
        return buffers.take_part(refused, lambda: call(buffers.contiguous(sendbuf)))

    def _block(self, count: int, what: str) -> int:
        if count % self.size:
            raise UsageError(f"{what}: {count} elements do not split evenly over {self.size} ranks")
        return count // self.size

    # ------------------------------------------------------------ buffer form
    def barrier(self) -> None:
        """Wait until every rank has called barrier."""
        self._barrier()

    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        """Send ``buf`` to rank ``dest`` (blocking)."""
        self.check_buffer(buf)
        self._send(buf, self.check_root(dest, "dest"), self.check_tag(tag))

    def recv(self, buf: np.ndarray, source: int, tag: int = 0) -> np.ndarray:
        """Receive into ``buf`` from rank ``source`` (blocking); returns ``buf``."""
        self.check_buffer(buf)
        source, tag = self.check_root(source, "source"), self.check_tag(tag)
        self._writable(buf, "recv's buffer", lambda scratch: self._recv(scratch, source, tag))
        self._recv(buf, source, tag)
        return buf

    def recv_any(self, buf: np.ndarray, tag: int = 0) -> int:
        """Receive into ``buf`` from whichever rank sends first; returns that rank.

        Blocks without spinning a core where the backend allows it.
        """
        self.check_buffer(buf)
        tag = self.check_tag(tag)
        try:
            buffers.check_writable(buf, "recv_any's buffer")
        except DdlcommError as refused:       # the message taken, its sender named
            source = self._recv_any(buffers.empty_like(buf), tag)
            raise type(refused)(f"{refused.args[0]} (rank {source}'s message was received into "
                                "scratch memory and dropped)", refused.hint) from None
        return self._recv_any(buf, tag)

    def _writable(self, buf: np.ndarray, what: str, call: Callable[[np.ndarray], Any]) -> None:
        """Refuse a read-only receive buffer (the backend would write into it: Gloo did, into
        a read-only mapping), after ``call`` (the receive into a given buffer) took the
        message into scratch memory: the sender is not left waiting, nor this rank's next
        receive matched by it."""
        try:
            buffers.check_writable(buf, what)
        except DdlcommError as refused:
            raise buffers.take_part(refused, lambda: call(buffers.empty_like(buf))) from None

    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int,
                 tag: int = 0) -> np.ndarray:
        """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source``; returns ``recvbuf``.

        Both happen at once, so two ranks that exchange with each other (or a
        ring of ranks that each send right and receive from the left) cannot
        deadlock, whatever the message size.  ``dest`` and ``source`` may differ.
        """
        self.check_buffer(sendbuf)
        self.check_buffer(recvbuf)
        dest, source, tag = self.check_root(dest, "dest"), self.check_root(source, "source"), self.check_tag(tag)
        self._writable(recvbuf, "sendrecv's receive buffer",
                       lambda scratch: self._sendrecv(sendbuf, dest, scratch, source, tag))
        self._sendrecv(sendbuf, dest, recvbuf, source, tag)
        return recvbuf

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> "Request":
        """Start sending ``buf`` to ``dest``; returns a request to ``wait()`` on.

        ``buf`` must stay unchanged until the request is waited for.  Messages
        between two ranks with one tag arrive in the order they were sent.
        """
        self.check_buffer(buf)
        return self._isend(buf, self.check_root(dest, "dest"), self.check_tag(tag))

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> "Request":
        """Start receiving into ``buf`` from ``source``; ``buf`` is filled once ``wait()`` returns.
        A read-only ``buf``: the message goes into scratch memory and ``wait()`` raises
        (:class:`RefusedRecv`)."""
        self.check_buffer(buf)
        source, tag = self.check_root(source, "source"), self.check_tag(tag)
        try:
            buffers.check_writable(buf, "irecv's buffer")
        except DdlcommError as refused:
            scratch = buffers.empty_like(buf)
            return RefusedRecv(self._irecv(scratch, source, tag), scratch, refused)
        return self._irecv(buf, source, tag)

    def broadcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Copy the root's ``buf`` into every rank's ``buf`` (in place; the root's may be
        read-only)."""
        root = self.check_root(root)
        if self.rank == root:
            try:
                self.check_buffer(buf)
            except DdlcommError as refused:
                raise self._send_anyway(refused, buf, lambda copy: self._broadcast(copy, root)) from None
            self._broadcast(buf if _writable(buf) else buffers.copy_of(buf), root)
            return buf
        try:
            self.check_buffer(buf)
            check_writable(buf, "broadcast's buffer")
        except DdlcommError as refused:
            raise buffers.take_part(refused, lambda: self._broadcast(
                buffers.empty(buffers.count(buf), buf), root)) from None
        self._broadcast(buf, root)
        return buf

    def gather(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
               root: int = 0) -> Optional[np.ndarray]:
        """Concatenate every rank's ``sendbuf`` in rank order at the root."""
        root = self.check_root(root)
        if self.rank != root:
            try:
                self.check_buffer(sendbuf)
            except DdlcommError as refused:
                raise self._send_anyway(refused, sendbuf, lambda copy: self._gather(copy, None, root)) from None
            self._gather(sendbuf, None, root)
            return None
        try:
            self.check_buffer(sendbuf)
        except DdlcommError as refused:
            raise self._send_anyway(refused, sendbuf, lambda copy: self._gather(
                copy, buffers.empty(buffers.count(copy) * self.size, copy), root)) from None
        n = buffers.count(sendbuf) * self.size
        recvbuf = self._recv_or_part(recvbuf, sendbuf, n, "gather's receive buffer",
                                     lambda send, scratch: self._gather(send, scratch, root))
        self._gather(sendbuf, recvbuf, root)
        return recvbuf

    def allgather(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None) -> np.ndarray:
        """Concatenate every rank's ``sendbuf`` in rank order on every rank."""
        try:
            self.check_buffer(sendbuf)
        except DdlcommError as refused:
            raise self._send_anyway(refused, sendbuf, lambda copy: self._allgather(
                copy, buffers.empty(buffers.count(copy) * self.size, copy))) from None
        n = buffers.count(sendbuf) * self.size
        recvbuf = self._recv_or_part(recvbuf, sendbuf, n, "allgather's receive buffer",
                                     self._allgather)
        self._allgather(sendbuf, recvbuf)
        return recvbuf

    def reduce(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
               op: str | ReduceOp = "sum", root: int = 0) -> Optional[np.ndarray]:
        """Reduce every rank's ``sendbuf`` into the root's ``recvbuf``.

        Pass ``recvbuf is sendbuf`` at the root to reduce in place.
        """
        root = self.check_root(root)
        try:
            dtype = self.check_buffer(sendbuf)
        except DdlcommError as refused:
            raise self._send_anyway(refused, sendbuf, lambda copy: self._reduce(
                copy, buffers.empty_like(copy) if self.rank == root else None, get_op(op), root)) from None
        rop = self.check_op(op, dtype)
        if self.rank == root:
            recvbuf = self._recv_or_part(recvbuf, sendbuf, buffers.count(sendbuf), "reduce's receive buffer",
                                         lambda send, scratch: self._reduce(send, scratch, rop, root),
                                         shaped=True, in_place=True)
        else:
            recvbuf = None
        self._reduce(sendbuf, recvbuf, rop, root)
        if recvbuf is not None:
            rop.finish(recvbuf, self.size)
        return recvbuf

    def _allreduce_args(self, what: str, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray],
                        op: str | ReduceOp) -> tuple[np.ndarray, ReduceOp]:
        """(recvbuf, op) of an all-reduce, checked: recvbuf allocated when None (where it is
        refused, this rank takes part with scratch memory first)."""
        if what == "iallreduce":
            def part(send: np.ndarray, scratch: np.ndarray) -> None:
                self._iallreduce(send, scratch, get_op(op))[0]()       # posted and waited for
        else:
            def part(send: np.ndarray, scratch: np.ndarray) -> None:
                self._allreduce(send, scratch, get_op(op))
        try:
            dtype = self.check_buffer(sendbuf)
        except DdlcommError as refused:
            raise self._send_anyway(refused, sendbuf, lambda copy: part(copy, buffers.empty_like(copy))) from None
        rop = self.check_op(op, dtype)
        return self._recv_or_part(recvbuf, sendbuf, buffers.count(sendbuf), f"{what}'s receive buffer",
                                  part, shaped=True, in_place=True), rop

    def allreduce(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
                  op: str | ReduceOp = "sum") -> np.ndarray:
        """Reduce every rank's ``sendbuf``; every rank gets the result.

        Pass ``recvbuf is sendbuf`` to reduce in place.
        """
        recvbuf, rop = self._allreduce_args("allreduce", sendbuf, recvbuf, op)
        self._allreduce(sendbuf, recvbuf, rop)
        if rop.divide_by_ranks:
            rop.finish(recvbuf, self.size)
        return recvbuf

    def iallreduce(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
                   op: str | ReduceOp = "sum") -> "CollectiveRequest":
        """Start an all-reduce and return at once; ``wait()`` on the request ends it.

        Same arguments as :meth:`allreduce` (``recvbuf is sendbuf``: in place).
        Neither buffer may be touched until ``wait()`` returns ``recvbuf``,
        which then holds the result (averaged for ``avg``).  ``test()`` asks
        whether it is done without blocking and, on backends that progress only
        inside calls (MPI without a progress thread), moves it along: call it
        now and then while computing to overlap communication with work.  Used
        from one thread (MPI runs at ``THREAD_FUNNELED``).
        """
        recvbuf, rop = self._allreduce_args("iallreduce", sendbuf, recvbuf, op)
        wait, test = self._iallreduce(sendbuf, recvbuf, rop)
        finish = functools.partial(rop.finish, recvbuf, self.size) if rop.divide_by_ranks else None
        return CollectiveRequest(wait, test, recvbuf, finish, sendbuf)

    def reduce_scatter(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
                       op: str | ReduceOp = "sum") -> np.ndarray:
        """Reduce ``sendbuf`` (p equal blocks); rank i gets the reduced block i."""
        try:
            dtype = self.check_buffer(sendbuf)
        except DdlcommError as refused:
            raise self._send_anyway(refused, sendbuf, lambda copy: self._reduce_scatter(
                copy, buffers.empty(buffers.count(copy) // self.size, copy), get_op(op))) from None
        rop = self.check_op(op, dtype)
        block = self._block(buffers.count(sendbuf), "reduce_scatter")
        recvbuf = self._recv_or_part(recvbuf, sendbuf, block, "reduce_scatter's receive buffer",
                                     lambda send, scratch: self._reduce_scatter(send, scratch, rop))
        self._reduce_scatter(sendbuf, recvbuf, rop)
        rop.finish(recvbuf, self.size)
        return recvbuf

    def alltoall(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None) -> np.ndarray:
        """Send block j of ``sendbuf`` to rank j; block i of ``recvbuf`` comes from rank i."""
        try:
            self.check_buffer(sendbuf)
        except DdlcommError as refused:
            raise self._send_anyway(refused, sendbuf, lambda copy: self._alltoall(
                copy, buffers.empty_like(copy))) from None
        n = buffers.count(sendbuf)
        self._block(n, "alltoall")
        recvbuf = self._recv_or_part(recvbuf, sendbuf, n, "alltoall's receive buffer",
                                     self._alltoall, shaped=True)
        self._alltoall(sendbuf, recvbuf)
        return recvbuf

    # ------------------------------------------------------------ bound calls
    def bind(self, collective: str, sendbuf: Optional[np.ndarray] = None,
             recvbuf: Optional[np.ndarray] = None, op: str | ReduceOp = "sum",
             root: int = 0) -> Callable[[], None]:
        """Check a buffer-form call once and return it ready to repeat on these buffers.

        Like MPI's persistent collectives: loops over fixed buffers (gradient
        buckets, benchmark iterations) pay the argument checks once, not per
        call.  ``recvbuf is sendbuf`` means in place (allreduce, reduce at the
        root); non-roots of rooted collectives may pass ``recvbuf=None``.
        Collective (one all-gather): where one rank's arguments are refused, or the
        ranks bind different messages (count, dtype, op, root), every rank raises
        alike (:func:`~ddlcomm.comm.agree.agreed`), none left waiting in the first call.
        """
        coll = get_collective(collective)
        self.check_supported(collective)
        if not coll.moves_data:
            return self._barrier
        checked, why = attempt(self._bind_checks, coll, sendbuf, recvbuf, op, root)
        agreed_alike(self, why, f"bind {collective}", checked and checked[-1], "one message",
                     "bind the same count, dtype, op and root on every rank")
        sendbuf, recvbuf, rop, root, _ = checked
        call = self._bind(coll, sendbuf, recvbuf, rop, root)
        if rop is None or not rop.divide_by_ranks or recvbuf is None:
            return call
        finish, size = rop.finish, self.size

        def call_and_finish() -> None:
            call()
            finish(recvbuf, size)
        return call_and_finish

    def _bind_checks(self, coll: Collective, sendbuf, recvbuf, op, root) -> tuple:
        """:meth:`bind`'s checks on this rank: (send, receive buffer or None, op, root, the
        message every rank must bind alike)."""
        dtype = self.check_buffer(sendbuf)
        rop = self.check_op(op, dtype) if coll.reduces else None
        root = self.check_root(root)
        n = buffers.count(sendbuf)
        if coll.divisible:
            self._block(n, coll.name)
        if coll.has_recvbuf(self.rank, root):
            buffers.check_recv(recvbuf, sendbuf, coll.recv_count(n, self.size),
                               f"{coll.name}'s receive buffer", self.check_buffer, coll.in_place_ok)
        else:
            recvbuf = None
        if coll.in_send and self.rank != root:          # broadcast: the result lands in it
            check_writable(sendbuf, f"{coll.name}'s buffer")
        said = (n, dtype.name, rop and rop.name, f"root {root}" if coll.rooted else None)
        return sendbuf, recvbuf, rop, root, said

    def _bind(self, coll: Collective, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray],
              op: Optional[ReduceOp], root: int) -> Callable[[], None]:
        """The checked call on fixed buffers; backends may pre-build more of it."""
        return functools.partial(getattr(self, "_" + coll.name),
                                 *coll.call_args(sendbuf, recvbuf, op, root))

    # ------------------------------------------------------------ object form
    def send_object(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send any picklable object to ``dest``."""
        objects.send(self, obj, self.check_root(dest, "dest"), self.check_tag(tag))

    def recv_object(self, source: int, tag: int = 0) -> Any:
        """Receive an object sent with :meth:`send_object`."""
        return objects.recv(self, self.check_root(source, "source"), self.check_tag(tag))

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Every rank returns the root's ``obj`` (others may pass None)."""
        return objects.broadcast(self, obj, self.check_root(root))

    def gather_object(self, obj: Any, root: int = 0) -> Optional[list]:
        """The root returns the list of every rank's ``obj``; others return None."""
        return objects.gather(self, obj, self.check_root(root))

    def allgather_object(self, obj: Any) -> list:
        """Every rank returns the list of every rank's ``obj``."""
        return objects.allgather(self, obj)

    def reduce_object(self, obj: Any, op: str | ReduceOp = "sum", root: int = 0) -> Any:
        """Fold every rank's ``obj`` with ``op`` in rank order; the root returns it."""
        return objects.reduce(self, obj, get_op(op), self.check_root(root))

    def allreduce_object(self, obj: Any, op: str | ReduceOp = "sum") -> Any:
        """Fold every rank's ``obj`` with ``op``; every rank returns it."""
        return objects.allreduce(self, obj, get_op(op))

    def reduce_scatter_object(self, objs: Sequence[Any], op: str | ReduceOp = "sum") -> Any:
        """``objs`` holds one object per rank; rank i returns the fold of everyone's ``objs[i]``."""
        return objects.reduce_scatter(self, self._per_rank(objs), get_op(op))

    def alltoall_object(self, objs: Sequence[Any]) -> list:
        """``objs[j]`` goes to rank j; returns the list of what each rank sent here."""
        return objects.alltoall(self, self._per_rank(objs))

    def _per_rank(self, objs: Sequence[Any]) -> Sequence[Any]:
        if len(objs) != self.size:
            raise UsageError(f"expected one object per rank ({self.size}), got {len(objs)}")
        return objs

    # ------------------------------------------------------------ primitives
    @abc.abstractmethod
    def _barrier(self) -> None: ...

    @abc.abstractmethod
    def _send(self, buf: np.ndarray, dest: int, tag: int) -> None: ...

    @abc.abstractmethod
    def _recv(self, buf: np.ndarray, source: int, tag: int) -> None: ...

    @abc.abstractmethod
    def _recv_any(self, buf: np.ndarray, tag: int) -> int: ...

    @abc.abstractmethod
    def _sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int,
                  tag: int) -> None:
        """Send and receive at once (never deadlocks against a peer doing the same)."""

    @abc.abstractmethod
    def _isend(self, buf: np.ndarray, dest: int, tag: int) -> "Request": ...

    @abc.abstractmethod
    def _irecv(self, buf: np.ndarray, source: int, tag: int) -> "Request": ...

    @abc.abstractmethod
    def _broadcast(self, buf: np.ndarray, root: int) -> None: ...

    @abc.abstractmethod
    def _gather(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray], root: int) -> None: ...

    @abc.abstractmethod
    def _allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None: ...

    @abc.abstractmethod
    def _reduce(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray], op: ReduceOp,
                root: int) -> None:
        """Reduce with ``op.ufunc`` only; the base class applies ``op.finish``."""

    @abc.abstractmethod
    def _allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> None:
        """In place when ``recvbuf is sendbuf``; ``op.finish`` is applied by the caller."""

    def _iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray,
                    op: ReduceOp) -> tuple[Callable[[], object], Callable[[], bool]]:
        """Start an all-reduce (``op.ufunc`` only); return its ``(wait, test)`` functions.

        This fallback runs the blocking ``_allreduce`` at once and returns a
        request that is already complete; backends with non-blocking
        collectives override it.
        """
        self._allreduce(sendbuf, recvbuf, op)
        return _done, _true

    @abc.abstractmethod
    def _reduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> None: ...

    @abc.abstractmethod
    def _alltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} rank {self.rank}/{self.size}>"

