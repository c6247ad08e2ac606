"""What a stored point says about its buffers' pages (pure).

Each point of NumPy's arrays records, rank by rank, the part of them on huge pages
(``pages.huge_share_ranks``, :mod:`ddlcomm.memory.pagescan`); a memory kind may fix it
(:attr:`ddlcomm.memory.MemoryKind.huge_share`).  A single copy between processes pins
the sender's pages, so what counts is the ranks the data come from
(:meth:`ddlcomm.collectives.Collective.sources`): on the 2-core EPYC a 2-rank Open MPI
broadcast of 4 MiB took 79 µs with the root's arrays all huge and 167-213 µs with them
half huge, whatever the receiver's (docs/benchmarks.md, "Pages of a single copy").
Read by the cost model's fit and by ``ddlcomm results compare``.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from .collectives import COLLECTIVES
from .errors import UsageError
from .memory import kind


def kind_huge_share(memory: Optional[str]) -> Optional[float]:
    """The part on huge pages a memory kind fixes (``hugepage`` 1, ``pageable`` 0, ...);
    None for NumPy's allocator (``numpy`` or None), a kind that does not fix it, or an
    unknown name."""
    if memory in (None, "numpy"):
        return None
    try:
        return kind(memory).huge_share
    except UsageError:
        return None


def huge_shares(point: Mapping[str, Any]) -> list[Optional[float]]:
    """Each rank's part of its NumPy arrays on huge pages, in rank order (``[]``: not
    recorded); the record's own ``pages`` or its ``extra``'s."""
    pages = point.get("pages") or (point.get("extra") or {}).get("pages") or {}
    return list(pages.get("huge_share_ranks") or ())


def senders_huge_share(point: Mapping[str, Any]) -> Optional[float]:
    """The mean part on huge pages of the arrays a point's data come from (its collective's
    source ranks; every rank where the collective is not known), as recorded; that of its
    memory kind where the kind fixes it (:func:`kind_huge_share`); else None."""
    shares = huge_shares(point)
    if not shares:
        return kind_huge_share(point.get("memory") or (point.get("extra") or {}).get("memory"))
    collective = COLLECTIVES.get(point.get("collective") or "")
    root = point.get("root") or 0
    senders = [s for rank, s in enumerate(shares)
               if s is not None and (collective is None or collective.sources(rank, root))]
    return sum(senders) / len(senders) if senders else None
