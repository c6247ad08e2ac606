"""What a node adds to a call's α-β-γ terms (pure functions): its ranks beyond its
cores, its last-level cache, and its memory bandwidth shared by copies at once.

:mod:`ddlcomm.model.costs` gives a call's terms and, per algorithm, how many of its
ranks copy or reduce at once; a :class:`Load` (``costs.node_load``) carries what
the node does to it, and :func:`features` turns terms and load into what each
parameter of ``costs.PARAMETERS`` is multiplied by, for a prediction and a fit alike.

Oversubscription: with more ranks on a node than cores (``over`` > 0: how
likely a message waits for the scheduler, by how the library's ranks wait,
:data:`OVERSUBSCRIPTION`) two things happen.  Copies and reductions of ranks
that work at the same time share the cores: the β and γ terms are
multiplied by ``share`` = max(1, busy ranks / cores), where the busy ranks
are those of the algorithm that copy or reduce at once (``costs.ACTIVE``: all
p in a ring, the power-of-two core in recursive halving and doubling, the
root alone in a linear gather, the widest level of an Open MPI broadcast
tree, ...), both ranks of a pair where the library's sender copies too
(``costs.copies_per_byte``: MPICH's point-to-point); where the waiting ranks
spin, the call's ranks per core rounded up (the busiest core sets the pace).
And ranks wait for the
scheduler: the fitted ``alpha_over``
(seconds per message per unit of ``over``) and ``beta_over`` (seconds per
byte moved or reduced per unit of ``over``) add ``over·(rounds·alpha_over +
(bytes + reduced)·beta_over)``: a message whose peer is off its core waits
for the scheduler.  Both are 0 unless a fit saw oversubscribed points.  The
per-byte wait is left out where one rank copies at a time in a library whose
lone copies run at full speed (``costs.waits_per_byte``: Open MPI's chain and
linear gather): the waiting ranks give it the core.

Cache: when the node's working set (its ranks' buffers, :data:`FOOTPRINT`)
outgrows the last-level cache, all of it (``spill`` = 1, :func:`spill`)
streams from memory: ``share·c·spill·(bytes + reduced)·beta_spill`` more.  0
when the cache is not known (``costs.Setting``).

Memory contention: the ranks that copy at once on a node (the busy ranks,
at most one per core) share its memory bandwidth, so each byte they move or
reduce, in cache or from memory, costs ``c`` times what it costs one copy
alone (β and γ; ``beta_core`` and ``gamma_core``, the part a core spends
alone, are not slowed), with ``c`` = copies·B(1)/B(copies) (:func:`contention`)
from the node's measured copy bandwidth B by concurrent copies (``ddlcomm info
--memory-bandwidth``).  It is measured, not fitted: 1 where B grows at least
in proportion to the copies, or where B is not known.  :func:`features` has
the whole formula.

Rendezvous: the messages on a call's critical path that the library sends by
rendezvous on one node (``rndv``, ``costs.rendezvous_rounds``) cost ``alpha_rndv``
more each: the handshake.

Pages: a single copy between processes (``process_vm_readv``, Open MPI's ``smsc/cma``,
MPICH's CMA) pins the sender's buffer page by page, so each 4 KiB page it reads costs
``alpha_page`` besides its bytes, and a 2 MiB huge page next to nothing per byte.  On
the second 2-core EPYC a 2 MiB message took 134 µs from 4 KiB pages and 38 µs from a
huge page, whatever the receiver's pages (docs/benchmarks.md, "Pages of a single
copy").  Which pages a buffer has is the node's (its transparent-huge-page mode) and
its allocator's: :func:`small_page_part`.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

import numpy as np

from ..comm.native import Schedule
from ..pages import kind_huge_share
from .library import FRESH_FROM


class Load(NamedTuple):
    """What the node does to a call besides its terms (``costs.node_load``)."""

    #: the oversubscription: 0 with a core per rank (:data:`OVERSUBSCRIPTION`)
    over: float = 0.0
    #: busy ranks per core (>= 1), slowing copies and reductions (``costs.share``)
    share: float = 1.0
    #: the part of the working set beyond the last-level cache (:func:`spill`)
    spill: float = 0.0
    #: an oversubscribed copy waits for the scheduler per byte (False: one rank
    #: copies at a time, in a library whose lone copies run at full speed;
    #: ``costs.waits_per_byte``)
    per_byte: bool = True
    #: how much slower each of the copies that run at once streams from memory than
    #: one copy alone (>= 1; :func:`contention`)
    contention: float = 1.0
    #: bytes of freshly mapped pages the critical path touches: the library's own
    #: temporaries that the C library maps afresh at every call
    #: (:func:`ddlcomm.model.library.fresh_bytes`)
    fresh: float = 0.0
    #: rounds whose messages go by rendezvous (``costs.rendezvous_rounds``)
    rndv: float = 0.0
    #: 4 KiB pages the single copies on the critical path pin (``costs.pinned_pages``)
    pages: float = 0.0


def features(terms: Schedule, load: Optional[Load] = None) -> tuple[float, ...]:
    """What each parameter of ``costs.PARAMETERS`` is multiplied by (a fit's columns)::

        t = rounds·α + share·c·(bytes·β + reduced·γ + spill·(bytes + reduced)·β_spill)
            + over·(rounds·α_over + [per_byte]·(bytes + reduced)·β_over) + share·fresh·β_fault
            + share·(bytes·β_core + reduced·γ_core) + rndv·α_rndv + share·pages·α_page

    with ``c`` the contention: every byte of copies that run at once costs c times one
    alone, those from memory (the part ``spill``) β_spill more.  Not only those from
    memory: on the 16-core node Open MPI's all-reduce of 64 KiB-1 MiB, in cache, took
    1.6-1.9x as long at 16 ranks as at 8 (c(16)/c(8) = 1.6 there).  But not all of a
    byte's cost either: β_core and γ_core are the part the core spends alone (its
    instructions, the reduction's arithmetic), which copies at once do not slow; the fit
    splits each byte's cost between the two by how the times grow with c.  Priced all
    contended, Open MPI's all-reduce on the 16-core node, fitted on 2-8 ranks (c up to
    1.40), came out 14-73% slow at 12 and 16 (c 1.7-2.2).  A fresh page's first
    touch (``fresh``, β_fault) is the kernel's work: it shares the cores, not priced as a
    copy among copies; so is pinning a single copy's pages (``pages``, α_page).
    """
    over, busy, spilled, per_byte, c, fresh, rndv, pages = load or Load()
    busy = max(1.0, busy)
    c = max(1.0, c)
    m = busy * c
    moved = terms.bytes + terms.reduced_bytes
    return (terms.rounds, m * terms.bytes, m * terms.reduced_bytes,
            over * terms.rounds, over * moved if per_byte else 0.0, m * spilled * moved,
            busy * fresh, busy * terms.bytes, busy * terms.reduced_bytes, rndv, busy * pages)


#: A node's copy bandwidth by concurrent copies: ((copies, bytes/s of all together), ...),
#: ascending, as :func:`ddlcomm.machine.membw.copy_bandwidth` measures it.
Bandwidth = tuple[tuple[int, float], ...]


def contention(bandwidth: Optional[Bandwidth], copiers: float) -> float:
    """How much slower each of ``copiers`` copies that run at once goes than one alone:
    copiers·B(1)/B(copiers), at least 1, with B the node's ``bandwidth`` by copies
    (linear between the measured counts, flat past the last); 1 when unknown.  Each
    copy's share B(k)/k is taken as never larger with more copies (the most of any
    count at or above k): k copies can each go as fast as they did among more.  The
    16-core node's probe measured 2 copies at 13.0 GB/s and 4 at 30.6: 2 copies slowed
    each other 1.21x, 4 only 1.03x; read so, 2 copies cost 1.03x, which took MPICH's
    all-reduce there from 9.7/12.6% to 6.7/7.0% (held out/fitted; Open MPI's from
    18.7/13.0% to 22.7/15.6%)."""
    if not bandwidth or copiers <= 1:
        return 1.0
    table = dict(bandwidth)
    if 1 not in table or table[1] <= 0:
        return 1.0
    counts = sorted(table)
    rate = [table[k] / k for k in counts]           # each copy's share, never more with more copies
    for i in range(len(rate) - 2, -1, -1):
        rate[i] = max(rate[i], rate[i + 1])
    b = float(np.interp(copiers, counts, [r * k for r, k in zip(rate, counts)]))
    return max(1.0, copiers * table[1] / b) if b > 0 else 1.0


def bandwidth_of(measured: Optional[Mapping[str, Any]]) -> Optional[Bandwidth]:
    """:data:`Bandwidth` from ``ddlcomm info --memory-bandwidth``'s ``copy_bandwidth``
    (its ``by_copiers``: {"1": bytes/s, ...}); None without one."""
    by = (measured or {}).get("by_copiers") or {}
    return tuple(sorted((int(k), float(v)) for k, v in by.items())) or None


#: Bytes a collective's buffers span per rank, in units of the message size:
#: all-reduce and reduce a send and a receive buffer; broadcast one; gather
#: one to send, and the root's receive buffer of p of them (2 per rank on average).
FOOTPRINT = {"allreduce": 2, "reduce": 2, "broadcast": 1, "gather": 2}


def spill(collective: str, ranks_on_node: int, nbytes: float, cache: Optional[float]) -> float:
    """The part of a node's working set (its ranks' buffers) that streams from memory
    through a last-level cache of ``cache`` bytes: all of it (1) once it outgrows the
    cache, none (0) while it fits; 0 when ``cache`` is unknown.

    All, not the part beyond the cache (max(0, 1 - cache / working set), the term before
    2026-11-29): buffers read in turn through a cache that keeps the lines used last
    find none of theirs still there once they outgrow it.  Open MPI's 16-core gather
    moves 2-3.5x slower per byte once its root's receive buffer passes 16-24 MiB, at
    every rank count: an edge, not a ramp (docs/benchmarks.md, "The model on the
    16-core node")."""
    if not cache:
        return 0.0
    return 1.0 if FOOTPRINT.get(collective, 2) * ranks_on_node * nbytes > cache else 0.0


#: How a library's waiting ranks share the cores when they outnumber them
#: (:data:`ddlcomm.model.library.WAITING`) -> ``over`` for (ranks on the node,
#: cores), ranks > cores.  ``sleep``: a waiting rank leaves its core (MPICH's
#: throttled polling, Gloo's blocking waits), so the chance that the rank a
#: message waits for is off its core is the share of ranks without one,
#: (ranks - cores) / ranks.  ``yield``: waiting ranks stay runnable and give
#: the core back at each poll (Open MPI's ``mpi_yield_when_idle``), so a
#: message waits about one turn of the scheduler however many share the core: 1.
#: ``spin``: waiting ranks keep their turn on the core (MPICH's release_gather
#: flags): 1 as well; they also keep the working ranks from the whole core
#: (``costs.share``).
OVERSUBSCRIPTION = {
    "sleep": lambda ranks, cores: (ranks - cores) / ranks,
    "yield": lambda ranks, cores: 1.0,
    "spin": lambda ranks, cores: 1.0,
}


def oversubscription(ranks_per_node: int, cores: Optional[int], waiting: str = "sleep") -> float:
    """``over`` of ``ranks_per_node`` ranks on ``cores`` cores whose library waits
    as ``waiting`` says (:data:`OVERSUBSCRIPTION`); 0 without oversubscription
    or when ``cores`` is None."""
    if not cores or ranks_per_node <= cores:
        return 0.0
    return OVERSUBSCRIPTION[waiting](ranks_per_node, cores)


#: Bytes of a small page, and of a huge page (x86-64's transparent huge pages).
SMALL_PAGE = 4096
HUGE_PAGE = 2 << 20
#: NumPy asks for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every array data
#: block of 4 MiB or more (``numpy/_core/src/multiarray/alloc.c``: ``size >= (1u<<22u)``).
NUMPY_HUGEPAGE_FROM = 4 << 20


def small_page_part(nbytes: float, thp: Optional[str], memory: Optional[str] = None,
                    temporary: bool = False, huge_share: Optional[float] = None) -> float:
    """The part of a buffer of ``nbytes`` on small pages, on a node whose transparent huge
    pages are in mode ``thp`` (``always``, ``madvise``, ``never``; None: not known, then 0,
    so that nothing is priced): ``memory`` is the kind of the benchmark's buffers (None or
    ``numpy``: NumPy's allocator; a kind that fixes its pages decides,
    ``ddlcomm.pages.kind_huge_share``), ``temporary`` a block the C library mallocs instead.
    ``huge_share``: the part of the benchmark's buffers on huge pages, as a point measured
    it (``ddlcomm.memory.pagescan``); it decides for them where given.

    Huge pages back NumPy's blocks from :data:`NUMPY_HUGEPAGE_FROM` where THP is ``always``
    or ``madvise``, any block of at least a huge page where it is ``always``.  A block
    glibc maps afresh (from :data:`ddlcomm.model.library.FRESH_FROM`) gets them on its
    2 MiB-aligned interior: what lies before and after, a huge page's worth on average,
    stays small (HUGE_PAGE / n).  Below that it is priced all huge, the case of the fastest
    of a point's runs, which the fit keeps: one served from a heap range NumPy has advised.
    A fresh one is not (a 4 MiB array half small): on the 2-core EPYC (``madvise``) a
    2-rank Open MPI broadcast of 4 MiB took 79 µs from huge pages, 261 µs from small ones,
    166-213 µs from a root's array half huge, and 79 µs in one run in four of its sweeps.
    Where a point measured its arrays' pages, ``huge_share`` says."""
    fixed = kind_huge_share(memory)
    if not temporary and (huge_share is not None or fixed is not None):
        return 1.0 - (huge_share if huge_share is not None else fixed)
    if thp is None:
        return 0.0
    if thp == "always":
        huge_from = HUGE_PAGE
    elif thp == "madvise" and not temporary and memory in (None, "numpy"):
        huge_from = NUMPY_HUGEPAGE_FROM
    else:
        return 1.0
    if nbytes < huge_from:
        return 1.0
    return min(1.0, HUGE_PAGE / nbytes) if nbytes >= FRESH_FROM else 0.0
