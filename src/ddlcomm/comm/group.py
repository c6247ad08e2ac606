"""A subset of a communicator's ranks, seen as a communicator of its own for point-to-point.

The native algorithms (:mod:`ddlcomm.comm.native`) need only ``rank``,
``size`` and the point-to-point primitives, so a :class:`Group` -- ranks
renumbered 0…k-1, messages sent to the parent's ranks -- lets them run among
any subset (the leaders of the nodes, the ranks of one node) over any
backend, without the backend having to split communicators.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import UsageError
from .base import rank_number, rank_of
from .native._common import BARRIER_TAG


class Group:
    """The ranks ``members`` (parent ranks, in group order) of ``parent``; this rank must be one."""

    def __init__(self, parent, members: Sequence[int]):
        if isinstance(members, (str, bytes)) or not hasattr(members, "__iter__"):
            raise UsageError(f"group members must be a list of ranks, got {members!r}")
        members = [rank_number(m) for m in members]
        if parent.rank not in members:
            raise UsageError(f"rank {parent.rank} is not in the group {members}")
        if len(set(members)) != len(members) or not all(0 <= m < parent.size for m in members):
            raise UsageError(f"group members must be distinct ranks of 0..{parent.size - 1}: {members}")
        self.parent = parent
        self.members = members
        self.rank = members.index(parent.rank)
        self.size = len(members)
        self._token = np.zeros(1, np.uint8)
        self._sink = np.zeros(1, np.uint8)

    # The checks of the parent (dtypes, ops) hold for the group too.
    def check_buffer(self, array):
        return self.parent.check_buffer(array)

    def check_op(self, op, dtype):
        return self.parent.check_op(op, dtype)

    def check_root(self, root: int) -> int:
        return rank_of(root, self.size, "group")

    def _send(self, buf, dest: int, tag: int) -> None:
        self.parent._send(buf, self.members[dest], tag)

    def _recv(self, buf, source: int, tag: int) -> None:
        self.parent._recv(buf, self.members[source], tag)

    def _sendrecv(self, sendbuf, dest: int, recvbuf, source: int, tag: int) -> None:
        self.parent._sendrecv(sendbuf, self.members[dest], recvbuf, self.members[source], tag)

    def _isend(self, buf, dest: int, tag: int):
        return self.parent._isend(buf, self.members[dest], tag)

    def _irecv(self, buf, source: int, tag: int):
        return self.parent._irecv(buf, self.members[source], tag)

    def barrier(self) -> None:
        """Dissemination barrier: ceil(log2 k) rounds of one-byte exchanges."""
        if self.size == self.parent.size:
            self.parent.barrier()
            return
        k, dist = self.size, 1
        while dist < k:
            self._sendrecv(self._token, (self.rank + dist) % k, self._sink,
                           (self.rank - dist) % k, BARRIER_TAG)
            dist *= 2
