"""Recursive halving and doubling all-reduce (Rabenseifner; MPICH's choice for large messages).

On a power-of-two number of ranks: a reduce-scatter by recursive vector
halving — in step k (distance d = p/2, p/4, … 1) each rank exchanges half of
the part it is still responsible for with the rank d away and reduces the
half it keeps — then an all-gather by recursive doubling, the same steps in
reverse (d = 1, 2, … p/2), each doubling the part a rank holds.  After the
halving rank i holds block i of the result.

    time = 2·log2(p)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ

Other rank counts (the standard fold, as in MPICH and Gloo): with
p' = 2^floor(log2 p) and r = p - p', each of the first 2r ranks with an even
number sends its whole buffer to the next (odd) rank, which reduces it; the
p' remaining ranks run the power-of-two algorithm; at the end each odd rank
sends the result back to its even partner.  That adds 2 rounds, 2n·β (the
buffer there and the result back) and n·γ (:func:`schedule`).

The first exchange reads ``sendbuf`` and reduces into ``recvbuf``, so there is
no initial copy, in place or not.  ``chunk_bytes`` pipelines the reductions
(the fold and every halving step) in pieces, as in the ring.

Model: ``gloo/allreduce_halving_doubling.h``; MPICH ``allreduce_intra_reduce_scatter_allgather``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import _common as c


def run(link: "c.HostLink", send: np.ndarray, recv: np.ndarray, reduce: c.Reducer,
        chunk: Optional[int]) -> None:
    """The algorithm on checked flat buffers (no finish step), moving data through ``link``."""
    p, r, n = link.size, link.rank, len(send)
    if p == 1 or n == 0:
        if recv is not send:
            recv[:] = send
        return
    core = c.floor_pow2(p)
    rem = p - core
    src = send                      # where this rank's current partial result lives

    # Fold: even ranks below 2*rem hand their data to the next rank and wait.
    if r < 2 * rem:
        if r % 2 == 0:
            link.send(send, r + 1, chunk)
            link.recv(recv, r + 1, None)
            return
        link.exchange_reduce(send[:0], r, send, recv, r - 1, reduce, chunk)
        src = recv
        me = r // 2
    else:
        me = r - rem

    def real(v: int) -> int:                   # core rank -> communicator rank
        return 2 * v + 1 if v < rem else v + rem

    off = c.blocks(n, core)
    lo, hi = 0, core                           # blocks this rank is responsible for
    d = core // 2
    while d:                                   # reduce-scatter: halve the part, distance halving
        peer = real(me ^ d)
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if me & d else ((lo, mid), (mid, hi))
        k0, k1 = off[keep[0]], off[keep[1]]
        link.exchange_reduce(src[off[give[0]]:off[give[1]]], peer,
                          src[k0:k1], recv[k0:k1], peer, reduce, chunk)
        src = recv
        lo, hi = keep
        d //= 2
    d = 1
    while d < core:                            # all-gather: double the part, distance doubling
        peer = real(me ^ d)
        size = hi - lo
        theirs = (lo - size, lo) if me & d else (hi, hi + size)
        link.exchange(recv[off[lo]:off[hi]], peer, recv[off[theirs[0]]:off[theirs[1]]], peer)
        lo, hi = min(lo, theirs[0]), max(hi, theirs[1])
        d *= 2
    if r < 2 * rem:                            # odd folded rank: result back to its partner
        link.send(recv, r - 1, None)


allreduce = c.allreduce_entry(run)


def schedule(p: int, nbytes: float, chunk_bytes: Optional[int] = None) -> c.Schedule:
    """Critical-path cost of one call on ``p`` ranks and ``nbytes`` per rank (chunking ignored)."""
    p = c.check_p(p)
    core = c.floor_pow2(p)
    steps_core = 2 * (core.bit_length() - 1)
    moved = 2 * (core - 1) / core * nbytes
    reduced = (core - 1) / core * nbytes
    if core != p:
        return c.Schedule(steps_core + 2, moved + 2 * nbytes, reduced + nbytes)
    return c.Schedule(steps_core, moved, reduced)
