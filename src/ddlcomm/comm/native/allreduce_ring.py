"""Ring all-reduce: a reduce-scatter then an all-gather around a ring (Baidu, Gloo, NCCL).

The buffer is cut into p near-equal blocks (any count: uneven, smaller than
p, or zero).  In reduce-scatter step s (s = 0 … p-2) rank r sends block
r-s to rank r+1, receives block r-s-1 from rank r-1 and reduces it with its
own copy; after p-1 steps rank r holds the fully reduced block r+1.  In
all-gather step s it passes block r+1-s to the right and receives block r-s
from the left straight into the result.  Every rank sends and receives
2(p-1)/p of the buffer, the least any all-reduce can, in 2(p-1) rounds:

    time = 2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ

Each block is reduced once per rank, from ``sendbuf`` into ``recvbuf``, so
no initial copy of the input is made, in place or not.  With ``chunk_bytes``
each reduce-scatter step is pipelined: pieces are received into two
alternating buffers and piece k+1 is in flight while piece k is reduced.

Model: ``gloo/allreduce_ring.h`` (Gloo), Baidu's ``ring_allreduce``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import _common as c


def run(link: "c.HostLink", send: np.ndarray, recv: np.ndarray, reduce: c.Reducer,
        chunk: Optional[int]) -> None:
    """The algorithm on checked flat buffers (no finish step), moving data through ``link``
    (NumPy arrays over point-to-point, or device tensors: see ``_common.HostLink``)."""
    p, r = link.size, link.rank
    if p == 1 or len(send) == 0:
        if recv is not send:
            recv[:] = send
        return
    off = c.blocks(len(send), p)
    right, left = (r + 1) % p, (r - 1) % p
    # Reduce-scatter: step s sends block r-s (from sendbuf at s = 0, then the
    # block reduced in the step before) and reduces block r-s-1 into recvbuf.
    for s in range(p - 1):
        sb, rb = (r - s) % p, (r - s - 1) % p
        src = send if s == 0 else recv
        link.exchange_reduce(src[off[sb]:off[sb + 1]], right,
                          send[off[rb]:off[rb + 1]], recv[off[rb]:off[rb + 1]], left,
                          reduce, chunk)
    # All-gather: rank r now owns the reduced block r+1.
    for s in range(p - 1):
        sb, rb = (r + 1 - s) % p, (r - s) % p
        link.exchange(recv[off[sb]:off[sb + 1]], right, recv[off[rb]:off[rb + 1]], left)


allreduce = c.allreduce_entry(run)


def schedule(p: int, nbytes: float, chunk_bytes: Optional[int] = None) -> c.Schedule:
    """Critical-path cost of one call on ``p`` ranks and ``nbytes`` per rank.

    ``chunk_bytes`` adds one message latency per extra piece of each
    reduce-scatter step (its bandwidth term is unchanged).
    """
    p = c.check_p(p)
    if p == 1:
        return c.Schedule(0, 0.0, 0.0)
    block = nbytes / p
    per_step = max(1, c.nchunks(block, chunk_bytes))
    return c.Schedule(rounds=(p - 1) * per_step + (p - 1),
                      bytes=2 * (p - 1) * block, reduced_bytes=(p - 1) * block)
