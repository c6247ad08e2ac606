"""Fit α, β, γ (and the oversubscription terms) to stored points; report the error.

Each stored point (a collective at one size and rank count) gives one
equation: its measured time = the cost model's terms of the algorithm that
ran (:mod:`ddlcomm.model.costs`; ``library`` resolved by
:mod:`ddlcomm.model.library`) times the unknown parameters::

    t = rounds·α + share·c·(bytes·β + reduced·γ + spill·(bytes + reduced)·β_spill)
        + over·(rounds·α_over + [per_byte]·(bytes + reduced)·β_over)
        + share·fresh·β_fault + share·(bytes·β_core + reduced·γ_core)
        + rndv·α_rndv + share·pages·α_page

(:func:`ddlcomm.model.node.features`, the node's :class:`~ddlcomm.model.node.Load`
from :func:`~ddlcomm.model.costs.node_load`, the same as a prediction's; ``c`` the
measured memory contention among the copies that run at once).  ``over`` > 0 when there are
more ranks on the node than cores, by how the
library waits (:func:`ddlcomm.model.node.oversubscription`; the harness
runs every rank on one host, so ranks on the node = ranks) and ``share`` =
max(1, busy ranks / cores) (the ranks per core rounded up where the waiting ranks
spin) multiplies the β and γ columns (:func:`ddlcomm.model.costs.share`); the two
``_over`` columns are left out when no point of a group is oversubscribed; ``per_byte``
is 0 where one rank copies at a time in a library whose lone copies run at full speed
(:func:`ddlcomm.model.costs.waits_per_byte`).
``spill`` = 1 where the
ranks' buffers outgrow the cache, else 0
(:func:`ddlcomm.model.node.spill`; 0 leaves the column out): copies from memory
cost β + β_spill a byte, from cache β.  ``cache`` is *fitted* per parameter set, from
the machine's last-level cache down (:func:`effective_cache`): what a VM reports is the host's
(300 MiB on the 16-core node, whose 2-rank times per byte rise between 4 and 16
MiB), and one core's share of it is less.  ``β_core`` and ``γ_core`` are the part of a
byte's cost that contention does not slow (:func:`ddlcomm.model.node.features`); where no
point of a group has contention (c = 1) their columns are the β and γ columns, and are
left out (:data:`CORE_TWINS`).

**Metric.** The cost functions give the critical path, the last rank's time: the
fit takes ``p50`` by default, the median call of the slowest rank.  ``avg`` (the
mean over ranks, OSU's) is lower wherever ranks finish apart: a broadcast's
leaves and a gather's senders return early (on the 16-core node the mean of
Open MPI's 6-rank chain broadcast was 3.3 hops, its last rank 5).

**Loss.** The errors are relative, (model - t) / t, so a 4-byte point at 1 µs
counts as much as a 64 MiB point at 30 ms (an absolute loss would fit the largest
sizes only).  The fit minimises their Huber loss (:func:`huber`): e²/2 within δ =
:data:`HUBER_DELTA` (10%), δ·(|e| - δ/2) beyond, so a point off by more than 10%
pulls the parameters by its sign, not by its size: one disturbed measurement (a
single repetition on a noisy VM) bends the fit no more than any other point that
disagrees.  Least squares first (each row weighted 1/t), then reweighted least squares
(Huber's weights) until the parameters settle.  Against plain least squares on the
committed data of three machines the fitted points' median |error| fell in 22 of 24
families and rose in none (mean 9.2% -> 6.6%), the held-out points' mean was about
the same (16.9% -> 16.4%; docs/benchmarks.md, "The model on the 16-core node").
Parameters are constrained to be >= 0 (Lawson-Hanson non-negative least squares),
so none can go negative to buy a better fit.

**Groups.** One parameter set per backend × library × placement × form ×
algorithm × collective (``shared=True``: one set across collectives) ×
size regime (``split``: sizes at which the fit starts a new set of
parameters, e.g. where a library switches from eager to rendezvous
messages).  Placement is ``host`` or ``containers=K``, with the memory kind
and binding.

**Repeated points.** The same point (backend, library, placement, form,
algorithm, collective, size, ranks, held out or not) measured in several
runs is one equation: by default the *fastest* of its measurements
(``combine="min"``), because on a shared machine interference from other
jobs only ever adds time, so the best of repeated runs is the closest to
the undisturbed cost; ``median`` and ``none`` (every run its own equation)
are the alternatives.

**Holdout.** Points matching a holdout spec (``ranks=4``, ``bytes=1MiB:64MiB``,
``run=7``) are left out of the fit and predicted afterwards; their errors are
reported apart.  Errors are relative: (model - measured) / measured.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from ..comm.names import split as split_name
from ..dtypes import DTYPES
from ..errors import UsageError
from ..measure.stats import relative_error
from ..pages import senders_huge_share
from ..units import parse_size, typed_size
from . import costs, node
from .costs import Params, Setting
from .library import folded
from .node import Bandwidth

FIT_FORMAT = "ddlcomm-model-fit"
FIT_VERSION = 1
#: Measured time each point contributes (µs), by --metric name.
METRICS = {"avg": "t_avg_us", "p50": "t_p50_us", "min": "t_min_us", "max": "t_max_us"}
#: How repeated measurements of one point become one equation.
COMBINE = ("min", "median", "none")
#: Collectives the fit understands (the model's cost table).
FITTED = ("allreduce", "broadcast", "gather", "reduce")
COLUMNS = costs.PARAMETERS


# ------------------------------------------------------------------ NNLS
def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """x >= 0 minimising ||a x - b|| (Lawson and Hanson's active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * max(1.0, float(np.abs(a).max(initial=0.0))) * max(m, n)
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-1.0) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            idx = np.flatnonzero(passive)
            z[idx] = np.linalg.lstsq(a[:, idx], b, rcond=None)[0]
            if (z[idx] > 0).all():
                x = z
                break
            neg = idx[z[idx] <= 0]
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


# ------------------------------------------------------------------ points
def placement_of(point: Mapping[str, Any]) -> str:
    """``host`` or ``containers=K``, plus the memory kind and binding when not defaults."""
    parts = [f"containers={point['containers']}" if point.get("containers") else "host"]
    if point.get("memory") not in (None, "numpy"):
        parts.append(f"memory={point['memory']}")
    if point.get("bind") not in (None, "none"):
        parts.append(f"bind={point['bind']}")
    return ",".join(parts)


def memory_of(placement: Optional[str]) -> Optional[str]:
    """The memory kind a :func:`placement_of` names (None: NumPy's allocator)."""
    for part in (placement or "").split(","):
        if part.startswith("memory="):
            return part[len("memory="):]
    return None


def ranks_per_host(point: Mapping[str, Any]) -> Optional[int]:
    """The most ranks of a point on one host (each container is a host of its own: MPICH
    then runs no shared-memory collectives across them); None where not recorded (a
    point then counts as one node's, as its load does)."""
    hosts = point.get("hosts") or []
    return max(Counter(hosts).values()) if hosts else None


def itemsize_of(point: Mapping[str, Any]) -> int:
    """Bytes per element of a point's dtype (4 where not recorded or not known)."""
    found = DTYPES.get(point.get("dtype") or "")
    return found.itemsize if found is not None else 4


def algorithm_of(point: Mapping[str, Any]) -> str:
    """The algorithm that ran (``auto`` resolved through ``algorithm_run``)."""
    alg = point.get("algorithm") or "library"
    return (point.get("algorithm_run") or alg) if alg == "auto" else alg


def library_of(point: Mapping[str, Any]) -> str:
    """The library the point ran on: the MPI library, or the backend (``gloo``)."""
    return point.get("library") or point.get("backend") or "?"


@dataclass(frozen=True)
class Holdout:
    """Points left out of the fit: one field (ranks, bytes or run) and its values."""

    field: str
    lo: float
    hi: float
    values: frozenset = frozenset()
    text: str = ""

    def value(self, point: Mapping[str, Any]) -> Any:
        """The point's value of this field."""
        return point.get({"ranks": "ranks", "bytes": "bytes", "run": "run_id"}[self.field])

    def matches(self, point: Mapping[str, Any]) -> bool:
        value = self.value(point)
        if value is None:
            return False
        if self.values:
            return value in self.values
        return self.lo <= value <= self.hi


def parse_holdout(text: str) -> Holdout:
    """``ranks=4``, ``ranks=4,8``, ``ranks=4:64``, ``bytes=1MiB:64MiB``, ``run=7``."""
    name, sep, spec = text.partition("=")
    name, spec = name.strip(), spec.strip()
    if not sep or name not in ("ranks", "bytes", "run") or not spec:
        raise UsageError(f"cannot parse --holdout {text!r}",
                         "use ranks=4, ranks=4:64, bytes=1MiB:64MiB, bytes=64KiB,1MiB or run=7")
    conv = (lambda t: parse_size(t, "--holdout")) if name == "bytes" else _int(name)
    if ":" in spec:
        lo_t, _, hi_t = spec.partition(":")
        lo, hi = conv(lo_t), conv(hi_t)
        if hi < lo:
            raise UsageError(f"--holdout {text!r}: the range ends below its start")
        return Holdout(name, lo, hi, text=text)
    values = frozenset(conv(v) for v in spec.split(",") if v.strip())
    return Holdout(name, 0, 0, values, text=text)


def _check_holdouts(holdout: Sequence[Holdout], rows: Sequence[Row]) -> None:
    """UsageError for a holdout that matches no point: a typo would leave the fit
    untested, silently."""
    for h in holdout:
        if not any(h.matches(r.point) for r in rows):
            raise UsageError(f"--holdout {h.text} matches no point",
                             f"the points have {h.field} {_values_of(h, rows)}")


def holdout_notes(holdout: Sequence[Holdout], rows: Sequence[Row]) -> list[str]:
    """A ``run=`` holdout that matched runs of several databases (run ids count in each) (pure)."""
    notes = []
    for h in holdout:
        sources = {r.point.get("source") for r in rows if h.field == "run" and h.matches(r.point)}
        if len(sources) > 1:
            notes.append(f"--holdout {h.text} held out that run id in each of {len(sources)} "
                         f"databases: {', '.join(sorted(map(str, sources)))}")
    return notes


def _values_of(h: Holdout, rows: Sequence[Row]) -> str:
    """The values of ``h``'s field among the rows' points, as a user types them."""
    found = sorted({h.value(r.point) for r in rows} - {None})
    shown = [typed_size(v) if h.field == "bytes" else str(v) for v in found]
    return ", ".join(shown[:12]) + (f" ... ({len(shown)} in all)" if len(shown) > 12 else "")


def _int(what: str):
    def conv(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise UsageError(f"--holdout {what} must be whole numbers, got {v!r}") from None
        if n < 1:
            raise UsageError(f"--holdout {what} must be at least 1, got {n}")
        return n
    return conv


@dataclass
class Row:
    """One point ready for the fit: its terms and what was measured."""

    point: dict
    key: tuple
    algorithm: str               # the cost model's algorithm (library resolved)
    terms: Any
    load: node.Load
    measured_s: float
    heldout: bool

    def features(self) -> np.ndarray:
        """The columns of :data:`COLUMNS`: what each parameter is multiplied by."""
        return np.array(node.features(self.terms, self.load), float)

    def model(self, params: Params) -> float:
        return params.time(self.terms, self.load)


KEY_FIELDS = ("backend", "library", "placement", "form", "algorithm", "collective", "regime")
#: The fields that tell a fit's parameter sets apart (what --backend/--library/... choose).
SET_KEYS = KEY_FIELDS[:4]


def set_label(key: Mapping[str, Any]) -> str:
    """A parameter set's key as notes name it: ``mpi/Open MPI/host/buffer/library/allreduce``."""
    return "/".join(str(key.get(f)) for f in KEY_FIELDS if key.get(f) not in (None, "*"))


def regime_of(nbytes: float, split: Sequence[int]) -> str:
    """The size band of ``nbytes`` among the ``split`` points: ``lo:hi`` (``*`` open), each
    bound exact (``64KiB``; ``100000B`` where a unit would round it), as :meth:`Group.covers`
    reads it back."""
    lo: Optional[int] = None
    for s in sorted(split):
        if nbytes < s:
            return f"{typed_size(lo) if lo else '*'}:{typed_size(s)}"
        lo = s
    return f"{typed_size(lo)}:*" if lo else "*"


def make_rows(points: Iterable[Mapping[str, Any]], metric: str = "p50", shared: bool = False,
              split: Sequence[int] = (), holdout: Sequence[Holdout] = (),
              cache: Optional[float] = None, bandwidth: Optional[Bandwidth] = None,
              skipped: Optional[dict] = None) -> list[Row]:
    """The points a fit can use (checked, buffer or object collectives the model
    knows, above 0 bytes and 0 µs, on 2 ranks or more) as rows.  ``cache``: the
    last-level cache of the machine they ran on (bytes); ``bandwidth``: its copy
    bandwidth by concurrent copies.  An algorithm is priced by its name without a
    kernel or piece (``ring+numpy`` as ``ring``, keyed apart); the points of 1 rank (no
    message) and of algorithms the model cannot price are counted by why in ``skipped``;
    the others (failed checks, workloads, other collectives) are passed over silently."""
    column = METRICS[metric]
    rows = []
    for p in points:
        if p.get("check") == "failed" or p.get("workload") or p.get("phase"):
            continue
        coll = p.get("collective")
        t_us, nbytes, ranks = p.get(column), p.get("bytes"), p.get("ranks")
        if coll not in FITTED or not t_us or t_us <= 0 or not nbytes or not ranks:
            continue
        alg = algorithm_of(p)
        why = "1 rank: no message to model" if ranks < 2 else None
        if why is None:
            row, why = _row(p, alg, coll, ranks, nbytes, cache, bandwidth)
        if why is not None:
            if skipped is not None:
                skipped[why] = skipped.get(why, 0) + 1
            continue
        key = (p.get("backend"), row[0], placement_of(p), p.get("form"), alg,
               "*" if shared else coll, regime_of(nbytes, split))
        rows.append(Row(dict(p), key, *row[1:], t_us * 1e-6, any(h.matches(p) for h in holdout)))
    return rows


def _row(p: Mapping[str, Any], alg: str, coll: str, ranks: int, nbytes: int,
         cache: Optional[float], bandwidth: Optional[Bandwidth]) -> tuple[Optional[tuple], Optional[str]]:
    """A point's (library, algorithm priced, terms, load), or why the model cannot price it."""
    lib = library_of(p)
    base = split_name(alg)[0]
    try:
        name, kw = costs.resolve(coll, base, ranks, nbytes,
                                 Setting(library=lib, ranks_per_node=ranks_per_host(p) or ranks,
                                         itemsize=itemsize_of(p)))
        terms, load = costs.priced(coll, name, ranks, nbytes, kw, ranks,
                                   Setting(library=lib, cores=p.get("host_cores"), cache=cache,
                                           bandwidth=bandwidth, thp=p.get("host_thp"),
                                           memory=p.get("memory"), huge_share=senders_huge_share(p)),
                                   library_call=alg == "library")
    except UsageError as exc:
        return None, f"{coll} by {base}: {exc.args[0]}"
    return (lib, name, terms, load), None


def with_cores(points: Iterable[Mapping[str, Any]], runs: Iterable[Mapping[str, Any]],
               source: Optional[str] = None) -> list[dict]:
    """Point records with ``host_cores`` (their run's ``cores``), ``host_thp`` (its
    machine's transparent-huge-page mode) and ``source`` (e.g. the database they came
    from, as run ids repeat across databases)."""
    runs = {r.get("id"): r for r in runs}
    out = []
    for p in points:
        rec = dict(p)
        run = runs.get(p.get("run_id")) or {}
        rec["host_cores"] = run.get("cores")
        rec["host_thp"] = thp_of(run.get("machine"))
        if source is not None:
            rec["source"] = source
        out.append(rec)
    return out


def thp_of(machine: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The transparent-huge-page mode (``always``, ``madvise``, ``never``) in a run's or
    ``ddlcomm info``'s machine facts; None where they do not say."""
    thp = ((machine or {}).get("memory") or {}).get("thp") or {}
    return thp.get("enabled") if isinstance(thp, dict) else None


# ------------------------------------------------------------------ fit
@dataclass
class Group:
    """One fitted parameter set and the points it came from."""

    key: dict
    params: Params
    cores: Optional[int]
    points: int
    median_rel_err: Optional[float] = None
    max_rel_err: Optional[float] = None
    #: The sizes it was fitted at: (smallest, largest, how many); None in older fit files.
    fitted_bytes: Optional[tuple[int, int, int]] = None
    #: Its effective cache (bytes, :func:`effective_cache`); None: the fit's (older files).
    cache: Optional[float] = None

    def to_dict(self) -> dict:
        return {"key": self.key, "params": self.params.to_dict(), "cores": self.cores,
                "points": self.points, "median_rel_err": self.median_rel_err,
                "max_rel_err": self.max_rel_err,
                "fitted_bytes": list(self.fitted_bytes) if self.fitted_bytes else None,
                "cache_bytes": self.cache}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Group":
        sizes = d.get("fitted_bytes")
        return cls(dict(d["key"]), Params.from_dict(d["params"]), d.get("cores"),
                   int(d.get("points", 0)), d.get("median_rel_err"), d.get("max_rel_err"),
                   tuple(int(x) for x in sizes) if sizes else None, d.get("cache_bytes"))

    def label(self) -> str:
        return set_label(self.key)

    def covers(self, nbytes: float) -> bool:
        lo_t, _, hi_t = (self.key.get("regime") or "*").partition(":")
        lo = 0 if lo_t in ("", "*") else parse_size(lo_t)
        hi = math.inf if hi_t in ("", "*") else parse_size(hi_t)
        return lo <= nbytes < hi


#: A column of work the core does alone -> its twin that copies at once slow: where no row
#: has contention (c = 1 throughout) the two are the same column, and the twin takes it.
CORE_TWINS = {"beta_core": "beta", "gamma_core": "gamma"}


#: Huber's δ of the fit: a point whose relative error is beyond it pulls the parameters by
#: its sign, not by its size (see the module doc, **Loss**).
HUBER_DELTA = 0.10
#: At most this many reweighted fits after the least-squares one (they stop where the
#: parameters settle).
HUBER_ROUNDS = 50


def huber(errors: Sequence[float] | np.ndarray, delta: float = HUBER_DELTA) -> float:
    """Σ ρ(e) over relative ``errors``: e²/2 within ``delta``, δ·(|e| - δ/2) beyond (pure)."""
    e = np.abs(np.asarray(errors, float))
    return float(np.where(e <= delta, e * e / 2, delta * (e - delta / 2)).sum())


def _solve(a: np.ndarray, b: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Non-negative least squares of the ``used`` columns of ``a`` (scaled to unit norm)."""
    x = np.zeros(a.shape[1])
    scale = np.linalg.norm(a[:, used], axis=0)
    scale[scale == 0] = 1.0
    x[used] = nnls(a[:, used] / scale, b) / scale
    return x


def fit_group(rows: Sequence[Row]) -> Params:
    """The parameters minimising the Huber loss of the relative errors over ``rows``,
    non-negative (see the module doc): least squares first, then reweighted until they
    settle (Huber's weights, min(1, δ/|e|) on each squared error)."""
    a = np.array([r.features() for r in rows])
    t = np.array([r.measured_s for r in rows])
    a = a / t[:, None]                  # a row · x - 1 is the point's relative error
    b = np.ones(len(rows))
    used = np.linalg.norm(a, axis=0) > 0
    for core, twin in CORE_TWINS.items():
        i, j = COLUMNS.index(core), COLUMNS.index(twin)
        if np.allclose(a[:, i], a[:, j], rtol=1e-12, atol=0.0):
            used[i] = False
    x = np.zeros(a.shape[1])
    if used.any():
        x = _solve(a, b, used)
        for _ in range(HUBER_ROUNDS):
            err = np.abs(a @ x - b)
            w = np.sqrt(np.minimum(1.0, HUBER_DELTA / np.maximum(err, 1e-300)))
            settled, x = x, _solve(a * w[:, None], b * w, used)
            if np.allclose(x, settled, rtol=1e-9, atol=0.0):
                break
    return Params(*(float(v) for v in x))


def summarize(errors: Sequence[float]) -> dict[str, Optional[float]]:
    """Median and max of |relative error| (None when empty), and the count."""
    if not errors:
        return {"points": 0, "median_rel_err": None, "max_rel_err": None}
    mags = [abs(e) for e in errors]
    return {"points": len(mags), "median_rel_err": statistics.median(mags),
            "max_rel_err": max(mags)}


@dataclass
class Fit:
    """Calibrated parameter sets, per-point residuals and their summaries."""

    groups: list[Group]
    residuals: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    # -------------------------------------------------------------- lookup
    def select(self, collective: str, algorithm: str = "library", nbytes: Optional[float] = None,
               **want: Optional[str]) -> Group:
        """The group for a prediction: matching ``want`` (backend, library,
        placement, form), the collective (or a shared group), the algorithm when
        a group has it (else the library's), and the size regime."""
        pool = [g for g in self.groups
                if all(v is None or _match(g.key.get(k), v) for k, v in want.items())]
        if not pool:
            raise UsageError(f"no fitted parameters match {_describe(want)}",
                             f"the fit has: {self.describe_groups()}")
        own = [g for g in pool if g.key.get("collective") == collective]
        pool = own or [g for g in pool if g.key.get("collective") == "*"]
        if not pool:
            had = sorted({str(g.key.get("collective")) for g in self.groups})
            raise UsageError(f"the fit has no {collective} parameters"
                             + (f" for {_describe(want)}" if any(want.values()) else ""),
                             f"it has: {', '.join(had)}; calibrate on points of {collective} too")
        exact = [g for g in pool if g.key.get("algorithm") == algorithm]
        pool = exact or [g for g in pool if g.key.get("algorithm") == "library"] or pool
        if nbytes is not None:
            pool = [g for g in pool if g.covers(nbytes)] or pool
        kinds = {(g.key.get("backend"), g.key.get("library"), g.key.get("placement"),
                  g.key.get("form")) for g in pool}
        if len(kinds) > 1:
            raise UsageError(f"the fit has several parameter sets for {collective}",
                             "choose with --library, --backend, --placement or --form: "
                             + self.describe_groups())
        return pool[0]

    def params_for(self, collective: str, algorithm: str = "library",
                   nbytes: Optional[float] = None, **want) -> tuple[Params, Setting]:
        """(Params, Setting) of the group :meth:`select` picks."""
        g = self.select(collective, algorithm, nbytes, **want)
        return g.params, self.setting_of(g)

    def setting_of(self, group: Group) -> Setting:
        """Where ``group``'s points ran, as a prediction prices it: its library, cores and
        cache, the fit's copy bandwidth and THP mode, the memory kind of its placement;
        past the node, the messages of a set fitted on one host go as that host's transport
        moved them (no network is modelled), those of a set fitted across containers as
        between them."""
        placement = group.key.get("placement") or "host"           # host, or containers=K
        where = placement.split(",")[0]
        return Setting(library=group.key.get("library"), cores=group.cores,
                       cache=self.cache_of(group), bandwidth=self.bandwidth, thp=self.thp,
                       memory=memory_of(placement), node_transport=where == "host",
                       containers=int(where.partition("=")[2]) if where != "host" else None)

    @property
    def cache(self) -> Optional[float]:
        """The last-level cache of the machine the fit was given (bytes), None if none."""
        return self.meta.get("cache_bytes") or None

    def cache_of(self, group: Group) -> Optional[float]:
        """The cache ``group`` was fitted with (its own; the fit's in older files)."""
        return group.cache if group.cache is not None else self.cache

    @property
    def thp(self) -> Optional[str]:
        """The transparent-huge-page mode of the machine the fit's points ran on (None where
        none said, or they disagreed: then no page term, :class:`~ddlcomm.model.costs.Setting`)."""
        return self.meta.get("thp") or None

    @property
    def bandwidth(self) -> Optional[Bandwidth]:
        """The copy bandwidth by concurrent copies the fit assumed, None if it had none."""
        return tuple((int(k), float(b)) for k, b in self.meta.get("copy_bandwidth") or ()) or None

    def parameter_sets(self) -> list[dict[str, Optional[str]]]:
        """The fit's parameter sets, in order, as the ``want`` that selects each: backend,
        library, placement and form."""
        seen = dict.fromkeys(tuple(g.key.get(k) for k in SET_KEYS) for g in self.groups)
        return [dict(zip(SET_KEYS, s)) for s in seen]

    def has(self, collective: str, **want: Optional[str]) -> bool:
        """Whether the set ``want`` picks has parameters for ``collective`` (its own or shared)."""
        return any(g.key.get("collective") in (collective, "*") for g in self.groups
                   if all(v is None or _match(g.key.get(k), v) for k, v in want.items()))

    def describe_groups(self) -> str:
        return ", ".join("/".join(str(v) for v in s.values()) for s in self.parameter_sets()) \
            or "nothing"

    # -------------------------------------------------------------- files
    def to_dict(self) -> dict:
        return {"format": FIT_FORMAT, "version": FIT_VERSION, **self.meta,
                "groups": [g.to_dict() for g in self.groups], "residuals": self.residuals}

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Fit":
        if d.get("format") != FIT_FORMAT:
            raise UsageError("not a ddlcomm fit file", "make one with `ddlcomm model calibrate`")
        if int(d.get("version", 0)) > FIT_VERSION:
            raise UsageError(f"fit file version {d.get('version')} is newer than this ddlcomm reads",
                             "upgrade ddlcomm")
        meta = {k: v for k, v in d.items() if k not in ("format", "version", "groups", "residuals")}
        return cls([Group.from_dict(g) for g in d.get("groups", [])],
                   list(d.get("residuals", [])), meta)


def load(path: str | Path) -> Fit:
    """Read a fit written by :meth:`Fit.save` (UsageError if missing or malformed)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"no fit file at {p}", "make one with `ddlcomm model calibrate`") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read fit file {p}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{p} is not a ddlcomm fit file")
    try:
        return Fit.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"fit file {p} is malformed ({type(exc).__name__}: {exc})",
                         "make it again with `ddlcomm model calibrate`") from None


def _match(have: Any, want: str) -> bool:
    return have is not None and folded(str(have)) == folded(str(want))


def _describe(want: Mapping[str, Optional[str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in want.items() if v is not None) or "the request"


#: What makes two rows the same point measured again (beside the parameter set's key).
REPEAT_FIELDS = ("collective", "dtype", "op", "in_place", "root", "bytes", "ranks")


def combine_rows(rows: Sequence[Row], how: str = "min") -> list[Row]:
    """One row per repeated point: the fastest (``min``) or the median
    measurement (``median``); ``none`` keeps every row.  The row kept carries
    ``repeats``, the number of measurements it stands for."""
    if how not in COMBINE:
        raise UsageError(f"unknown combine {how!r}", f"choose from {', '.join(COMBINE)}")
    if how == "none":
        return list(rows)
    same: dict[tuple, list[Row]] = {}
    for r in rows:       # the collective too: a shared set's key has "*" in its place
        same.setdefault((r.key, *(r.point.get(f) for f in REPEAT_FIELDS), r.heldout), []).append(r)
    out = []
    for group in same.values():
        group = sorted(group, key=lambda r: r.measured_s)
        pick = group[0] if how == "min" else \
            replace(group[0], measured_s=statistics.median(r.measured_s for r in group))
        pick.point["repeats"] = len(group)
        out.append(pick)
    return out


def calibrate(points: Iterable[Mapping[str, Any]], *,
              metric: str = "p50", combine: str = "min", shared: bool = False,
              split: Sequence[int] = (),
              holdout: Sequence[Holdout] = (), summary_bytes: int = 64 << 10,
              cache: Optional[float] = None, bandwidth: Optional[Bandwidth] = None,
              meta: Optional[dict] = None) -> Fit:
    """Fit every group of ``points``; residuals for fitted and held-out points.

    Each point may carry ``host_cores``, the cores of the host its run
    recorded (:func:`with_cores`), for the oversubscription terms; ``cache``
    is the last-level cache of the machine (bytes), from which each group's
    effective cache for the spill term is fitted (:func:`effective_cache`), ``bandwidth``
    its copy bandwidth by concurrent copies for the contention term.  Summaries
    are given over all points and over points of at least ``summary_bytes``.
    """
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}", f"choose from {', '.join(METRICS)}")
    points = list(points)
    thp_modes = {p.get("host_thp") for p in points} - {None}
    by_cache, passed_over = _rows_by_cache(points, metric, combine, shared, split, holdout, cache,
                                           bandwidth)
    rows = by_cache[cache]
    _check_holdouts(holdout, rows)
    groups: list[Group] = []
    residuals: list[dict] = []
    notes = passed_over + holdout_notes(holdout, rows)
    keyed = {size: _by_key(at) for size, at in by_cache.items()}
    for key, members in keyed[cache].items():
        train = [r for r in members if not r.heldout]
        notes += fit_notes(key, members, train)
        if not train:
            continue                                   # nothing left to fit this group from
        size = effective_cache({c: at.get(key, []) for c, at in keyed.items()})
        members = keyed[size][key]
        group, errors = _fit_one(key, members, [r for r in members if not r.heldout])
        group.cache = size
        groups.append(group)
        residuals += errors
    if not groups:
        raise UsageError("nothing left to fit: every matching point is held out",
                         "hold out fewer points (--holdout), or measure more rank counts")
    info = dict(meta or {})
    info.update({
        "notes": notes,
        "metric": METRICS[metric], "combine": combine,
        "weighting": f"Huber loss (δ {HUBER_DELTA:.0%}) of the relative error, non-negative",
        "beyond_delta": sum(not r["heldout"] and abs(r["rel_err"]) > HUBER_DELTA for r in residuals),
        "shared": shared, "split": list(split), "holdout": [h.text for h in holdout],
        "cache_bytes": cache or 0,
        "copy_bandwidth": [list(pair) for pair in bandwidth or ()],
        "thp": thp_modes.pop() if len(thp_modes) == 1 else None,
        "pages_measured": sum(senders_huge_share(r.point) is not None for r in rows),
        "points_fitted": len(rows),
        "summary_bytes": summary_bytes,
        "summary": error_summary(residuals, summary_bytes),
    })
    return Fit(groups, residuals, info)


def _rows_by_cache(points: list, metric: str, combine: str, shared: bool, split: Sequence[int],
                   holdout: Sequence[Holdout], cache: Optional[float],
                   bandwidth: Optional[Bandwidth]) -> tuple[dict, list[str]]:
    """The combined rows for each cache a fit tries (:func:`cache_candidates`), and a note
    per reason points were skipped (:func:`make_rows`); UsageError, with those notes, where
    no point is left."""
    skipped: dict = {}
    by_cache = {size: combine_rows(make_rows(points, metric, shared, split, holdout, size, bandwidth,
                                             skipped if size == cache else None), combine)
                for size in cache_candidates(cache)}
    passed_over = [f"{n} point(s) skipped: {why}" for why, n in sorted(skipped.items())]
    if not by_cache[cache]:
        raise UsageError("no stored points the model can fit" + "".join(f"; {n}" for n in passed_over),
                         "measure broadcast, gather or allreduce on 2 ranks or more, by the library "
                         "or an algorithm the model prices, with `ddlcomm bench` first")
    return by_cache, passed_over


#: The effective caches a fit tries (:func:`cache_candidates`): the reported one halved
#: 0 to 10 times.
CACHE_HALVINGS = 10


def cache_candidates(reported: Optional[float]) -> list[Optional[float]]:
    """The caches a fit tries, the reported one (bytes; None or 0: no cache term) first."""
    if not reported:
        return [reported]
    return [reported / (1 << k) for k in range(CACHE_HALVINGS + 1)]


def _by_key(rows: Sequence[Row]) -> dict[tuple, list[Row]]:
    out: dict[tuple, list[Row]] = {}
    for r in rows:
        out.setdefault(r.key, []).append(r)
    return out


def effective_cache(members_at: Mapping[Optional[float], Sequence[Row]]) -> Optional[float]:
    """Of one group's rows priced with each candidate cache (:func:`cache_candidates`, the
    reported one first), the cache whose fit has the least loss (:func:`huber`) on the
    fitted points; a smaller one only where it fits better."""
    best: tuple[float, Optional[float]] = (math.inf, next(iter(members_at)))
    for size, members in members_at.items():
        train = [r for r in members if not r.heldout]
        if not train:
            continue
        params = fit_group(train)
        loss = huber([(r.model(params) - r.measured_s) / r.measured_s for r in train])
        if loss < best[0] * (1 - 1e-6) - 1e-12:
            best = (loss, size)
    return best[1]


def _fit_one(key: tuple, members: Sequence[Row], train: Sequence[Row]) -> tuple[Group, list[dict]]:
    """One parameter set fitted to ``train``, and the residuals of all its ``members``."""
    params = fit_group(train)
    run_cores = {r.point.get("host_cores") for r in members} - {None}
    residuals, errs = [], []
    for r in members:
        model = r.model(params)
        e = relative_error(r.measured_s, model)
        if not r.heldout:
            errs.append(e)
        residuals.append(_residual(r, model, e))
    s = summarize(errs)
    sizes = {int(r.point["bytes"]) for r in train}
    return Group(dict(zip(KEY_FIELDS, key)), params, max(run_cores) if run_cores else None,
                 len(train), s["median_rel_err"], s["max_rel_err"],
                 (min(sizes), max(sizes), len(sizes))), residuals


def fit_notes(key: tuple, members: Sequence[Row], train: Sequence[Row]) -> list[str]:
    """What a reader of one group's fit must know (pure): held-out points left unpredicted
    because nothing beside them was fitted, and parameters the fitted points cannot fix."""
    name = set_label(dict(zip(KEY_FIELDS, key)))
    if not train:
        return [f"{name}: {len(members)} held-out points, none fitted beside them: not predicted"]
    notes = []
    sizes = len({r.point.get("bytes") for r in train})
    if sizes < 3:
        notes.append(f"{name}: fitted from {len(train)} point(s) at {sizes} size(s): its per-byte "
                     "terms are not determined, predictions at other sizes are guesses")
    if not any(r.load.over for r in train) and any(r.load.over for r in members):
        notes.append(f"{name}: no fitted point had more ranks than cores, so alpha_over and "
                     "beta_over are 0 and the oversubscribed points are priced without "
                     "their wait for the scheduler")
    return notes


def _residual(r: Row, model_s: float, err: float) -> dict:
    p = r.point
    return {"source": p.get("source"), "run_id": p.get("run_id"), "backend": p.get("backend"), "library": library_of(p),
            "placement": placement_of(p), "form": p.get("form"), "collective": p.get("collective"),
            "algorithm": algorithm_of(p), "model_algorithm": r.algorithm,
            "bytes": p.get("bytes"), "ranks": p.get("ranks"), "over": r.load.over, "spill": r.load.spill,
            "measured_s": r.measured_s, "model_s": model_s, "rel_err": err,
            "heldout": r.heldout, "repeats": p.get("repeats", 1)}


def error_summary(residuals: Sequence[Mapping[str, Any]], summary_bytes: int) -> dict:
    """Median/max |relative error| of fitted and held-out points, all sizes and
    from ``summary_bytes`` up."""
    out = {}
    for name, held in (("fitted", False), ("heldout", True)):
        rs = [r for r in residuals if r["heldout"] == held]
        out[name] = summarize([r["rel_err"] for r in rs])
        out[f"{name}_from_{summary_bytes}B"] = summarize(
            [r["rel_err"] for r in rs if r["bytes"] >= summary_bytes])
    return out


def family_summary(fit: "Fit", from_bytes: Optional[int] = None) -> dict[tuple[str, str], dict]:
    """Per (library, collective): the summaries of its fitted and held-out points
    from ``from_bytes`` (default: the fit's ``summary_bytes``) up, as
    ``{"fitted": ..., "heldout": ...}`` (see :func:`summarize`)."""
    from_b = fit.meta.get("summary_bytes", 0) if from_bytes is None else from_bytes
    out: dict[tuple[str, str], dict] = {}
    for r in fit.residuals:
        if r["bytes"] >= from_b:
            family = out.setdefault((str(r["library"]), str(r["collective"])), {"fitted": [], "heldout": []})
            family["heldout" if r["heldout"] else "fitted"].append(r["rel_err"])
    return {k: {name: summarize(errs) for name, errs in v.items()} for k, v in sorted(out.items())}


#: What a point holds for each of select_points' filters (a refusal names what is stored).
POINT_FIELDS = {"runs": lambda p: p.get("run_id"),
                "collectives": lambda p: p.get("collective"),
                "dtype": lambda p: p.get("dtype"),
                "backend": lambda p: p.get("backend"),
                "library": library_of,
                "placement": placement_of,
                "form": lambda p: p.get("form")}


def select_points(points: Iterable[Mapping[str, Any]], *, runs: Optional[set] = None,
                  backend: Optional[str] = None, library: Optional[str] = None,
                  placement: Optional[str] = None, form: Optional[str] = None,
                  collectives: Optional[set] = None,
                  dtype: Optional[str] = None) -> list[Mapping[str, Any]]:
    """The points a calibration asks for (each filter left out keeps all)."""
    f = POINT_FIELDS
    return [p for p in points
            if (runs is None or f["runs"](p) in runs)
            and (not dtype or f["dtype"](p) == dtype)
            and (not backend or f["backend"](p) == backend)
            and (not library or folded(f["library"](p)) == folded(library))
            and (not placement or f["placement"](p) == placement)
            and (not form or f["form"](p) == form)
            and (not collectives or f["collectives"](p) in collectives)]
