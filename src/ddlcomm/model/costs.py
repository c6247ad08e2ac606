"""α-β-γ cost of every (collective, algorithm) ddlcomm can name (pure functions).

A cost function gives the *terms* of one call on ``p`` ranks and ``nbytes``
per rank, as a :class:`~ddlcomm.comm.native.Schedule`: messages one after
another on the critical path (each costs α), bytes through the busiest link
(each costs β), bytes reduced by the busiest rank (each costs γ).
:class:`Params` turns terms into seconds.  Sizes are those the harness stores
(``bytes`` of a point): the per-rank buffer of broadcast and allreduce, each
rank's contribution to a gather.

Where ddlcomm runs the algorithm itself (``comm/native``: ring, rhd,
binomial, pipelined, linear) its module's ``schedule`` is the one source of
the terms; :data:`COSTS` only points at it.  The algorithms only libraries run
(Open MPI's binary tree, chain, recursive doubling, ...) have their terms
here, each documented with its formula.  ``library`` is resolved per library,
size and rank count by :mod:`ddlcomm.model.library`.

=========  ======================  =============================================
collective algorithm               terms (rounds; bytes; reduced bytes)
=========  ======================  =============================================
allreduce  ring                    native: 2(p-1); 2(p-1)/p·n; (p-1)/p·n
allreduce  rhd (= rabenseifner)    native: 2·log2 p (+2); 2(p-1)/p·n (+2n); (p-1)/p·n (+n)
allreduce  recursive_doubling      ⌈log2 p⌉ (+1 off powers of two); n per round; n per exchange
allreduce  linear                  reduce to the root, then broadcast: 2(p-1); 2(p-1)n; (p-1)n
allreduce  nonoverlapping          binomial reduce + binomial broadcast
allreduce  shm                     pipelined: 3 waits; (2p-1)/p·n copied; (p-1)/p·n
allreduce  hierarchical            shm reduce + fan-out in each node (intra-node
                                   parameters) + the leaders' all-reduce (inter-node)
allreduce  release_gather          MPICH's one-node shm: reduce up a k-ary tree and
                                   release down, pipelined in 8 KiB cells: depth + 1
                                   + one per further cell; 2n; min(p-1, k)·n
broadcast  binomial, pipelined     native: ⌈log2 p⌉ rounds of n; (p-2+m) rounds of n/m
broadcast  linear                  the root posts p-1 sends at once: p-1; n (*)
broadcast  chain                   f chains from the root, no segments; Open MPI's
                                   defaults run f = 1: one chain of p-1 hops (*)
broadcast  binary                  heap-ordered binary tree (*)
broadcast  split_binary            two binary trees of n/2 each, then one exchange (*)
broadcast  knomial                 radix k = 4 tree (*)
broadcast  scatter_rd_allgather    binomial scatter + recursive-doubling allgather
broadcast  scatter_ring_allgather  binomial scatter + ring allgather
broadcast  release_gather          MPICH's one-node shm: the root copies each 8 KiB
                                   cell in, every other rank copies it out: 1 + one
                                   per further cell; n
gather     linear, binomial        native: (p-1) messages of n; ⌈log2 p⌉ rounds, (p-1)n in
gather     linear_sync             linear, each sender first waits for a 0-byte go-ahead
ps         <bcast>+<gather>        PS step: broadcast, then gather, both through
                                   the server's link (``library`` = each library's own)
=========  ======================  =============================================

(*) Open MPI's trees post to every child at once (see :func:`star_shape`
and the others): posts on the critical path are rounds, but each level's
receivers copy at once, so a level costs one n of bytes, slowed by
``share`` when they outnumber the cores.

The node's part of a call (oversubscription, cache, memory contention) is
:mod:`ddlcomm.model.node`; which of an algorithm's ranks copy or reduce at once
(:data:`ACTIVE`) and :func:`node_load` are here, since they depend on the algorithm.
So is the library's protocol on one node: a message at or beyond its eager limit goes by
rendezvous, whose handshake the fitted ``alpha_rndv`` prices per message
(:func:`rendezvous_rounds`), and a message it moves by single copy pins the sender's
small pages, each priced by the fitted ``alpha_page`` (:func:`pinned_pages`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Mapping, Optional

from ..comm import native
from ..comm.hierarchical import leaders_algorithm
from ..comm.native import Schedule, gather_binomial
from ..errors import UsageError
from .library import (choose, copies_alone, eager_limit, fresh_bytes, from_temporary, local_copies,
                      p2p_copies, single_copy_from, waiting)
from .library import sends_in_turn as library_sends_in_turn
from .node import SMALL_PAGE, Bandwidth, Load, contention, features, oversubscription, small_page_part, spill

#: The fan-out Open MPI's chain broadcast runs with by default: 1.  The fixed decision
#: calls ``bcast_intra_do_this(..., alg, 0, 0)``, and ``ompi_coll_base_topo_build_chain``
#: turns fan-out 0 into 1 ("forcing to 1 (pipeline)"); ``coll_tuned_bcast_chain_fanout``
#: (4) applies only to a forced algorithm.  So "chain" and "pipeline" are one chain of
#: p-1 hops of the whole buffer.
CHAIN_FANOUT = 1
#: Open MPI's k-nomial broadcast radix (``coll_tuned_bcast_knomial_radix``, default 4).
KNOMIAL_RADIX = 4


@dataclass(frozen=True)
class Params:
    """Latency, bandwidth and reduction parameters (seconds, seconds per byte)."""

    alpha: float
    beta: float
    gamma: float = 0.0
    alpha_over: float = 0.0
    beta_over: float = 0.0
    beta_spill: float = 0.0
    beta_fault: float = 0.0
    #: per byte moved / reduced, the part of the work that copies at once do not slow
    #: (the core's own; ``node.features``)
    beta_core: float = 0.0
    gamma_core: float = 0.0
    #: per message sent by rendezvous: beyond the library's eager limit on one node
    #: (:func:`rendezvous_rounds`)
    alpha_rndv: float = 0.0
    #: per small (4 KiB) page a single copy on one node reads (:func:`pinned_pages`)
    alpha_page: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value) or value < 0:
                raise UsageError(f"model parameter {name} must be a number >= 0, not {value!r}")

    def time(self, terms: Schedule, load: Optional[Load] = None) -> float:
        """Seconds for ``terms`` on a node loaded as ``load`` says (default: not at all)."""
        return sum(f * getattr(self, name) for name, f in zip(PARAMETERS, features(terms, load)))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, float]) -> "Params":
        return cls(**{k: float(d.get(k, 0.0)) for k in PARAMETERS})


#: The parameters, in the order of :class:`Params` (and of a fit's columns).
PARAMETERS = tuple(f.name for f in fields(Params))


# ------------------------------------------------------------------ helpers
def _p(p: int) -> int:
    return native._common.check_p(p)


def _log2c(p: int) -> int:
    return (p - 1).bit_length()


def _add(*parts: Schedule) -> Schedule:
    return Schedule(sum(s.rounds for s in parts), sum(s.bytes for s in parts),
                    sum(s.reduced_bytes for s in parts))


def _native(collective: str, algorithm: str, **fixed) -> Callable[..., Schedule]:
    def terms(p: int, nbytes: float, **kw) -> Schedule:
        return native.schedule(collective, algorithm, p, nbytes, **{**fixed, **kw})
    terms.__doc__ = f"ddlcomm's own {collective} {algorithm}: its module's schedule."
    return terms


# ------------------------------------------------------------------ allreduce
def allreduce_recursive_doubling(p: int, nbytes: float) -> Schedule:
    """Recursive doubling: log2 p' exchanges of the whole buffer, each reduced
    (p' = largest power of two <= p); off powers of two the extra ranks first
    hand their buffer to a partner (one round, reduced) and get the result back
    (one round).  Open MPI's and MPICH's short-message all-reduce."""
    p = _p(p)
    if p == 1:
        return Schedule(0, 0.0, 0.0)
    core = 1 << (p.bit_length() - 1)
    k = core.bit_length() - 1
    if core == p:
        return Schedule(k, k * nbytes, k * nbytes)
    return Schedule(k + 2, (k + 2) * nbytes, (k + 1) * nbytes)


def allreduce_linear(p: int, nbytes: float) -> Schedule:
    """Linear reduce to the root then linear broadcast: the root receives and
    reduces p-1 buffers, then sends p-1 (Open MPI's ``basic_linear``)."""
    p = _p(p)
    return Schedule(2 * (p - 1), 2 * (p - 1) * nbytes, (p - 1) * nbytes)


def allreduce_nonoverlapping(p: int, nbytes: float) -> Schedule:
    """Reduce then broadcast, one after the other (binomial trees both)."""
    return _add(native.schedule("reduce", "binomial", p, nbytes),
                native.schedule("broadcast", "binomial", p, nbytes))


def allreduce_shm(p: int, nbytes: float) -> Schedule:
    """``comm/shm.py``'s pipelined form (the C kernel's ``shm``): per chunk each
    rank stages the (p-1)/p·n the others reduce, reduces its 1/p part reading
    all p inputs ((p-1)/p·n reduced) into its result, copies that part to the
    window and the others' (p-1)/p·n out (before 2026-12-06: the whole n out,
    the same bytes); the chunks
    overlap, so one chunk's three waits (one round each) are on the critical
    path; one rank copies its input to the window and out.  (``shm+numpy``,
    the staged form, is :func:`allreduce_shm_phases`.)"""
    p = _p(p)
    if p == 1:
        return Schedule(0, 2.0 * nbytes, 0.0)
    return Schedule(3, (2 * p - 1) / p * nbytes, (p - 1) / p * nbytes)


def allreduce_shm_map(p: int, nbytes: float) -> Schedule:
    """``comm/shm_mapped.py`` (``shm-map``; ``shm`` over ``--memory shared``): nothing is
    staged; each rank reduces its 1/p part straight from all p inputs ((p-1)/p·n reduced)
    into its result and copies it into the p-1 others' ((p-1)/p·n); two waits a call, one
    round each."""
    p = _p(p)
    if p == 1:
        return Schedule(0, float(nbytes), 0.0)
    return Schedule(2, (p - 1) / p * nbytes, (p - 1) / p * nbytes)


def allreduce_shm_phases(p: int, nbytes: float) -> tuple[Schedule, Schedule]:
    """The intra-node halves of a hierarchical all-reduce: (reduce into the
    segment: copy in, barrier, slice reduction, barrier), (fan-out: copy out)."""
    p = _p(p)
    return (Schedule(2 * _log2c(p), float(nbytes), (p - 1) / p * nbytes),
            Schedule(_log2c(p), float(nbytes), 0.0))


#: MPICH's release_gather (``src/mpid/ch4/shm/posix/release_gather``): the bytes of one
#: shared-memory cell (``MPIR_CVAR_{BCAST,REDUCE}_INTRANODE_BUFFER_TOTAL_SIZE`` 32768 over
#: ``..._NUM_CELLS`` 4); a call is pipelined cell by cell.
RELEASE_GATHER_CELL = 8192
#: Its reduce tree's radix: ``MPIR_CVAR_REDUCE_INTRANODE_TREE_KVAL`` (4) up to
#: ``MPIR_CVAR_REDUCE_INTRANODE_MSG_SIZE_THRESHOLD`` (2048 bytes), ``..._KVAL_LARGE`` (2)
#: above; the release (broadcast) tree's is ``MPIR_CVAR_BCAST_INTRANODE_TREE_KVAL`` (64).
RELEASE_GATHER_REDUCE_KVAL = ((2048, 4), (math.inf, 2))
RELEASE_GATHER_BCAST_KVAL = 64


def _kary_depth(p: int, k: int) -> int:
    """Levels below the root of a k-ary tree of ``p`` ranks (heap order)."""
    depth, last, width = 0, 1, 1
    while last < p:
        width *= k
        last += width
        depth += 1
    return depth


def _cells(nbytes: float) -> int:
    return max(1, math.ceil(nbytes / RELEASE_GATHER_CELL))


def allreduce_release_gather(p: int, nbytes: float) -> Schedule:
    """MPICH's all-reduce when every rank is on one node (``MPIDI_Allreduce_intra_
    composition_gamma`` -> ``MPIDI_POSIX_mpi_allreduce_release_gather``): cell by cell,
    each rank reduces its children's cells into its own up a k-ary tree (k = 4 up to
    2 KiB, else 2), then the root's result is released to every rank (a flat tree) and
    copied out.  The cells pipeline: the tree's depth up and one level down, then one
    wait per further cell; the root, the busiest rank, reduces min(p-1, k) inputs and
    copies twice (into the release cell and out) per byte."""
    p = _p(p)
    if p == 1:
        return Schedule(0, float(nbytes), 0.0)
    k = next(k for below, k in RELEASE_GATHER_REDUCE_KVAL if nbytes <= below)
    rounds = _kary_depth(p, k) + _kary_depth(p, RELEASE_GATHER_BCAST_KVAL) + _cells(nbytes) - 1
    return Schedule(rounds, 2.0 * nbytes, min(p - 1, k) * float(nbytes))


def bcast_release_gather(p: int, nbytes: float) -> Schedule:
    """MPICH's broadcast inside a node (``MPIDI_POSIX_mpi_bcast_release_gather``): the
    root copies each cell into shared memory and the others (a flat tree, radix 64)
    copy it out, cell after cell: the copies in and out overlap, so n on the critical
    path, one wait per level and per further cell."""
    p = _p(p)
    if p == 1:
        return Schedule(0, 0.0)
    return Schedule(_kary_depth(p, RELEASE_GATHER_BCAST_KVAL) + _cells(nbytes) - 1,
                    float(nbytes))


# ------------------------------------------------------------------ broadcast
# Open MPI's tree broadcasts (coll/base ``bcast_intra_generic``, unsegmented as
# the tuned defaults run them, and ``basic_linear``) post a send to every child at
# once and then wait for all.  The terms below have the children of a level copy at
# the same time, each its own message: a level costs one n of bytes on the critical
# path (the cores they share are the ``share`` of :data:`ACTIVE`), while the posts,
# one α each, follow one another.  On one node, though, Open MPI's parents were
# measured to send in turn, with single copy (CMA) selected (part of why: children reading
# one parent's small pages at once wait for each other, ``library.SENDS_IN_TURN``):
# :func:`priced` applies :func:`sends_in_turn` where :data:`~.library.SENDS_IN_TURN` says so.
#
# Each tree's shape is (rounds, depth, widest): the most posts ahead of and
# including a rank's own along any path (a child's message is its parent's
# i-th post), the deepest rank's depth in levels, and the most ranks on one
# level (the receivers that copy at once, :data:`ACTIVE`).  Closed forms, so
# that a million ranks cost nothing; tests check them against the trees.
Shape = tuple[int, int, int]


def star_shape(p: int) -> Shape:
    """Linear: the root's children are all other ranks."""
    return (p - 1, 1 if p > 1 else 0, max(1, p - 1))


def chain_shape(p: int, fanout: int = CHAIN_FANOUT) -> Shape:
    """``fanout`` chains hang from the root, ranks split as evenly as they go
    (the first chains one longer): the last long chain is the latest."""
    if p == 1:
        return (0, 0, 1)
    f = min(fanout, p - 1)
    longest = math.ceil((p - 1) / f)
    n_long = (p - 1) % f or f
    rounds = max(n_long + longest - 1, f + longest - 2 if n_long < f else 0)
    return (rounds, longest, f)


def binary_shape(p: int) -> Shape:
    """Heap-ordered binary tree (rank i's children 2i+1, then 2i+2)."""
    if p == 1:
        return (0, 0, 1)
    d = p.bit_length() - 1                      # depth of the last level
    j_max = p - (1 << d)                        # offsets 0..j_max exist on the last level
    last = d + max(bin(j_max).count("1"), j_max.bit_length() - 1)  # left costs 1, right 2
    rounds = max(last, 2 * (d - 1))             # or the rightmost rank of the full level
    return (rounds, d, max(1 << (d - 1), j_max + 1))


def _digits(n: int, radix: int) -> list[int]:
    out = []
    while n:
        n, r = divmod(n, radix)
        out.append(r)
    return out[::-1] or [0]


def knomial_shape(p: int, radix: int = KNOMIAL_RADIX) -> Shape:
    """k-nomial tree: rank x's parent clears x's lowest nonzero base-k digit,
    a parent posts to its farthest children first; x sits at depth = its
    nonzero digits.  The root's last child (k-1) is the latest:
    leading digit of p-1 + (k-1)·(digits of p-1, less one)."""
    if p == 1:
        return (0, 0, 1)
    digits = _digits(p - 1, radix)
    rounds = digits[0] + (radix - 1) * (len(digits) - 1)
    # ranks 0..p-1 by their count of nonzero digits (digit by digit, below p-1's)
    count = [0] * (len(digits) + 1)
    nonzero = 0
    for i, d in enumerate(digits):
        rest = len(digits) - i - 1
        for c in range(d):
            for h in range(rest + 1):
                count[nonzero + (c != 0) + h] += math.comb(rest, h) * (radix - 1) ** h
        nonzero += d != 0
    count[nonzero] += 1
    depth = max(h for h, c in enumerate(count) if c)
    return (rounds, depth, max(count[1:]))


# The same trees as lists of each rank's children, in the order its sends go, for a
# library whose sends go one after another (:func:`sends_in_turn`).
def star_children(p: int) -> list[list[int]]:
    return [list(range(1, p))] + [[] for _ in range(p - 1)]


def binary_children(p: int) -> list[list[int]]:
    return [[c for c in (2 * r + 1, 2 * r + 2) if c < p] for r in range(p)]


def knomial_children(p: int, radix: int = KNOMIAL_RADIX) -> list[list[int]]:
    """Rank x's parent clears x's lowest nonzero base-k digit; the farthest child first."""
    out: list[list[int]] = [[] for _ in range(p)]
    for x in range(1, p):
        d, low = x, 1
        while d % radix == 0:
            d, low = d // radix, low * radix
        out[x - (d % radix) * low].append(x)
    return [sorted(kids, reverse=True) for kids in out]


def binomial_children(p: int) -> list[list[int]]:
    """Open MPI's ``build_bmtree``: rank i's children i|mask for every mask from the power
    of two above i up, ascending (the root's first child has the largest subtree)."""
    out = []
    for i in range(p):
        mask, kids = (1 if i == 0 else 1 << i.bit_length()), []
        while mask < p and (i ^ mask) < p:
            kids.append(i ^ mask)
            mask <<= 1
        out.append(kids)
    return out


#: Broadcast trees priced with the sends in turn (a chain's parents have one child).
TREE_CHILDREN = {"linear": star_children, "binary": binary_children,
                 "knomial": knomial_children, "binomial": binomial_children}


def hops_in_turn(children: list[list[int]], further: float) -> float:
    """Hops until the last rank has the buffer when each parent sends to its children in
    turn: its k-th child (from 0) receives ``1 + k·further`` hops after the parent did."""
    got = [0.0] * len(children)
    order = [0]
    for r in order:
        for k, c in enumerate(children[r]):
            got[c] = got[r] + 1.0 + k * further
            order.append(c)
    return max(got)


def sends_in_turn(collective: str, algorithm: str, p: int, spill: float) -> Optional[float]:
    """The hops of the whole buffer on the critical path of a tree broadcast whose parents
    send in turn (a library's :func:`ddlcomm.model.library.sends_in_turn`), None for other
    algorithms.  A further send of a buffer in the cache costs a hop; of one in memory
    (the part ``spill``), nothing on the critical path, as measured (why is not known)."""
    tree = TREE_CHILDREN.get(algorithm) if collective == "broadcast" else None
    if tree is None or p <= 1:
        return None
    return hops_in_turn(tree(p), 1.0 - spill)


def _posted(shape: Shape, nbytes: float) -> Schedule:
    rounds, depth, _ = shape
    return Schedule(rounds, depth * nbytes)


def bcast_linear(p: int, nbytes: float) -> Schedule:
    """Open MPI's ``basic_linear``: the root posts p-1 sends at once, the
    receivers copy together: p-1 posts, one n."""
    return _posted(star_shape(_p(p)), nbytes)


def bcast_chain(p: int, nbytes: float, fanout: int = CHAIN_FANOUT) -> Schedule:
    """``fanout`` chains from the root, whole buffer per hop (Open MPI's
    ``pipeline`` unsegmented is one chain): f posts, then one hop per rank of
    the longest chain."""
    return _posted(chain_shape(_p(p), fanout), nbytes)


def bcast_binary(p: int, nbytes: float) -> Schedule:
    """Heap-ordered binary tree, unsegmented: log2 p levels of n, two posts per parent."""
    return _posted(binary_shape(_p(p)), nbytes)


def bcast_split_binary(p: int, nbytes: float) -> Schedule:
    """Split binary tree: each half of the buffer goes down one binary tree of
    about (p-1)/2 ranks, then partners swap halves (one exchange of n/2)."""
    p = _p(p)
    if p <= 2:
        return native.schedule("broadcast", "binomial", p, nbytes)
    down = _posted(binary_shape((p + 1) // 2), nbytes / 2)
    return Schedule(down.rounds + 1, down.bytes + nbytes / 2)


def bcast_knomial(p: int, nbytes: float, radix: int = KNOMIAL_RADIX) -> Schedule:
    """k-nomial tree (radix 4): ⌈log_k p⌉ levels of n, up to k-1 posts per level."""
    return _posted(knomial_shape(_p(p), radix), nbytes)


def bcast_scatter_rd_allgather(p: int, nbytes: float) -> Schedule:
    """Binomial scatter of p blocks, then recursive-doubling allgather (MPICH's
    medium-size broadcast on powers of two): 2⌈log2 p⌉ rounds, 2(p-1)/p·n."""
    p = _p(p)
    if p == 1:
        return Schedule(0, 0.0)
    return Schedule(2 * _log2c(p), 2 * (p - 1) / p * nbytes)


def bcast_scatter_ring_allgather(p: int, nbytes: float) -> Schedule:
    """Binomial scatter, then ring allgather (MPICH's long broadcast, Open MPI's
    ``scatter_allgather_ring``): ⌈log2 p⌉ + p - 1 rounds, 2(p-1)/p·n."""
    p = _p(p)
    if p == 1:
        return Schedule(0, 0.0)
    return Schedule(_log2c(p) + p - 1, 2 * (p - 1) / p * nbytes)


# ------------------------------------------------------------------ gather
def gather_linear_sync(p: int, nbytes: float) -> Schedule:
    """Open MPI's ``linear_sync``: the root sends each rank a 0-byte go-ahead,
    then receives its contribution: 2(p-1) messages, (p-1)·n in."""
    p = _p(p)
    return Schedule(2 * (p - 1), (p - 1) * nbytes)


#: (collective, algorithm) -> terms(p, nbytes, **kwargs).  Names are what
#: ``--algorithm`` accepts where ddlcomm runs them, plus the libraries' own.
COSTS: dict[tuple[str, str], Callable[..., Schedule]] = {
    ("allreduce", "ring"): _native("allreduce", "ring"),
    ("allreduce", "rhd"): _native("allreduce", "rhd"),
    ("allreduce", "rabenseifner"): _native("allreduce", "rhd"),
    ("allreduce", "recursive_doubling"): allreduce_recursive_doubling,
    ("allreduce", "linear"): allreduce_linear,
    ("allreduce", "nonoverlapping"): allreduce_nonoverlapping,
    ("allreduce", "shm"): allreduce_shm,
    ("allreduce", "shm-map"): allreduce_shm_map,
    ("allreduce", "release_gather"): allreduce_release_gather,
    ("reduce", "binomial"): _native("reduce", "binomial"),
    ("broadcast", "binomial"): _native("broadcast", "binomial"),
    ("broadcast", "pipelined"): _native("broadcast", "pipelined"),
    ("broadcast", "linear"): bcast_linear,
    ("broadcast", "chain"): bcast_chain,
    ("broadcast", "binary"): bcast_binary,
    ("broadcast", "split_binary"): bcast_split_binary,
    ("broadcast", "knomial"): bcast_knomial,
    ("broadcast", "scatter_rd_allgather"): bcast_scatter_rd_allgather,
    ("broadcast", "scatter_ring_allgather"): bcast_scatter_ring_allgather,
    ("broadcast", "release_gather"): bcast_release_gather,
    ("gather", "linear"): _native("gather", "linear"),
    ("gather", "binomial"): _native("gather", "binomial"),
    ("gather", "linear_sync"): gather_linear_sync,
}

#: Algorithms whose ranks all share one node's memory (ddlcomm's shm and shm-map; MPICH's release_gather).
ONE_NODE = {("allreduce", "shm"), ("allreduce", "shm-map"), ("allreduce", "release_gather"),
            ("broadcast", "release_gather")}


def _pairs(p: int) -> int:
    return max(1, p // 2)


def _pow2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


#: (collective, algorithm) -> ranks that copy or reduce at the same time on
#: ``p`` ranks (with a single-copy shared-memory transport the receiver copies):
#: all of a ring or shm; the power-of-two core of rhd / recursive doubling; one
#: per pair of a tree's busiest round; the root alone in linear algorithms.
ACTIVE: dict[tuple[str, str], Callable[[int], int]] = {
    ("allreduce", "ring"): lambda p: p, ("allreduce", "shm"): lambda p: p, ("allreduce", "shm-map"): lambda p: p,
    ("allreduce", "rhd"): _pow2, ("allreduce", "rabenseifner"): _pow2,
    ("allreduce", "recursive_doubling"): _pow2, ("allreduce", "linear"): lambda p: 1,
    ("allreduce", "nonoverlapping"): _pairs, ("reduce", "binomial"): _pairs,
    ("broadcast", "binomial"): _pairs, ("broadcast", "pipelined"): lambda p: max(1, p - 1),
    ("broadcast", "linear"): lambda p: star_shape(p)[2],
    ("broadcast", "chain"): lambda p: chain_shape(p)[2],
    ("broadcast", "binary"): lambda p: binary_shape(p)[2],
    ("broadcast", "split_binary"): lambda p: 2 * binary_shape((p + 1) // 2)[2],
    ("broadcast", "knomial"): lambda p: knomial_shape(p)[2],
    ("broadcast", "scatter_rd_allgather"): lambda p: p,
    ("broadcast", "scatter_ring_allgather"): lambda p: p,
    ("allreduce", "release_gather"): lambda p: p,
    ("broadcast", "release_gather"): lambda p: p,
    ("gather", "linear"): lambda p: 1, ("gather", "linear_sync"): lambda p: 1,
    ("gather", "binomial"): _pairs,
}


def _halving(p: int, nbytes: float, times: int = 1) -> list[tuple[float, int]]:
    """Recursive halving's messages on the power-of-two core p', each ``times``: n/2, n/4,
    ..., n/p'."""
    return [(nbytes / (2 << k), times) for k in range(_pow2(p).bit_length() - 1)]


def _rhd_messages(p: int, nbytes: float) -> list[tuple[float, int]]:
    # the reduce-scatter halves, the allgather doubles back; off powers of two the extra
    # ranks hand their whole buffer in first and get it back last
    fold = [(float(nbytes), 2)] if _pow2(p) != p else []
    return fold + _halving(p, nbytes, 2)


#: (collective, algorithm) -> (p, n) -> the messages on its critical path as (bytes, how
#: many), for the algorithms whose messages are not all of one size n: a ring's 2(p-1)
#: blocks of n/p; recursive halving and doubling's n/2, n/4, ... and back; a scatter's
#: halving pieces, then a recursive-doubling allgather's doubling ones or a ring's blocks.
MESSAGES: dict[tuple[str, str], Callable[[int, float], list[tuple[float, int]]]] = {
    ("allreduce", "ring"): lambda p, n: [(n / p, 2 * (p - 1))],
    ("allreduce", "rhd"): _rhd_messages,
    ("allreduce", "rabenseifner"): _rhd_messages,
    ("broadcast", "scatter_rd_allgather"): lambda p, n: _halving(p, n, 2),
    ("broadcast", "scatter_ring_allgather"): lambda p, n: _halving(p, n) + [(n / p, p - 1)],
}


def messages_from(collective: str, algorithm: str, p: int, nbytes: float, terms: Schedule,
                  start: float) -> tuple[float, float]:
    """(How many, bytes) of the messages on the critical path of a call on one node (its
    ``terms``) that are ``start`` bytes or more: those of :data:`MESSAGES` that reach it; in
    the others, whose messages are n each, none below ``start``, else its rounds but no more
    than its bytes over n, and all its bytes: a tree's parent posts to all its children at
    once, so a level counts one, where a gather's root's messages follow one another.  None
    in the one-node shared-memory algorithms (:data:`ONE_NODE`), which send none."""
    if (collective, algorithm) in ONE_NODE or p < 2 or nbytes < start:
        return 0.0, 0.0                     # (no message is larger than n)
    messages = MESSAGES.get((collective, algorithm))
    if messages is None:
        return float(min(terms.rounds, terms.bytes / nbytes)), float(terms.bytes)
    large = [(size, count) for size, count in messages(p, nbytes) if size >= start]
    return float(sum(count for _, count in large)), float(sum(size * count for size, count in large))


def rendezvous_rounds(collective: str, algorithm: str, p: int, nbytes: float, terms: Schedule,
                      library: Optional[str]) -> float:
    """The messages on the critical path of a call on one node (its ``terms``, as
    posted) that go by rendezvous, at or beyond the library's eager limit
    (:func:`ddlcomm.model.library.eager_limit`; :func:`messages_from`): a tree's levels, as
    their handshakes overlap.  Counting each post instead (a broadcast tree's rounds) made
    Open MPI's 16-core broadcast 13.3/13.4% held out/fitted, against 9.2/14.0% by levels."""
    return messages_from(collective, algorithm, p, nbytes, terms, eager_limit(library))[0]


def pinned_pages(collective: str, algorithm: str, p: int, nbytes: float, terms: Schedule,
                 setting: "Setting", library_call: bool = True) -> float:
    """The small pages the single copies on the critical path of a library's call on one
    node (its ``terms``, in whole-buffer hops) read: the bytes of its messages at or beyond
    the library's single-copy threshold (:func:`ddlcomm.model.library.single_copy_from`;
    :func:`messages_from`) times the part of the buffer they come from on small pages
    (:func:`ddlcomm.model.node.small_page_part`: the caller's buffer of n, or, in the
    library's own call (``library_call``), its temporary,
    :func:`ddlcomm.model.library.from_temporary`), over 4 KiB."""
    _, copied = messages_from(collective, algorithm, p, nbytes, terms,
                              single_copy_from(setting.library))
    if not copied:
        return 0.0
    temporary = library_call and from_temporary(setting.library, collective, algorithm, p)
    return copied * small_page_part(nbytes, setting.thp, setting.memory, temporary,
                                    setting.huge_share) / SMALL_PAGE


def _binomial_gather_rounds(p: int) -> list[tuple[float, int]]:
    # round k: the root takes child 2^k's subtree while the ranks 2^k apart pair up
    return [(size, -(-(p - (1 << k)) // (2 << k)))
            for k, size in enumerate(gather_binomial.subtrees(p))]


#: (collective, algorithm) -> p -> [(bytes, copiers at once), ...]: the rounds of a
#: critical path along which the copies at once change, each with the bytes it moves
#: (in units of n): the memory contention of :func:`path_contention` is their
#: byte-weighted mean.  A binomial gather's root takes n, 2n, 4n, ... from its children
#: while p/2, p/4, p/8, ... pairs copy at once: on the 16-core node, priced at its busiest
#: round's (8 pairs at 16 ranks: 1.40x) its 12- and 16-rank gathers came out 20-40% too
#: slow; along its path (1.04x) within 13% (docs/benchmarks.md, "The model on the
#: 16-core node").  Unlisted algorithms copy :data:`ACTIVE` at once throughout.
ROUNDS_OF_COPIES: dict[tuple[str, str], Callable[[int], list[tuple[float, int]]]] = {
    ("gather", "binomial"): _binomial_gather_rounds,
}


def path_contention(collective: str, algorithm: str, p: int, ranks_on_node: int,
                    setting: "Setting") -> float:
    """How much slower each copy on the critical path goes than one alone
    (:func:`ddlcomm.model.node.contention`), at most one copier per core of the node:
    at the algorithm's busy ranks, or the byte-weighted mean over its
    :data:`ROUNDS_OF_COPIES`."""
    def slowed(copiers: int) -> float:
        return contention(setting.bandwidth, min(copiers, ranks_on_node, setting.cores or ranks_on_node))
    rounds = ROUNDS_OF_COPIES.get((native.ALIASES.get(collective, collective), algorithm))
    if rounds is None or p < 2:
        return slowed(busy_ranks(collective, algorithm, p))
    path = rounds(p)
    return sum(w * slowed(k) for w, k in path) / sum(w for w, _ in path)


def copies_per_byte(collective: str, algorithm: str, library: Optional[str]) -> float:
    """How many ranks copy each byte of a point-to-point message at once: 2 in a library
    whose sender copies into shared cells while its receiver copies out
    (:func:`ddlcomm.model.library.p2p_copies`: MPICH), else 1; 1 in the one-node
    shared-memory algorithms (:data:`ONE_NODE`)."""
    return 1.0 if (collective, algorithm) in ONE_NODE else p2p_copies(library)


def share(collective: str, algorithm: str, p: int, ranks_per_node: int,
          cores: Optional[int], library: Optional[str] = None) -> float:
    """Busy ranks per core, at least 1 (1 when ``cores`` is unknown).  Where both ranks of
    a pair copy (:func:`copies_per_byte`), both need a core: MPICH's 4-rank binomial
    gather on the 2-core machine (two pairs at once) held out 59.5% -> 41.6% so.  The
    memory's contention (:func:`path_contention`) still counts a pair's copies once: the
    cells stay in the caches, and counted twice there the 16-core gather went 9.6% ->
    12.8% held out.  Where the waiting ranks spin (:func:`ddlcomm.model.library.waiting`),
    every rank of the call keeps its turn on its core, working or not, so the busiest core
    sets the pace: its ranks, the call's ranks over the cores rounded up (3 ranks on 2
    cores run as 4 do; MPICH's release_gather on the 2-core machine held out: broadcast
    4.5% -> 2.8%, all-reduce 13.2% -> 5.1%)."""
    if not cores:
        return 1.0
    if waiting(library, algorithm) == "spin":
        return max(1.0, float(math.ceil(min(p, ranks_per_node) / cores)))
    busy = min(busy_ranks(collective, algorithm, p) * copies_per_byte(collective, algorithm, library),
               p, ranks_per_node)
    return max(1.0, busy / cores)


def busy_ranks(collective: str, algorithm: str, p: int) -> int:
    """How many ranks copy or reduce at once (:data:`ACTIVE`; all ``p`` if unlisted)."""
    return ACTIVE.get((native.ALIASES.get(collective, collective), algorithm), lambda q: q)(p)


def waits_per_byte(collective: str, algorithm: str, p: int, library: Optional[str]) -> bool:
    """Whether an oversubscribed call's copies wait for the scheduler per byte: not
    when one rank copies at a time (a chain, a linear gather's root) in a library
    whose lone copies run at full speed while the others wait
    (:func:`ddlcomm.model.library.copies_alone`: Open MPI)."""
    return not (busy_ranks(collective, algorithm, p) <= 1 and copies_alone(library))


def node_load(collective: str, algorithm: str, p: int, nbytes: float, ranks_on_node: int,
              setting: "Setting", library_call: bool = False) -> Load:
    """The :class:`Load` of a call of ``algorithm`` (resolved, not ``library``) on
    ``p`` ranks, ``ranks_on_node`` of them on one node, in ``setting``; ``library_call``:
    the library runs it (``library`` resolved), so its own temporaries count."""
    over = oversubscription(ranks_on_node, setting.cores, waiting(setting.library, algorithm))
    return Load(over,
                share(collective, algorithm, p, ranks_on_node, setting.cores, setting.library)
                if over > 0 else 1.0,
                spill(collective, ranks_on_node, nbytes, setting.cache),
                waits_per_byte(collective, algorithm, p, setting.library),
                path_contention(collective, algorithm, p, ranks_on_node, setting),
                fresh_bytes(setting.library, collective, algorithm, p, nbytes) if library_call else 0.0)


def priced(collective: str, algorithm: str, p: int, nbytes: float, kw: Mapping[str, Any],
           ranks_on_node: int, setting: "Setting", library_call: bool = False
           ) -> tuple[Schedule, Load]:
    """The terms and the :class:`Load` of a call of ``algorithm`` (resolved, with its
    keyword arguments ``kw``; ``library_call``: the library's own, see :func:`node_load`,
    whose local copies count: :func:`ddlcomm.model.library.local_copies`), as the library
    moves the bytes where all ``p`` ranks share one node (``ranks_on_node`` >= ``p``):
    messages beyond its eager limit by rendezvous (:func:`rendezvous_rounds`), single copies
    pinning the sender's small pages (:func:`pinned_pages`), sends in turn
    (:func:`sends_in_turn`), point-to-point bytes copied twice where the library also runs
    one-node collectives (:func:`ddlcomm.model.library.p2p_copies`)."""
    load = node_load(collective, algorithm, p, nbytes, ranks_on_node, setting, library_call)
    schedule = terms(collective, algorithm, p, nbytes, **kw)
    if ranks_on_node >= p or setting.node_transport:     # the library's own transport on a node
        load = load._replace(rndv=rendezvous_rounds(collective, algorithm, p, nbytes, schedule,
                                                    setting.library))
        hops = sends_in_turn(collective, algorithm, p, load.spill) \
            if library_sends_in_turn(setting.library) else None
        if hops is not None:                # the posts stay rounds; the bytes go hop by hop
            schedule = Schedule(schedule.rounds, hops * nbytes)
        load = load._replace(pages=pinned_pages(collective, algorithm, p, nbytes, schedule, setting,
                                                library_call))
        copies = copies_per_byte(collective, algorithm, setting.library)
        if copies != 1.0:
            schedule = Schedule(schedule.rounds, copies * schedule.bytes, schedule.reduced_bytes)
    local = local_copies(setting.library, collective, algorithm, p) if library_call else 0.0
    if local:
        schedule = Schedule(schedule.rounds, schedule.bytes + local * nbytes, schedule.reduced_bytes)
    return schedule, load


#: Collectives of the model beyond the harness's: the PS step.
MODEL_COLLECTIVES = ("ps",)


def algorithms(collective: str) -> list[str]:
    """Every algorithm name the model prices for ``collective`` (``library`` first)."""
    collective = native.ALIASES.get(collective, collective)
    if collective == "ps":
        return ["library", "<broadcast>+<gather>"]
    names = [a for c, a in COSTS if c == collective]
    if collective == "allreduce":
        names.append("hierarchical")
    return ["library", *names] if names else []


def collectives() -> list[str]:
    return list(dict.fromkeys([c for c, _ in COSTS] + list(MODEL_COLLECTIVES)))


def terms(collective: str, algorithm: str, p: int, nbytes: float, **kwargs) -> Schedule:
    """The terms of one call (see the module table); a UsageError lists the choices."""
    collective = native.ALIASES.get(collective, collective)
    fn = COSTS.get((collective, algorithm))
    if fn is None:
        known = algorithms(collective)
        if not known:
            raise UsageError(f"no cost model for collective {collective!r}",
                             f"modelled: {', '.join(collectives())}")
        raise UsageError(f"no cost model for {collective} algorithm {algorithm!r}",
                         f"choose from {', '.join(known)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or nbytes < 0:
        raise UsageError(f"message size must be a number of bytes >= 0, not {nbytes!r}")
    return fn(p, nbytes, **kwargs)


@dataclass(frozen=True)
class Setting:
    """Where a call runs: the library whose ``library`` algorithm is meant, the
    ranks per node (``None``: one node's worth of cores each, so none are
    oversubscribed), the cores per node, and the inter-node parameters of a
    hierarchical all-reduce with the leaders' algorithm, the last-level
    cache of a node in bytes (``None``: no spill term), the node's copy
    bandwidth by concurrent copies (``None``: no contention term), its
    transparent-huge-page mode, the memory kind of the buffers and the part of them
    measured on huge pages (``thp`` and ``huge_share`` None: no page term;
    :func:`ddlcomm.model.node.small_page_part`), and whether messages between nodes go
    as the node's own transport moves them (``node_transport``: a prediction past the
    node of a fit made on one host, where no network is modelled; else they go without
    the node's rendezvous, single copies and sends in turn, as between the containers
    of a fit made across containers, whose α and β are that transport's)."""

    library: Optional[str] = None
    ranks_per_node: Optional[int] = None
    cores: Optional[int] = None
    inter: Optional[Params] = None
    leaders_algorithm: str = "auto"
    cache: Optional[float] = None
    bandwidth: Optional[Bandwidth] = None
    thp: Optional[str] = None
    memory: Optional[str] = None
    huge_share: Optional[float] = None
    node_transport: bool = False
    #: the ranks dealt in blocks over this many containers, each a host of its own (a fit
    #: made across containers): the most ranks on one is ceil(p / containers)
    containers: Optional[int] = None
    #: bytes per element of the messages (MPICH chooses its all-reduce by element count)
    itemsize: int = 4


def resolve(collective: str, algorithm: str, p: int, nbytes: float,
            setting: Setting = Setting()) -> tuple[str, dict]:
    """``algorithm`` made concrete: ``library`` becomes the library's choice, that of one
    node where ``setting`` puts every rank on one (its ranks per node, else the most ranks
    of a container, else its cores, at least ``p``; not where none is known)."""
    if algorithm != "library":
        return algorithm, {}
    per_node = setting.ranks_per_node or (-(-p // setting.containers) if setting.containers else setting.cores)
    return choose(setting.library, collective, p, nbytes, setting.itemsize,
                  one_node=bool(per_node) and per_node >= p)


def time(collective: str, algorithm: str, p: int, nbytes: float, params: Params,
         setting: Setting = Setting()) -> float:
    """Predicted seconds of one call on ``p`` ranks of ``nbytes`` each."""
    collective = native.ALIASES.get(collective, collective)
    p = _p(p)
    if collective == "ps":
        return ps_step_time(algorithm, p, nbytes, params, setting)
    per_node = setting.ranks_per_node or (min(p, setting.cores) if setting.cores else p)
    if algorithm == "hierarchical":
        if collective != "allreduce":
            raise UsageError("the hierarchical algorithm is an all-reduce")
        return hierarchical_time(p, nbytes, params, setting)
    name, kw = resolve(collective, algorithm, p, nbytes, setting)
    if (collective, name) in ONE_NODE and per_node < p:
        raise UsageError(f"{collective} {name} runs on one node, and {p} ranks at {per_node} "
                         "a node span several", f"price one node of {p} ranks (model predict: "
                         f"--ranks-per-node {p}; model ssgd: --workers-per-node) or choose another "
                         "--algorithm")
    return params.time(*priced(collective, name, p, nbytes, kw, min(per_node, p), setting,
                               library_call=algorithm == "library"))


def hierarchical_time(p: int, nbytes: float, intra: Params, setting: Setting) -> float:
    """``comm/hierarchical.py``: shared-memory reduce inside each node (copy in,
    barrier, slice reduction, barrier; intra-node parameters), the leaders'
    all-reduce among one rank per node (inter-node parameters; the leaders'
    algorithm ``auto`` = ring from ``RING_MIN_BYTES`` up, rhd below, as the
    implementation does; or ``ring``, ``rhd``, ``library``), a barrier and the
    copy out."""
    g = setting.ranks_per_node or (setting.cores or p)
    g = max(1, min(g, p))
    nodes = math.ceil(p / g)
    inter = setting.inter or intra
    inside = node_load("allreduce", "shm", g, nbytes, g, setting)
    reduce_in, fan_out = allreduce_shm_phases(g, nbytes)
    t = intra.time(reduce_in, inside) + intra.time(fan_out, inside)
    if nodes > 1:
        leaders = setting.leaders_algorithm
        if leaders == "auto":                     # comm/hierarchical.py's rule
            leaders = leaders_algorithm(nbytes)
        # one leader per node: the library's inter-node choice, never a one-node one
        name, kw = resolve("allreduce", leaders, nodes, nbytes, replace(setting, ranks_per_node=1))
        t += inter.time(terms("allreduce", name, nodes, nbytes, **kw),
                        Load(spill=spill("allreduce", 1, nbytes, setting.cache)))
    return t


def ps_step_time(algorithm: str, p: int, nbytes: float, params: Params,
                 setting: Setting = Setting(), gather_params: Optional[Params] = None,
                 gather_setting: Optional[Setting] = None) -> float:
    """One PS step on ``p`` ranks (a server and p-1 workers): the server
    broadcasts the parameters, then gathers every worker's gradients, both
    through its own link.  ``algorithm``: ``library`` or ``BCAST+GATHER``
    (e.g. ``binomial+linear``); ``gather_params``, ``gather_setting``: the
    gather's own parameters and setting (default: the broadcast's)."""
    if p < 2:
        raise UsageError(f"a PS step needs a server and a worker: {p} rank", "give 2 ranks or more")
    if algorithm == "library":
        bcast, gather = "library", "library"
    else:
        bcast, sep, gather = algorithm.partition("+")
        if not sep or not bcast or not gather:
            raise UsageError(f"PS step algorithm {algorithm!r} is not library or BCAST+GATHER",
                             "e.g. binomial+linear")
    return time("broadcast", bcast, p, nbytes, params, setting) \
        + time("gather", gather, p, nbytes, gather_params or params, gather_setting or setting)


def allreduce_time(fit, algorithm: str, p: int, nbytes: float, ranks_per_node: Optional[int] = None,
                   itemsize: int = 4, **want: Optional[str]) -> float:
    """Seconds of one all-reduce of ``nbytes`` on ``p`` ranks with a calibrated
    ``fit`` (:class:`ddlcomm.model.calibrate.Fit`; ``want`` picks its
    parameter set: library, backend, placement, form) or plain :class:`Params`;
    ``ranks_per_node`` (default: the fitted node's cores) share a node; ``itemsize``: the
    bytes of an element (MPICH chooses its all-reduce by element count).

    ``functools.partial(allreduce_time, fit, "ring", p)`` is the ``comm``
    callable :func:`ddlcomm.model.ssgd.predict` takes.
    """
    if isinstance(fit, Params):
        return time("allreduce", algorithm, p, nbytes, fit,
                    Setting(ranks_per_node=ranks_per_node, itemsize=itemsize))
    params, setting = fit.params_for("allreduce", algorithm, nbytes, **want)
    return time("allreduce", algorithm, p, nbytes, params,
                replace(setting, ranks_per_node=ranks_per_node, itemsize=itemsize))


def ps_time(fit, algorithm: str, p: int, nbytes: float, setting: Optional[Setting] = None,
            ranks_per_node: Optional[int] = None, **want: Optional[str]) -> float:
    """Seconds of one PS step (see :func:`ps_step_time`) with a fit (its
    broadcast's and gather's parameter sets, picked by ``want``) or Params;
    ``setting`` replaces the fit's own (its library and cores; each set keeps the
    cache it was fitted with); ``ranks_per_node``, where given, share a node."""
    def placed(s: Setting) -> Setting:
        return s if ranks_per_node is None else replace(s, ranks_per_node=ranks_per_node)
    if isinstance(fit, Params):
        return ps_step_time(algorithm, p, nbytes, fit, placed(setting or Setting()))
    b_params, own = fit.params_for("broadcast", "library", nbytes, **want)
    g_params, g_own = fit.params_for("gather", "library", nbytes, **want)
    if setting is not None:               # the caller's placement, each set's own cache
        own, g_own = (replace(setting, cache=s.cache) for s in (own, g_own))
    return ps_step_time(algorithm, p, nbytes, b_params, placed(own), g_params, placed(g_own))
