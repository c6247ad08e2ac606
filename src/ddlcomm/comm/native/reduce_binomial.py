"""Binomial-tree reduce to any root (MPICH's choice for short messages).

Ranks are numbered relative to the root, v = (rank - root) mod p.  In round
k rank v, if bit k is clear, receives the partial result of v + 2^k (when
that rank exists) and reduces it into its own; if bit k is set, it sends its
partial result to v - 2^k and is done.  The root holds the result after
ceil(log2 p) rounds:

    time = ceil(log2 p)·(α + n·β + n·γ)

Leaves send ``sendbuf`` directly; inner ranks reduce into a scratch buffer
(the root into ``recvbuf``), reading ``sendbuf`` in their first reduction,
so nothing is copied.  ``chunk_bytes`` pipelines each receive-and-reduce.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from ...dtypes import ReduceOp
from . import _common as c

if TYPE_CHECKING:
    from ..base import Communicator

#: Scratch slot of the inner ranks' partial result (slot 0 takes received data).
ACC_SLOT = 1


def reduce(comm: "Communicator", sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
           op: "str | ReduceOp" = "sum", root: int = 0, *, reduce: Optional[c.Reducer] = None,
           chunk_bytes: Optional[int] = None) -> Optional[np.ndarray]:
    """Every rank's ``sendbuf`` reduced with ``op`` into the root's ``recvbuf``.

    The root returns ``recvbuf`` (allocated when None; ``recvbuf is sendbuf``
    reduces in place), the others return None and may pass ``recvbuf=None``.
    ``reduce(a, b, out)`` is the reduction kernel (default: ``op``'s ufunc).
    """
    send = c.check_buf(comm, sendbuf, "reduce's send buffer")
    rop = c.check_op(comm, op, sendbuf)
    kernel = c.check_reduce(reduce, rop)
    chunk = c.check_chunk(chunk_bytes, sendbuf.itemsize)
    root = comm.check_root(root)
    if comm.rank != root:
        run(c.HostLink(comm), send, None, root, kernel, chunk)
        return None
    recvbuf = c.recv_or_part(comm, sendbuf, recvbuf, sendbuf.size, "reduce's receive buffer",
                             lambda scratch: run(c.HostLink(comm), send, scratch, root, kernel, chunk))
    recv = send if recvbuf is sendbuf else c.flat(recvbuf)    # in place: one view
    run(c.HostLink(comm), send, recv, root, kernel, chunk)
    rop.finish(recv, comm.size)
    return recvbuf


def run(link: "c.HostLink", send: np.ndarray, recv: Optional[np.ndarray], root: int,
        reduce: c.Reducer, chunk: Optional[int]) -> None:
    """The algorithm on checked flat buffers; ``recv`` is None except at the root; data
    moves through ``link``."""
    p, n = link.size, len(send)
    v = (link.rank - root) % p
    if n == 0 or p == 1:
        if recv is not None and recv is not send:
            recv[:] = send
        return
    acc = recv
    partial = send                              # where this rank's partial result lives
    mask = 1
    while mask < p:
        if v & mask:
            link.send(partial, (v - mask + root) % p, chunk)
            return
        child = v + mask
        if child < p:
            if acc is None:
                acc = link.scratch(send, n, ACC_SLOT)
            link.exchange_reduce(send[:0], link.rank, partial, acc,
                              (child + root) % p, reduce, chunk)
            partial = acc
        mask <<= 1


def schedule(p: int, nbytes: float) -> c.Schedule:
    """Critical-path cost: ceil(log2 p) rounds, each moving and reducing the whole buffer."""
    rounds = c.log2_ceil(c.check_p(p))
    return c.Schedule(rounds, rounds * nbytes, rounds * nbytes)
