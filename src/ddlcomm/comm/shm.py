"""The intra-node shared-memory path: one segment, every rank reduces its slice.

For ranks on one node: each rank copies its input into its slot of one POSIX
shared-memory segment; after a barrier, rank r reduces slice r of the result
straight from every rank's slot (the reduction kernel reads all p inputs and
writes once, no copy through the MPI library); after a second barrier, every
rank copies the whole result out.  Two result slots alternate between calls,
so a fast rank's next reduction never overwrites what a slow rank still
reads.  Per call a rank moves about 3 n bytes against the 2 (p-1)/p n each
way of a ring, and the p ranks reduce in parallel.

The segment is made once per bound call (the set-up that ``bind`` pays) and
freed with it.  Ranks on several nodes: see ``hierarchical``.
"""
from __future__ import annotations

import socket
import weakref
from typing import Callable, Optional

import numpy as np

from .. import memory
from ..dtypes import ReduceOp
from ..errors import UnsupportedError
from ..memory.shared import attach, segment_of


def same_node(comm) -> bool:
    """True when every rank of ``comm`` runs on this host (by hostname)."""
    return len(set(comm.allgather_object(socket.gethostname()))) == 1


def node_segment(comm, leader: int, nbytes: int):
    """A segment of ``nbytes`` shared by the ranks whose ``leader`` (a rank) creates it.

    Every rank of ``comm`` calls this (set-up time); the leaders create, the
    others attach by the name their leader all-gathers.
    """
    buf = name = None
    if comm.rank == leader:
        buf = memory.allocate("shared", max(1, nbytes))
        name = segment_of(buf.array(np.uint8, 1))[0]
    names = comm.allgather_object(name)
    if buf is None:
        buf = attach(names[leader])
    comm.barrier()                      # every rank has it mapped before anyone frees
    return buf


def slices(count: int, nranks: int) -> list[tuple[int, int]]:
    """Balanced contiguous ranges of ``count`` elements, one per rank (pure)."""
    base, extra = divmod(count, nranks)
    out, lo = [], 0
    for r in range(nranks):
        hi = lo + base + (1 if r < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def reduce_slice(reduce, parts, piece) -> None:
    """``piece`` = the fold of ``parts`` (one slice per rank) with ``reduce(a, b, out)``."""
    if len(parts) == 1:
        np.copyto(piece, parts[0])
        return
    reduce(parts[0], parts[1], piece)
    for other in parts[2:]:
        reduce(piece, other, piece)


def _zero_copy(comm, sendbuf, recvbuf, op, reduce, lo, hi):
    """Every rank's buffers already live in shared segments (``--memory shared``):
    reduce slice r straight from every rank's input into every rank's output.
    Slices are disjoint, so this is also right in place."""
    where = comm.allgather_object((segment_of(sendbuf), segment_of(recvbuf)))
    p, n, dtype = comm.size, sendbuf.size, sendbuf.dtype
    maps, sends, recvs = [], [], []
    for q, ((sname, soff), (rname, roff)) in enumerate(where):
        if q == comm.rank:
            sends.append(sendbuf)
            recvs.append(recvbuf)
            continue
        for name, off, out in ((sname, soff, sends), (rname, roff, recvs)):
            buf = attach(name)
            maps.append(buf)
            out.append(buf.array(np.uint8, off + n * dtype.itemsize)[off:].view(dtype))
    # Own slice first: in place, the output aliases it, and the fold must read it before writing.
    parts = [sends[comm.rank][lo:hi]] + [x[lo:hi] for q, x in enumerate(sends) if q != comm.rank]
    mine = recvbuf[lo:hi]
    others = [x[lo:hi] for q, x in enumerate(recvs) if q != comm.rank]
    barrier = comm.barrier

    def call() -> None:
        barrier()                                  # every input is final
        reduce_slice(reduce, parts, mine)
        op.finish(mine, p)
        for out in others:
            np.copyto(out, mine)
        barrier()                                  # every output is complete

    def close() -> None:
        for buf in maps:
            buf.free()
    weakref.finalize(call, close)
    return call


def bind_allreduce(comm, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   reduce: Optional[Callable] = None) -> Callable[[], None]:
    """Set up the segment and return the all-reduce on these buffers.

    With every rank's buffers in shared memory (``--memory shared``) no copy is
    made at all; otherwise inputs are copied into one node segment and the
    result copied out.
    """
    if not same_node(comm):
        raise UnsupportedError("the shm all-reduce needs every rank on one node",
                               "use --algorithm hierarchical (or ring) across nodes")
    reduce = reduce or (lambda a, b, out: op.ufunc(a, b, out=out))
    p, n, dtype = comm.size, sendbuf.size, sendbuf.dtype
    lo, hi = slices(n, p)[comm.rank]
    shared = np.array([segment_of(sendbuf) is not None and segment_of(recvbuf) is not None], np.int32)
    comm.allreduce(shared, shared, op="min")
    if shared[0] and n:
        return _zero_copy(comm, sendbuf, recvbuf, op, reduce, lo, hi)
    seg = node_segment(comm, 0, (p + 2) * n * dtype.itemsize)
    flat = seg.array(dtype, (p + 2) * n)
    inputs = [flat[r * n:(r + 1) * n] for r in range(p)]
    results = [flat[(p + k) * n:(p + k + 1) * n] for k in (0, 1)]
    mine = inputs[comm.rank]
    parts = [x[lo:hi] for x in inputs]
    barrier = comm.barrier
    state = {"k": 0}

    def call() -> None:
        out = results[state["k"]]
        state["k"] ^= 1
        np.copyto(mine, sendbuf)
        barrier()
        reduce_slice(reduce, parts, out[lo:hi])
        op.finish(out[lo:hi], p)
        barrier()
        np.copyto(recvbuf, out)

    weakref.finalize(call, seg.free)
    return call
