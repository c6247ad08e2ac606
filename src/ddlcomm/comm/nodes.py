"""Which node a rank runs on, as the algorithms that treat one node apart tell it, the
shared-memory segment the ranks of a node use together, and how long they spin there."""
from __future__ import annotations

import os
import socket
import weakref

import numpy as np

from .. import memory
from ..errors import EveryRankError
from ..memory.shared import attach, segment_of, unlink_name
from .agree import agreed, attempt


def node_name() -> str:
    """This rank's node: ``$DDLCOMM_NODE`` when set, else the host name."""
    return os.environ.get("DDLCOMM_NODE") or socket.gethostname()


#: Microseconds a rank of the shm engines spins for the others of its node before it sleeps,
#: while the node's ranks do not outnumber the CPUs they may run on (past that: sleep at once).
SPIN_US = 50.0


def spin_us(comm) -> float:
    """How long a rank of ``comm`` (one node's ranks) waiting for the others spins.

    Collective (set-up time): the ranks' CPU affinities together count, so ranks bound one
    to a core of their own still spin, and ranks bound to one core do not.
    """
    return spin_for(comm.size, comm.allgather_object(sorted(os.sched_getaffinity(0))))


def spin_for(nranks: int, cpu_sets) -> float:
    """The spin of :func:`spin_us` (pure): ``nranks`` ranks that may run on ``cpu_sets``."""
    return SPIN_US if nranks <= len(set().union(*map(set, cpu_sets))) else 0.0


#: same_node's answer per communicator: its ranks do not move, so it is asked once.
_ONE_HOST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def same_node(comm) -> bool:
    """True when every rank of ``comm`` runs on this host (by hostname).

    Collective the first time for ``comm`` (every rank asks in the same order), then cached.
    """
    if comm not in _ONE_HOST:
        _ONE_HOST[comm] = len(set(comm.allgather_object(socket.gethostname()))) == 1
    return _ONE_HOST[comm]


def node_segment(comm, leader: int, nbytes: int):
    """A segment of ``nbytes`` shared by the ranks whose ``leader`` (a rank) creates it.

    Every rank of ``comm`` calls this (set-up time); the leaders create, the
    others attach by the name their leader all-gathers.  Where a leader cannot
    create it or a rank cannot map it, every rank raises alike (:func:`agreed`).
    """
    buf = name = why = None
    if comm.rank == leader:
        buf, why = attempt(memory.allocate, "shared", max(1, nbytes))
        name = None if buf is None else segment_of(buf.array(np.uint8, 1))[0]
    try:
        names = agreed(comm, why, "the node's shared-memory segment", name)
        if buf is None:
            buf, why = attempt(attach, names[leader])
        # every rank has it mapped before anyone frees
        agreed(comm, why, "mapping the node's shared-memory segment")
    except EveryRankError:
        if buf is not None:             # another node's leader failed, or another rank
            buf.free()
        raise
    if comm.rank == leader:
        unlink_name(buf)                # a rank killed later leaves no segment behind
    return buf
