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
allreduce  shm                     2 barriers (2⌈log2 p⌉); 2n copied (in, out); (p-1)/p·n
allreduce  hierarchical            shm reduce + fan-out in each node (intra-node
                                   parameters) + the leaders' all-reduce (inter-node)
broadcast  binomial, pipelined     native: ⌈log2 p⌉ rounds of n; (p-2+m) rounds of n/m
broadcast  linear                  the root sends p-1 messages of n
broadcast  chain                   fan-out f chains (Open MPI: f = 4), no segments
broadcast  binary                  heap-ordered binary tree, each parent sends twice
broadcast  split_binary            two binary trees of n/2 each, then one exchange
broadcast  knomial                 radix k = 4: (k-1)·⌈log_k p⌉ rounds of n
broadcast  scatter_rd_allgather    binomial scatter + recursive-doubling allgather
broadcast  scatter_ring_allgather  binomial scatter + ring allgather
gather     linear, binomial        native: (p-1) messages of n; ⌈log2 p⌉ rounds, (p-1)n in
gather     linear_sync             linear, each sender first waits for a 0-byte go-ahead
ps         <bcast>+<gather>        PS step: broadcast, then gather, both through
                                   the server's link (``library`` = each library's own)
=========  ======================  =============================================

Oversubscription: with more ranks on a node than cores (``over`` =
(ranks on the node - cores) / ranks on the node > 0: the fraction of ranks
waiting for a core at any moment) two things happen.  Copies and
reductions of ranks that work at the same time share the cores: the β and γ
terms are multiplied by ``share`` = max(1, busy ranks / cores), where the
busy ranks are those of the algorithm that copy or reduce at once
(:data:`ACTIVE`: all p in a ring, the power-of-two core in recursive halving
and doubling, the root alone in a linear gather, ...).  And ranks wait for
the scheduler: the fitted ``alpha_over`` (seconds per message per unit of
``over``) and ``beta_over`` (seconds per byte moved or reduced per unit of
``over``) add ``over·(rounds·alpha_over + (bytes + reduced)·beta_over)``:
a message whose peer is off its core waits for the scheduler.  Both are 0 unless a fit saw oversubscribed points; without oversubscription
the time is the plain α-β-γ one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Optional

from ..comm import native
from ..comm.native import Schedule
from ..errors import UsageError

#: Open MPI's chain broadcast fan-out (``coll_tuned_bcast_chain_fanout``, default 4).
CHAIN_FANOUT = 4
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

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value) or value < 0:
                raise UsageError(f"model parameter {name} must be a number >= 0, not {value!r}")

    def time(self, terms: Schedule, over: float = 0.0, share: float = 1.0) -> float:
        """Seconds for ``terms``; ``over`` is the oversubscription (0: none) and
        ``share`` the busy ranks per core (>= 1) that slow copies and reductions."""
        if over <= 0:
            return terms.time(self.alpha, self.beta, self.gamma)
        return (terms.rounds * self.alpha
                + max(1.0, share) * (terms.bytes * self.beta + terms.reduced_bytes * self.gamma)
                + over * (terms.rounds * self.alpha_over
                          + (terms.bytes + terms.reduced_bytes) * self.beta_over))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, float]) -> "Params":
        return cls(**{k: float(d.get(k, 0.0)) for k in ("alpha", "beta", "gamma",
                                                        "alpha_over", "beta_over")})


def oversubscription(ranks_per_node: int, cores: Optional[int]) -> float:
    """(ranks on the node - cores) / ranks on the node when above 0, else 0
    (``cores`` None: 0): the fraction of the node's ranks that wait for a core
    at any moment when all are runnable."""
    if not cores or ranks_per_node <= cores:
        return 0.0
    return (ranks_per_node - cores) / ranks_per_node


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
    """``comm/shm.py``: each rank copies n bytes in; barrier; reduces its 1/p
    slice reading all p inputs ((p-1)/p·n reduced); barrier; copies n out.
    A barrier is ⌈log2 p⌉ messages (recursive doubling/dissemination)."""
    p = _p(p)
    return Schedule(2 * _log2c(p), 2.0 * nbytes, (p - 1) / p * nbytes)


def allreduce_shm_phases(p: int, nbytes: float) -> tuple[Schedule, Schedule]:
    """The intra-node halves of a hierarchical all-reduce: (reduce into the
    segment: copy in, barrier, slice reduction, barrier), (fan-out: copy out)."""
    p = _p(p)
    return (Schedule(2 * _log2c(p), float(nbytes), (p - 1) / p * nbytes),
            Schedule(_log2c(p), float(nbytes), 0.0))


# ------------------------------------------------------------------ broadcast
def bcast_linear(p: int, nbytes: float) -> Schedule:
    """The root sends the buffer to each other rank in turn."""
    p = _p(p)
    return Schedule(p - 1, (p - 1) * nbytes)


def bcast_chain(p: int, nbytes: float, fanout: int = CHAIN_FANOUT) -> Schedule:
    """``fanout`` chains from the root, whole buffer per hop: the root sends
    min(f, p-1) times, the longest chain has ⌈(p-1)/f⌉ ranks."""
    p = _p(p)
    if p == 1:
        return Schedule(0, 0.0)
    f = min(fanout, p - 1)
    rounds = f + math.ceil((p - 1) / f) - 1
    return Schedule(rounds, rounds * nbytes)


def _binary_depth_rounds(p: int) -> int:
    """Critical path of a heap-ordered binary tree (node i's children 2i+1, 2i+2;
    a parent sends to its left child, then its right one): the latest arrival."""
    if p <= 1:
        return 0
    d = p.bit_length() - 1                      # depth of the last level
    if d == 0:
        return 0
    j_max = p - (1 << d)                        # offsets 0..j_max exist on the last level
    best_pop = max(bin(j_max).count("1"), j_max.bit_length() - 1)
    last = d + best_pop                         # left edge costs 1, right edge 2
    full = 2 * (d - 1)                          # rightmost node of the full level above
    return max(last, full)


def bcast_binary(p: int, nbytes: float) -> Schedule:
    """Binary tree, unsegmented: each parent sends the whole buffer to its two
    children in turn; time is the latest arrival."""
    rounds = _binary_depth_rounds(_p(p))
    return Schedule(rounds, rounds * nbytes)


def bcast_split_binary(p: int, nbytes: float) -> Schedule:
    """Split binary tree: each half of the buffer goes down one binary tree of
    about (p-1)/2 ranks, then partners swap halves (one exchange of n/2)."""
    p = _p(p)
    if p <= 2:
        return native.schedule("broadcast", "binomial", p, nbytes)
    half = (p - 1 + 1) // 2                     # ranks in the larger subtree
    rounds = 1 + _binary_depth_rounds(half) + 1
    return Schedule(rounds, rounds * nbytes / 2)


def bcast_knomial(p: int, nbytes: float, radix: int = KNOMIAL_RADIX) -> Schedule:
    """k-nomial tree: ⌈log_k p⌉ levels, a parent sends to up to k-1 children per level."""
    p = _p(p)
    if p == 1:
        return Schedule(0, 0.0)
    levels, reach = 0, 1
    while reach < p:
        reach *= radix
        levels += 1
    rounds = levels * (radix - 1)
    return Schedule(rounds, rounds * nbytes)


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
    ("gather", "linear"): _native("gather", "linear"),
    ("gather", "binomial"): _native("gather", "binomial"),
    ("gather", "linear_sync"): gather_linear_sync,
}

def _pairs(p: int) -> int:
    return max(1, p // 2)


def _pow2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


#: (collective, algorithm) -> ranks that copy or reduce at the same time on
#: ``p`` ranks (with a single-copy shared-memory transport the receiver copies):
#: all of a ring or shm; the power-of-two core of rhd / recursive doubling; one
#: per pair of a tree's busiest round; the root alone in linear algorithms.
ACTIVE: dict[tuple[str, str], Callable[[int], int]] = {
    ("allreduce", "ring"): lambda p: p, ("allreduce", "shm"): lambda p: p,
    ("allreduce", "rhd"): _pow2, ("allreduce", "rabenseifner"): _pow2,
    ("allreduce", "recursive_doubling"): _pow2, ("allreduce", "linear"): lambda p: 1,
    ("allreduce", "nonoverlapping"): _pairs, ("reduce", "binomial"): _pairs,
    ("broadcast", "binomial"): _pairs, ("broadcast", "pipelined"): lambda p: max(1, p - 1),
    ("broadcast", "linear"): lambda p: 1, ("broadcast", "chain"): lambda p: min(CHAIN_FANOUT, max(1, p - 1)),
    ("broadcast", "binary"): _pairs, ("broadcast", "split_binary"): _pairs,
    ("broadcast", "knomial"): _pairs, ("broadcast", "scatter_rd_allgather"): lambda p: p,
    ("broadcast", "scatter_ring_allgather"): lambda p: p,
    ("gather", "linear"): lambda p: 1, ("gather", "linear_sync"): lambda p: 1,
    ("gather", "binomial"): _pairs,
}


def share(collective: str, algorithm: str, p: int, ranks_per_node: int,
          cores: Optional[int]) -> float:
    """Busy ranks per core, at least 1 (1 when ``cores`` is unknown)."""
    if not cores:
        return 1.0
    busy = ACTIVE.get((native.ALIASES.get(collective, collective), algorithm), lambda q: q)(p)
    return max(1.0, min(busy, ranks_per_node) / cores)


#: Composite algorithms priced from other entries (see :func:`time`).
COMPOSITES = ("hierarchical",)
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
    hierarchical all-reduce with the leaders' algorithm."""

    library: Optional[str] = None
    ranks_per_node: Optional[int] = None
    cores: Optional[int] = None
    inter: Optional[Params] = None
    leaders_algorithm: str = "auto"


def resolve(collective: str, algorithm: str, p: int, nbytes: float,
            setting: Setting = Setting()) -> tuple[str, dict]:
    """``algorithm`` made concrete: ``library`` becomes the library's choice."""
    if algorithm != "library":
        return algorithm, {}
    from .library import choose
    return choose(setting.library, collective, p, nbytes)


def time(collective: str, algorithm: str, p: int, nbytes: float, params: Params,
         setting: Setting = Setting()) -> float:
    """Predicted seconds of one call on ``p`` ranks of ``nbytes`` each."""
    collective = native.ALIASES.get(collective, collective)
    p = _p(p)
    if collective == "ps":
        return ps_step_time(algorithm, p, nbytes, params, setting)
    per_node = setting.ranks_per_node or (min(p, setting.cores) if setting.cores else p)
    over = oversubscription(min(per_node, p), setting.cores)
    if algorithm == "hierarchical":
        if collective != "allreduce":
            raise UsageError("the hierarchical algorithm is an all-reduce")
        return hierarchical_time(p, nbytes, params, setting)
    name, kw = resolve(collective, algorithm, p, nbytes, setting)
    busy = share(collective, name, p, min(per_node, p), setting.cores) if over > 0 else 1.0
    return params.time(terms(collective, name, p, nbytes, **kw), over, busy)


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
    over = oversubscription(g, setting.cores)
    busy = max(1.0, g / setting.cores) if over > 0 else 1.0
    reduce_in, fan_out = allreduce_shm_phases(g, nbytes)
    t = intra.time(reduce_in, over, busy) + intra.time(fan_out, over, busy)
    if nodes > 1:
        leaders = setting.leaders_algorithm
        if leaders == "auto":                     # comm/hierarchical.py's rule
            from ..comm.hierarchical import leaders_algorithm
            leaders = leaders_algorithm(nbytes)
        name, kw = resolve("allreduce", leaders, nodes, nbytes, setting)
        t += inter.time(terms("allreduce", name, nodes, nbytes, **kw))
    return t


def ps_step_time(algorithm: str, p: int, nbytes: float, params: Params,
                 setting: Setting = Setting()) -> float:
    """One PS step on ``p`` ranks (a server and p-1 workers): the server
    broadcasts the parameters, then gathers every worker's gradients, both
    through its own link.  ``algorithm``: ``library`` or ``BCAST+GATHER``
    (e.g. ``binomial+linear``)."""
    if algorithm == "library":
        bcast, gather = "library", "library"
    else:
        bcast, sep, gather = algorithm.partition("+")
        if not sep or not bcast or not gather:
            raise UsageError(f"PS step algorithm {algorithm!r} is not library or BCAST+GATHER",
                             "e.g. binomial+linear")
    return time("broadcast", bcast, p, nbytes, params, setting) \
        + time("gather", gather, p, nbytes, params, setting)


def allreduce_time(fit, algorithm: str, p: int, nbytes: float) -> float:
    """Seconds of one all-reduce of ``nbytes`` on ``p`` ranks with a calibrated
    ``fit`` (:class:`ddlcomm.model.calibrate.Fit`) or plain :class:`Params`.

    ``functools.partial(allreduce_time, fit, "ring", p)`` is the ``comm``
    callable :func:`ddlcomm.model.ssgd.predict` takes.
    """
    if isinstance(fit, Params):
        return time("allreduce", algorithm, p, nbytes, fit)
    params, setting = fit.params_for("allreduce", algorithm, nbytes)
    return time("allreduce", algorithm, p, nbytes, params, setting)


def ps_time(fit, algorithm: str, p: int, nbytes: float) -> float:
    """Seconds of one PS step (see :func:`ps_step_time`) with a fit or Params."""
    if isinstance(fit, Params):
        return ps_step_time(algorithm, p, nbytes, fit)
    b_params, setting = fit.params_for("broadcast", "library", nbytes)
    g_params, _ = fit.params_for("gather", "library", nbytes)
    if algorithm == "library":
        bcast, gather = "library", "library"
    else:
        bcast, _, gather = algorithm.partition("+")
    return time("broadcast", bcast, p, nbytes, b_params, setting) \
        + time("gather", gather, p, nbytes, g_params, setting)
