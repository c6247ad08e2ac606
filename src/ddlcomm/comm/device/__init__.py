"""ddlcomm's own collectives on device buffers (torch tensors): Awan et al.'s recipe.

The ring, rhd and binomial algorithms are the very ``run`` functions of
:mod:`ddlcomm.comm.native`, handed a :class:`~.link.DeviceLink` instead of the
host link: blocks move by a transport per pair of ranks (``ipc`` on one node,
``staged`` through pinned host memory across nodes: :mod:`.transports`), and
reductions run where the buffers are, by a kernel chosen by the buffers' kind
(:func:`ddlcomm.kernels.device.dispatching_reducer`: torch or CuPy on the GPU),
whose kind look-ups go through the buffer-kind cache or ask the driver every
time (``kind_cache``).  ``shm`` is the device shm all-reduce
(:mod:`.allreduce_shm`).  The backend never sees a device pointer.

:func:`bind` returns a :class:`~ddlcomm.comm.bound.BoundCall`: call it to run the collective;
``facts()`` says what ran (reduction kernel, transports, kind look-ups).
CPU tensors work everywhere here (torch's CPU kernel reduces them; ``ipc``
then needs buffers from :func:`.peers.shared_tensor`): tests use them to run
the algorithms' plumbing without a GPU.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

from ...collectives import get_collective
from ...dtypes import ReduceOp
from ...errors import UsageError
from ...kernels.device import DEVICE_KERNELS, device_reducer, dispatching_reducer
from ...kernels import kinds
from ...lazy import load, torch_module
from .. import buffers
from ..agree import agreed, attempt
from ..bound import BoundCall
from ..nodes import node_name
from .link import DeviceLink

_NATIVE = "ddlcomm.comm.native"
#: (collective, algorithm) -> the native ``run`` that takes a link.
ALGORITHMS = {
    ("allreduce", "ring"): f"{_NATIVE}.allreduce_ring:run",
    ("allreduce", "rhd"): f"{_NATIVE}.allreduce_rhd:run",
    ("broadcast", "binomial"): f"{_NATIVE}.bcast_binomial:run",
    ("reduce", "binomial"): f"{_NATIVE}.reduce_binomial:run",
}
#: Collectives bound here by their own module: (collective, algorithm) -> "module:bind".
OWN = {("allreduce", "shm"): "ddlcomm.comm.device.allreduce_shm:bind"}


def algorithms_for(collective: str) -> list[str]:
    """The algorithms that run on device buffers for ``collective``."""
    return [alg for coll, alg in (*ALGORITHMS, *OWN) if coll == collective]


def device_id(t: Any) -> str:
    """What names ``t``'s device alike in every process: a GPU's uuid (ranks may number the
    GPUs each its own way, by CUDA_VISIBLE_DEVICES), else the device."""
    if t.is_cuda:
        return str(torch_module().cuda.get_device_properties(t.device).uuid)
    return str(t.device)


#: one_gpu's answer per communicator: its ranks keep their devices, so it is asked once.
_ONE_GPU: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def one_gpu(comm: Any) -> bool:
    """True when every rank of ``comm`` works on one device of one node (this rank's current
    CUDA device; CPU tensors standing in: the node alone): the device shm all-reduce's need.
    Collective the first time for ``comm`` (every rank asks in the same order), then cached."""
    if comm not in _ONE_GPU:
        torch = torch_module()
        mine = device_id(torch.empty(0, device="cuda")) if torch.cuda.is_available() else "cpu"
        _ONE_GPU[comm] = len(set(comm.allgather_object((node_name(), mine)))) == 1
    return _ONE_GPU[comm]


def check_tensors(comm: Any, sendbuf: Any, recvbuf: Optional[Any]) -> tuple[Any, Optional[Any]]:
    """Flat views of ``sendbuf`` and ``recvbuf`` (the same view when in place), checked:
    contiguous tensors of one dtype and device, apart unless the same tensor."""
    for buf in (sendbuf, recvbuf):
        if buf is not None:
            buffers.check_tensor(buf)
    if recvbuf is not None and (recvbuf.dtype != sendbuf.dtype or recvbuf.device != sendbuf.device):
        raise UsageError(f"the receive buffer is {recvbuf.dtype} on {recvbuf.device}, the send "
                         f"buffer {sendbuf.dtype} on {sendbuf.device}: they must match")
    if recvbuf is not None and recvbuf.numel() != sendbuf.numel():
        raise UsageError(f"the receive buffer has {recvbuf.numel()} elements, the send buffer "
                         f"{sendbuf.numel()}: they must match")
    if recvbuf is not None:
        buffers.check_apart(recvbuf, sendbuf, "the receive buffer")
    send = sendbuf.view(-1)
    recv = None if recvbuf is None else send if recvbuf is sendbuf else recvbuf.view(-1)
    return send, recv


def checked(comm: Any, collective: str, sendbuf: Any, recvbuf: Optional[Any],
            op: Optional[ReduceOp], root: int) -> tuple[Any, Optional[Any], int]:
    """This rank's arguments of a device ``collective``, checked (:func:`check_tensors`, the
    root, the op against the dtype, a receive buffer where the result lands): the flat
    send and receive views and the root."""
    send, recv = check_tensors(comm, sendbuf, recvbuf)
    root = comm.check_root(root)
    if get_collective(collective).reduces:
        if op is None:
            raise UsageError(f"a device {collective} needs an op")
        comm.check_op(op, buffers.tensor_dtype(send))
    if recv is None and (collective == "allreduce" or collective == "reduce" and comm.rank == root):
        raise UsageError(f"a device {collective} needs its receive buffer"
                         + (" at the root" if collective == "reduce" else ""),
                         "pass recvbuf (recvbuf=sendbuf works in place)")
    return send, recv, root


def bind(comm: Any, collective: str, algorithm: str, sendbuf: Any, recvbuf: Optional[Any],
         op: Optional[ReduceOp], root: int = 0, *, kernel: str = "auto", kind_cache: bool = True,
         transport: str = "auto", mapper: str = "auto") -> BoundCall:
    """``collective`` by ddlcomm's ``algorithm`` on device tensors (collective: every rank
    binds).  The arguments are checked on every rank and agreed (:func:`checked`): where one
    rank's are refused, every rank raises, none left waiting in the set-up."""
    target = ALGORITHMS.get((collective, algorithm))
    if target is None and (collective, algorithm) not in OWN:
        raise UsageError(f"{collective} by {algorithm} does not run on device buffers",
                         f"on device buffers {collective} has: "
                         f"{', '.join(algorithms_for(collective)) or 'the library only'}")
    mine, why = attempt(checked, comm, collective, sendbuf, recvbuf, op, root)
    agreed(comm, why, f"device {collective}")
    if (collective, algorithm) in OWN:
        return load(OWN[collective, algorithm])(comm, sendbuf, recvbuf, op, kernel=kernel,
                                                mapper=mapper, kind_cache=kind_cache)
    send, recv, root = mine
    link = DeviceLink(comm, send, transport, mapper)
    lookup = kinds.lookup(kind_cache)
    coll = get_collective(collective)
    reduce = dispatching_reducer(_op_name(op), send.dtype, lookup, kernel) if coll.reduces else None
    if reduce is not None and kernel in DEVICE_KERNELS and getattr(send, "is_cuda", False):
        # the reducer picks its kernel at the first reduction, on the ranks that reduce: a
        # kernel that cannot run is refused here instead, on every rank alike
        device_reducer(_op_name(op), send.dtype, kernel)
    args = _run_args(coll.name, send, recv, root, reduce)
    run = load(target)

    settle = tail_sync(send, comm.size, op)
    calls = [0]

    def call() -> None:
        calls[0] += 1
        run(link, *args)
        if op is not None and (collective == "allreduce" or comm.rank == root):
            op.finish(recv, comm.size)
        settle()

    def facts() -> dict:
        out = {"kind_cache": "on" if kind_cache else "off"}
        if link.used:                                   # ranks that moved nothing say nothing
            out["device_transport"] = link.transports_used()
        if reduce is not None and reduce.label is not None:
            out["kernel"] = reduce.label
        return {**out, **kinds.lookup_facts(lookup, calls[0], send)}
    return BoundCall(call, facts)


def ends_queued(size: int, op: Optional[ReduceOp]) -> bool:
    """Whether a call's last device work is queued unwaited (pure): alone (``size`` 1) it is
    a device-to-device copy, and ``avg``'s division follows the last move; every other call
    ends in a move or a reduction that the transports and reducers wait for."""
    return size == 1 or (op is not None and op.divide_by_ranks)


def tail_sync(like: Any, size: int, op: Optional[ReduceOp]) -> Callable[[], None]:
    """What ends a call on ``like``'s device so that it is done on return (a timed call must
    be: the harness' sync is the host backend's no-op): the current CUDA stream's
    synchronisation where :func:`ends_queued`, else nothing."""
    if not (getattr(like, "is_cuda", False) and ends_queued(size, op)):
        return _nothing
    # torch is optional: a CUDA tensor means it is there
    import torch
    return torch.cuda.current_stream(like.device).synchronize


def _nothing() -> None:
    return None


def _op_name(op: Optional[ReduceOp]) -> str:
    if op is None:
        return "sum"
    return "sum" if op.divide_by_ranks else op.name


def _run_args(collective: str, send: Any, recv: Optional[Any], root: int,
              reduce: Optional[Callable]) -> tuple:
    """The native ``run``'s arguments after the link."""
    if collective == "allreduce":
        return (send, recv, reduce, None)
    if collective == "reduce":
        return (send, recv, root, reduce, None)
    return (send, root)                                   # broadcast


__all__ = ["ALGORITHMS", "OWN", "algorithms_for", "bind", "check_tensors", "ends_queued",
           "tail_sync"]
