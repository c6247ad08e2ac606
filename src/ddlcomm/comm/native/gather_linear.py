"""Linear gather: every rank sends its buffer straight to the root.

The root posts a receive from every other rank into that rank's slot of
``recvbuf`` at once and waits for them all, so the messages arrive in
whatever order the senders are ready; its link carries all of them:

    time = (p-1)·(α + n·β)   at the root
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from . import _common as c

if TYPE_CHECKING:
    from ..base import Communicator


def run(comm: "Communicator", send: np.ndarray, recv: Optional[np.ndarray], root: int) -> None:
    n, r = send.size, comm.rank
    if n == 0:
        return
    if r != root:
        comm._send(send, root, c.TAG)
        return
    reqs = [comm._irecv(recv[i * n:(i + 1) * n], i, c.TAG) for i in range(comm.size) if i != r]
    recv[r * n:(r + 1) * n] = send
    for req in reqs:
        req.wait()


gather = c.gather_entry(run)


def schedule(p: int, nbytes: float) -> c.Schedule:
    """Cost at the root: p-1 messages of n bytes."""
    p = c.check_p(p)
    return c.Schedule(p - 1, (p - 1) * nbytes)
