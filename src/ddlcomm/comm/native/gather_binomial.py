"""Binomial-tree gather (MPICH's choice for short messages).

Ranks are numbered relative to the root, v = (rank - root) mod p.  Rank v
collects the buffers of ranks v … v + 2^k - 1 (its subtree; 2^k its lowest
set bit, clipped at p) from its children v + 2^j, j < k, then sends them, in
order, to its parent v - 2^k in one message.  Few rounds, at the price of
inner ranks forwarding their subtrees:

    time = ceil(log2 p)·α + (p-1)·n·β

The root receives each child's subtree straight into ``recvbuf``, except the
one subtree that wraps past the last rank (only when root != 0), which goes
through a scratch buffer.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from . import _common as c

if TYPE_CHECKING:
    from ..base import Communicator


def run(comm: "Communicator", send: np.ndarray, recv: Optional[np.ndarray], root: int) -> None:
    p, n, r = comm.size, send.size, comm.rank
    if n == 0:
        return
    v = (r - root) % p
    low = v & -v if v else p                   # subtree: v … v + low - 1 (clipped at p)
    span = min(low, p - v)
    if v != 0 and span == 1:                   # a leaf
        comm._send(send, (v - low + root) % p, c.TAG)
        return
    if v == 0:
        recv[r * n:(r + 1) * n] = send
        buf = None
    else:
        buf = c.scratch(comm, send.dtype, span * n)
        buf[:n] = send
    reqs, wrapped = [], None
    mask = 1
    while mask < low and v + mask < p:         # children, each with its whole subtree
        child = v + mask
        cnt = min(mask, p - child)
        src = (child + root) % p
        if buf is not None:
            reqs.append(comm._irecv(buf[mask * n:(mask + cnt) * n], src, c.TAG))
        elif src + cnt <= p:                   # root: the subtree's ranks are contiguous
            reqs.append(comm._irecv(recv[src * n:(src + cnt) * n], src, c.TAG))
        else:                                  # root: the subtree wraps past rank p-1
            wrapped = (c.scratch(comm, send.dtype, cnt * n), src)
            reqs.append(comm._irecv(wrapped[0], src, c.TAG))
        mask <<= 1
    for req in reqs:
        req.wait()
    if buf is not None:
        comm._send(buf, (v - low + root) % p, c.TAG)
    elif wrapped is not None:
        tmp, src = wrapped
        head = (p - src) * n                   # ranks src … p-1, then 0 …
        recv[src * n:] = tmp[:head]
        recv[:tmp.size - head] = tmp[head:]


gather = c.gather_entry(run)


def schedule(p: int, nbytes: float) -> c.Schedule:
    """Cost at the root: ceil(log2 p) rounds, (p-1)·n bytes in."""
    p = c.check_p(p)
    return c.Schedule(c.log2_ceil(p), (p - 1) * nbytes)


def subtrees(p: int) -> list[int]:
    """Ranks under each of the root's children, in the order it takes them (child 2^k
    holds min(2^k, p - 2^k))."""
    p = c.check_p(p)
    return [min(1 << k, p - (1 << k)) for k in range((p - 1).bit_length())]
