"""The device shm all-reduce: ranks on one GPU reduce through each other's memory.

At bind every rank exports its input and output buffers through the peer
mapper (CUDA IPC) and maps every peer's, once.  A call then, by slices:

1. waits until its input is on the device, and meets the others (barrier);
2. reduces its own slice (:func:`ddlcomm.comm.shm.slices`) of every rank's
   input into its own output in one pass that reads all p inputs from GPU
   memory (:func:`ddlcomm.kernels.device.many_reducer`: one CuPy kernel, or
   torch's adds, waited for once); barrier;
3. all-gathers: copies every peer's reduced slice from that peer's output
   into its own (device-to-device); barrier, so that nobody writes a buffer
   another rank still reads.

or, out of place and up to :data:`WHOLE_MAX_BYTES` read in all, whole: step 1,
then every rank reduces the whole message from every input into its output in
one pass; barrier.  That reads p·n bytes a rank where slices read about 2n,
but waits for the GPU once after step 1 where slices wait twice.  Where
processes share a GPU without MPS each wait costs about a time slice
(0.55-0.6 ms with 4 ranks on the H200, docs/benchmarks.md "The H200 node"):
at 4 ranks and 16 MiB a pass over the extra 2·4·16 MiB takes some 30 µs of
its memory bandwidth.  In place it would wait twice too (its result must wait
in scratch memory until the others have read its input, and be copied over
it), so in place always goes by slices.

The backend carries only the barriers.  In place (``recvbuf is sendbuf``)
by slices is safe: step 2 writes only this rank's slice, which no other rank
reads in that step.  CPU tensors from :func:`.peers.shared_tensor` run the
same steps (the ``posix-shm`` mapper): tests of the plumbing without a GPU.

Ranks on several GPUs (or nodes) are refused at bind: one kernel reads every
input where it lies, so every input must lie on its device.  ring and rhd
serve them, moving blocks between devices.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ...dtypes import ReduceOp
from ...errors import UnsupportedError, UsageError, first_line
from ...kernels.device import many_reducer
from ..nodes import node_name
from ..shm import slices
from ...kernels import kinds
from ..agree import agreed, attempt
from ..buffers import tensor_dtype
from ..bound import BoundCall
from . import check_tensors, device_id, tail_sync
from .peers import mapper_for, offset_bytes, whole


#: Bytes read in all (message x ranks) up to which each rank reduces the whole message
#: (one wait for the GPU) rather than its slice and then the all-gather (two), out of
#: place; module-level
#: so that tests can run either way.  64 MiB: an estimate from the H200's time slices
#: and memory bandwidth (module docstring), not yet measured both ways there.
WHOLE_MAX_BYTES = 64 << 20


#: What a rank whose CUDA IPC export or mapping the driver refused may use instead.
IPC_REFUSED_HINT = "use ring or rhd (their staged transport copies through host memory)"


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def map_peers(comm: Any, mapper: Any, mine: Any) -> list[Any]:
    """Every rank's buffer like ``mine`` (this rank's own for itself), mapped here; where
    one rank cannot map a peer's (CUDA IPC refused: another IPC namespace, a GPU in
    exclusive-process mode), every rank raises, none is left in the first call's barrier."""
    blob, why = attempt(_export, mapper, mine)
    said = agreed(comm, why, "the device shm all-reduce's export of the ranks' buffers", blob)
    out, why = attempt(open_peers, comm.rank, mapper, mine, said)
    agreed(comm, why, "the device shm all-reduce's mapping of the other ranks' buffers")
    return out


def _export(mapper: Any, mine: Any) -> tuple:
    """(handle, offset, bytes) of ``mine`` for the others; the driver's refusal (RuntimeError)
    as UnsupportedError."""
    try:
        return mapper.export(whole(mine)), offset_bytes(mine), _nbytes(mine)
    except RuntimeError as exc:
        raise UnsupportedError(f"cannot export this rank's buffer: {first_line(exc)}",
                               IPC_REFUSED_HINT) from None


def open_peers(rank: int, mapper: Any, mine: Any, said: list) -> list[Any]:
    """``said`` (every rank's (handle, offset, bytes)) opened through ``mapper``, ``mine``
    for ``rank`` itself; a mapping the driver refuses (RuntimeError) is UnsupportedError."""
    out = []
    for peer, (handle, offset, nbytes) in enumerate(said):
        if peer == rank:
            out.append(mine)
            continue
        try:
            out.append(mapper.open(handle)[offset:offset + nbytes].view(mine.dtype))
        except RuntimeError as exc:
            raise UnsupportedError(f"cannot map rank {peer}'s buffer: {first_line(exc)}",
                                   IPC_REFUSED_HINT) from None
    return out


def check_alike(comm: Any, send: Any, in_place: bool) -> None:
    """Refuse (on every rank alike) unless every rank's buffers are on one device of one
    node (the reducing kernel reads every peer's input in place, which it can only do on
    the device those inputs are on), every rank works in place or every rank does not,
    and every rank's buffer has one size and dtype (each runs different steps)."""
    said = comm.allgather_object((node_name(), device_id(send), str(send.device),
                                  (send.numel(), tensor_dtype(send).name), in_place))
    if len({(node, device) for node, device, *_ in said}) > 1:
        seen = ", ".join(sorted({f"{shown} of {node}" for node, _, shown, *_ in said}))
        raise UnsupportedError(f"the device shm all-reduce needs every rank on one GPU; the "
                               f"buffers are on {seen}",
                               "use ring or rhd, which move blocks between devices")
    if len({shape for *_, shape, _ in said}) > 1:
        seen = ", ".join(f"rank {rank}: {n} {dtype}" for rank, (*_, (n, dtype), _) in enumerate(said))
        raise UsageError(f"the device shm all-reduce needs one size and dtype on every rank ({seen})",
                         "bind the same count and dtype on every rank")
    if len({alike for *_, alike in said}) > 1:
        ranks = [rank for rank, (*_, alike) in enumerate(said) if alike]
        raise UsageError(f"the device shm all-reduce works in place on ranks {ranks} only",
                         "pass recvbuf=sendbuf on every rank, or on none")


def bind(comm: Any, sendbuf: Any, recvbuf: Optional[Any], op: Optional[ReduceOp], *,
         kernel: str = "auto", mapper: str = "auto", kind_cache: bool = True) -> BoundCall:
    """The device shm all-reduce bound to these tensors (collective: every rank binds);
    each call looks its buffer's kind up (``kind_cache``: once per buffer, else the driver
    every call), as ring and rhd do before they reduce.  Called by
    :func:`ddlcomm.comm.device.bind`, which checked the arguments on every rank alike."""
    send, recv = check_tensors(comm, sendbuf, recvbuf)     # device.bind checked them on every rank
    if comm.size > 1:
        check_alike(comm, send, recv is send)
    peers = mapper_for(send, mapper)
    name = "sum" if op.divide_by_ranks else op.name
    # a kernel asked for (cupy) may be refused on one rank only (its CuPy): said on every rank
    reduce, why = attempt(many_reducer, name, send.dtype, bool(send.is_cuda), kernel)
    agreed(comm, why, "the device shm all-reduce's kernel")
    p = comm.size
    whole = p > 1 and recv is not send and _nbytes(send) * p <= WHOLE_MAX_BYTES
    settle = tail_sync(send, p, op)
    lookup = kinds.lookup(kind_cache)
    if p == 1:
        def steps() -> None:
            if recv is not send:
                recv.copy_(send)
            op.finish(recv, 1)
            settle()
    else:
        steps = (_whole if whole else _by_slices)(comm, peers, send, recv, op, reduce, settle)

    calls = [0]

    def call() -> None:
        calls[0] += 1
        lookup(recv)
        steps()

    def facts() -> dict:
        out = {"device_transport": "ipc" if p > 1 else "none", "kernel": reduce.label,
               "kind_cache": "on" if kind_cache else "off",
               "shm_reads": "none" if p == 1 else "whole" if whole else "slices"}
        return {**out, **kinds.lookup_facts(lookup, calls[0], recv)}
    return BoundCall(call, facts)


def _whole(comm: Any, peers: Any, send: Any, recv: Any, op: ReduceOp, reduce: Callable,
           settle: Callable) -> Callable[[], None]:
    """A call's steps where every rank reduces the whole message from every input into its
    own output (out of place: no rank writes what another reads)."""
    inputs = map_peers(comm, peers, send)

    def steps() -> None:
        peers.sync()
        comm.barrier()
        if len(send):
            reduce(inputs, recv)
        comm.barrier()              # every rank has read every input
        op.finish(recv, comm.size)
        settle()                    # avg's division done on return
    return steps


def _by_slices(comm: Any, peers: Any, send: Any, recv: Any, op: ReduceOp, reduce: Callable,
               settle: Callable) -> Callable[[], None]:
    """A call's steps where every rank reduces its slice, then all-gathers the others'."""
    p, r = comm.size, comm.rank
    parts = slices(len(send), p)
    lo, hi = parts[r]
    inputs = [t[lo:hi] for t in map_peers(comm, peers, send)]
    outputs = map_peers(comm, peers, recv)

    def steps() -> None:
        peers.sync()
        comm.barrier()
        if hi > lo:
            reduce(inputs, recv[lo:hi])
        peers.sync()
        comm.barrier()
        for q, (qlo, qhi) in enumerate(parts):
            if q != r and qhi > qlo:
                recv[qlo:qhi].copy_(outputs[q][qlo:qhi])
        peers.sync()
        comm.barrier()
        op.finish(recv, p)
        settle()
    return steps
