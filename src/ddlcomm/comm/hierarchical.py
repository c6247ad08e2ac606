"""Hierarchical all-reduce: shared memory inside each node, the backend among the nodes' leaders.

Per call, on every node (ranks grouped by :func:`node_groups`):

1. each rank copies its input into its slot of the node's shared segment;
   node barrier;
2. local rank i reduces slice i of the node's sum straight from every local
   rank's slot into the node's result slot (the local ranks reduce in
   parallel; no copy through the MPI library); node barrier;
3. the node's leader (its lowest rank) all-reduces the node result in place
   with the other nodes' leaders over the backend's point-to-point, by
   ddlcomm's ring from ``RING_MIN_BYTES`` up and by recursive halving and
   doubling below (a :class:`~ddlcomm.comm.group.Group` of the leaders, so
   any backend works without splitting communicators); node barrier;
4. every rank copies the result out.

On one node step 3 is empty and this is the ``shm`` all-reduce with one more
barrier.  Nodes are told apart by host name (``socket.gethostname()``; ranks
in separate ``--containers`` have their own UTS namespace, so their own host
name), which is right on several machines under any launcher;
``DDLCOMM_NODE`` overrides it per rank.  ``avg`` divides once, by the total
number of ranks, at the end.

Cost: the local phases move about 3n bytes per rank and reduce n/k per rank
(k local ranks); the leaders' phase is the chosen algorithm's schedule over
the number of nodes (:func:`ddlcomm.comm.native.schedule`).
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional, Sequence

import numpy as np

from ..dtypes import ReduceOp
from ..lazy import load
from .algorithms import PIPELINE_BYTES, RING_MIN_BYTES
from .group import Group
from .native import ALGORITHMS, HostLink
from .native._common import check_reduce
from .nodes import node_name
from .nodes import node_segment
from .shm import reduce_slice, slices


def node_groups(names: Sequence[str]) -> list[list[int]]:
    """Ranks grouped by node, given every rank's node name (pure).

    Groups are ordered by their lowest rank, ranks ascending in each; a
    group's first rank is its leader.

    >>> node_groups(["a", "b", "a", "b", "c"])
    [[0, 2], [1, 3], [4]]
    """
    groups: dict[str, list[int]] = {}
    for rank, name in enumerate(names):
        groups.setdefault(name, []).append(rank)
    return sorted(groups.values(), key=lambda g: g[0])


def leaders_algorithm(nbytes: int) -> str:
    """The native algorithm the leaders use for an ``nbytes`` message (pure)."""
    return "ring" if nbytes >= RING_MIN_BYTES else "rhd"


def bind_allreduce(comm, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   reduce: Optional[Callable] = None,
                   node: Optional[str] = None) -> Callable[[], None]:
    """Set up the node segments and groups; return the all-reduce on these buffers.

    ``node`` names this rank's node (default :func:`node_name`).
    """
    reduce = check_reduce(reduce, op)
    groups = node_groups(comm.allgather_object(node or node_name()))
    mine = next(g for g in groups if comm.rank in g)
    local = Group(comm, mine)
    leaders = Group(comm, [g[0] for g in groups]) if local.rank == 0 else None
    k, n, dtype = local.size, sendbuf.size, sendbuf.dtype
    seg = node_segment(comm, mine[0], (k + 1) * n * dtype.itemsize)
    flat = seg.array(dtype, (k + 1) * n)
    inputs = [flat[i * n:(i + 1) * n] for i in range(k)]
    result = flat[k * n:(k + 1) * n]
    lo, hi = slices(n, k)[local.rank]
    parts = [x[lo:hi] for x in inputs]
    several = len(groups) > 1 and n > 0
    chunk = max(1, PIPELINE_BYTES // dtype.itemsize)
    inter = None
    if several and leaders is not None:
        module = ALGORITHMS["allreduce", leaders_algorithm(n * dtype.itemsize)].partition(":")[0]
        inter = load(f"{module}:run")
    p = comm.size

    out = recvbuf.reshape(-1)           # a view: bind checked the buffers C-contiguous

    def call() -> None:
        np.copyto(inputs[local.rank], sendbuf.reshape(-1))
        local.barrier()
        reduce_slice(reduce, parts, result[lo:hi])
        if not several:
            op.finish(result[lo:hi], p)     # one node: its sum is the total
        local.barrier()
        if several:
            if inter is not None:
                inter(HostLink(leaders), result, result, reduce, chunk)
            local.barrier()
        np.copyto(out, result)
        if several:
            # avg divides the total once: dividing each node's sum first left sums that
            # cancel at 2.4e-7 (float32) where every other algorithm gives 0
            op.finish(out, p)

    weakref.finalize(call, seg.free)
    return call
