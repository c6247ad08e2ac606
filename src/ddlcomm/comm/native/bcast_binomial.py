"""Binomial-tree broadcast (MPICH's choice for short messages and small rank counts).

Ranks are numbered relative to the root, v = (rank - root) mod p.  Rank v
receives the buffer from v - 2^k, where 2^k is v's lowest set bit, then
sends it on to v + 2^j for every j < k (largest subtree first) that exists.
The root reaches everyone in ceil(log2 p) rounds, each moving the whole
buffer:

    time = ceil(log2 p)·(α + n·β)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import _common as c

if TYPE_CHECKING:
    from ..base import Communicator


def broadcast(comm: "Communicator", buf: np.ndarray, root: int = 0) -> np.ndarray:
    """Copy the root's ``buf`` into every rank's ``buf`` (in place); returns ``buf``."""
    flat, root = c.broadcast_or_part(comm, buf, root, lambda scratch, r: run(c.HostLink(comm), scratch, r))
    run(c.HostLink(comm), flat, root)
    return buf


def run(link: "c.HostLink", buf: np.ndarray, root: int) -> None:
    """The algorithm on a checked flat buffer, moving data through ``link``."""
    p = link.size
    if p == 1 or len(buf) == 0:
        return
    v = (link.rank - root) % p
    mask = 1
    while mask < p:                            # receive from the parent (v without its lowest bit)
        if v & mask:
            link.recv(buf, (v - mask + root) % p)
            break
        mask <<= 1
    mask >>= 1
    while mask:                                # send to the children, largest subtree first
        if v + mask < p:
            link.send(buf, (v + mask + root) % p)
        mask >>= 1


def schedule(p: int, nbytes: float) -> c.Schedule:
    """Critical-path cost: ceil(log2 p) rounds of the whole buffer."""
    rounds = c.log2_ceil(c.check_p(p))
    return c.Schedule(rounds, rounds * nbytes)
