"""Pipelined (chained) broadcast: the buffer flows in pieces along a chain of ranks.

Ranks are numbered relative to the root, v = (rank - root) mod p; rank v
receives each piece from v-1 and passes it on to v+1 while the next piece
arrives.  With m pieces of c bytes the last rank has everything after
(p - 2 + m) rounds of one piece each, so for large buffers the time tends to
n·β whatever p is, against ceil(log2 p)·n·β for the binomial tree:

    time = (p - 2 + m)·(α + c·β),   m = ceil(n / c)

The best piece size balances the two terms: c = sqrt(n·α / ((p - 2)·β)).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from . import _common as c

if TYPE_CHECKING:
    from ..base import Communicator

#: Piece size when the caller gives none (bytes).
DEFAULT_CHUNK_BYTES = 256 * 1024


def broadcast(comm: "Communicator", buf: np.ndarray, root: int = 0, *,
              chunk_bytes: Optional[int] = DEFAULT_CHUNK_BYTES) -> np.ndarray:
    """Copy the root's ``buf`` into every rank's ``buf`` (in place), in pieces of ``chunk_bytes``."""
    c.check_buf(comm, buf, "broadcast's buffer")
    chunk = c.check_chunk(DEFAULT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes,
                          buf.itemsize)
    flat, root = c.broadcast_or_part(comm, buf, root, lambda scratch, r: run(comm, scratch, r, chunk))
    run(comm, flat, root, chunk)
    return buf


def run(comm: "Communicator", buf: np.ndarray, root: int, chunk: int) -> None:
    p = comm.size
    if p == 1 or buf.size == 0:
        return
    v = (comm.rank - root) % p
    cuts = c.pieces(buf.size, chunk)
    nxt = (v + 1 + root) % p if v + 1 < p else None
    if v == 0:
        sends = [comm._isend(buf[lo:hi], nxt, c.TAG) for lo, hi in cuts]
    else:
        prev = (v - 1 + root) % p
        sends = []

        def post(k: int):
            lo, hi = cuts[k]
            return comm._irecv(buf[lo:hi], prev, c.TAG)

        req = post(0)
        for k, (lo, hi) in enumerate(cuts):
            ahead = post(k + 1) if k + 1 < len(cuts) else None   # two pieces in flight
            req.wait()
            if nxt is not None:
                sends.append(comm._isend(buf[lo:hi], nxt, c.TAG))
            req = ahead
    for req in sends:
        req.wait()


def schedule(p: int, nbytes: float, chunk_bytes: Optional[int] = DEFAULT_CHUNK_BYTES) -> c.Schedule:
    """Critical-path cost: (p - 2 + m) rounds of one piece, m pieces."""
    p = c.check_p(p)
    if p == 1 or nbytes == 0:
        return c.Schedule(0, 0.0)
    m = c.nchunks(nbytes, chunk_bytes)
    piece = nbytes / m
    rounds = p - 2 + m
    return c.Schedule(rounds, rounds * piece)
