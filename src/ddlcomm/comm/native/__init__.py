"""ddlcomm's own collective algorithms, over any backend's point-to-point.

Each algorithm is one function in one module named ``<collective>_<algorithm>.py``
and uses nothing of the backend but its point-to-point primitives
(``_send``, ``_recv``, ``_sendrecv``, ``_isend``, ``_irecv``) and a
reduction kernel ``reduce(a, b, out)``, so it runs, unchanged, over MPI,
Gloo or any other :class:`~ddlcomm.comm.base.Communicator`; modules are
imported on first use.

==========  ===========  ========================================================
collective  algorithm    call
==========  ===========  ========================================================
allreduce   ring         ``f(comm, sendbuf, recvbuf=None, op="sum", *, reduce=None, chunk_bytes=None)``
allreduce   rhd          (same)
broadcast   binomial     ``f(comm, buf, root=0)``
broadcast   pipelined    ``f(comm, buf, root=0, *, chunk_bytes=256 KiB)``
reduce      binomial     ``f(comm, sendbuf, recvbuf=None, op="sum", root=0, *, reduce=None, chunk_bytes=None)``
gather      linear       ``f(comm, sendbuf, recvbuf=None, root=0)``
gather      binomial     (same)
==========  ===========  ========================================================

Semantics are those of the Communicator's methods of the same name: any
count (0, 1, not divisible by the number of ranks), any root, every dtype
the backend carries, ``recvbuf is sendbuf`` for in place (allreduce, and
reduce at the root), ``avg`` divided by the number of ranks at the end.

>>> from ddlcomm.comm import native
>>> ring = native.get("allreduce", "ring")
>>> ring(comm, grads, grads, "sum", chunk_bytes=1 << 20)       # in place, pipelined
>>> step = ring.bound(comm, grads, grads, "sum")                 # the all-reduces: checked once,
>>> step()                                                        # then called as often as needed

Each module also has ``schedule(p, nbytes) -> Schedule`` (rounds, bytes and
reduced bytes on the critical path, for the α-β-γ cost model); :func:`schedule`
here looks it up by name.
"""
from __future__ import annotations

from typing import Callable

from ...errors import UsageError
from ...lazy import load
from ._common import TAG, HostLink, Schedule, free_scratch

_PKG = __name__

#: (collective, algorithm) -> "module:function", imported on first use.
ALGORITHMS: dict[tuple[str, str], str] = {
    ("allreduce", "ring"): f"{_PKG}.allreduce_ring:allreduce",
    ("allreduce", "rhd"): f"{_PKG}.allreduce_rhd:allreduce",
    ("broadcast", "binomial"): f"{_PKG}.bcast_binomial:broadcast",
    ("broadcast", "pipelined"): f"{_PKG}.bcast_pipelined:broadcast",
    ("reduce", "binomial"): f"{_PKG}.reduce_binomial:reduce",
    ("gather", "linear"): f"{_PKG}.gather_linear:gather",
    ("gather", "binomial"): f"{_PKG}.gather_binomial:gather",
}

#: Other spellings of collective names (the modules are named after MPI's short ones).
ALIASES = {"bcast": "broadcast"}


def collectives() -> list[str]:
    """Collectives that have at least one native algorithm."""
    return list(dict.fromkeys(coll for coll, _ in ALGORITHMS))


def algorithms_for(collective: str) -> list[str]:
    """Names of the native algorithms of ``collective`` (empty when it has none)."""
    collective = ALIASES.get(collective, collective)
    return [alg for coll, alg in ALGORITHMS if coll == collective]


def _target(collective: str, algorithm: str) -> str:
    collective = ALIASES.get(collective, collective)
    try:
        return ALGORITHMS[collective, algorithm]
    except KeyError:
        pass
    choices = algorithms_for(collective)
    if not choices:
        raise UsageError(f"no native algorithm for collective {collective!r}",
                         f"native algorithms exist for {', '.join(collectives())}")
    raise UsageError(f"unknown {collective} algorithm {algorithm!r}",
                     f"choose from {', '.join(choices)}")


def get(collective: str, algorithm: str) -> Callable:
    """The function running ``algorithm`` for ``collective``; a UsageError lists the choices."""
    return load(_target(collective, algorithm))


def schedule(collective: str, algorithm: str, p: int, nbytes: float, **kwargs) -> Schedule:
    """The algorithm's cost on ``p`` ranks and ``nbytes`` per rank (see :class:`Schedule`).

    ``kwargs`` go to the module's ``schedule`` (e.g. ``chunk_bytes``).
    """
    module, _, _ = _target(collective, algorithm).partition(":")
    return load(f"{module}:schedule")(p, nbytes, **kwargs)


__all__ = ["ALGORITHMS", "ALIASES", "TAG", "HostLink", "Schedule", "algorithms_for", "collectives",
           "free_scratch", "get", "schedule"]
