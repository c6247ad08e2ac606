"""Predictions from a fit or from explicit α-β-γ: a collective over sizes and
rank counts (``ddlcomm model predict``), and the aggregation cost of an S-SGD
iteration priced with a fit (``ddlcomm model ssgd --fit``) (pure)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Optional, Sequence

from ..errors import UsageError
from ..units import format_size
from . import costs
from .calibrate import memory_of
from .costs import Params, Setting


def check_request(collective: str, algorithm: str) -> str:
    """The modelled name of ``collective`` (aliases resolved); UsageError if it or
    ``algorithm`` has no cost model."""
    name = costs.native.ALIASES.get(collective, collective)
    if name not in costs.collectives():
        raise UsageError(f"no cost model for collective {collective!r}",
                         f"modelled: {', '.join(costs.collectives())}")
    if name != "ps" and algorithm not in costs.algorithms(name):
        raise UsageError(f"no cost model for {name} algorithm {algorithm!r}",
                         f"choose from {', '.join(costs.algorithms(name))}")
    return name


def priced_by(fit, collective: str, algorithm: str, nbytes: int, want: Mapping[str, Any]):
    """The fitted set that prices ``collective`` at ``nbytes`` (a PS step: its broadcast's)."""
    return fit.select("broadcast" if collective == "ps" else collective, algorithm, nbytes, **want)


def predict(collective: str, algorithm: str, ranks: Sequence[int], sizes: Sequence[int], *,
            fit=None, params: Optional[Params] = None, want: Optional[dict] = None,
            ranks_per_node: Optional[int] = None, cores: Optional[int] = None,
            inter: Optional[Params] = None, leaders: str = "auto", itemsize: int = 4) -> list[dict]:
    """One row per size and rank count: the modelled seconds and the algorithm it ran as.

    With ``fit``, each size takes the fitted set that ``want`` (library, backend,
    placement, form) selects, with its cores and cache (a split fit's row says whose
    sizes, ``fit_sizes``: a prediction jumps where the sets meet); else ``params`` with
    ``want["library"]`` naming whose default algorithm ``library`` means; ``itemsize``:
    the bytes of an element (MPICH chooses by element count).
    """
    want = dict(want or {})
    rows = []
    for n in sizes:
        regime = None
        if fit is not None:
            group = priced_by(fit, collective, algorithm, n, want)
            p_n, regime, own = group.params, group.key.get("regime"), fit.setting_of(group)
        else:
            p_n, own = params, Setting(library=want.get("library"),
                                       memory=memory_of(want.get("placement")), node_transport=True)
        setting = replace(own, ranks_per_node=ranks_per_node,
                          cores=cores if cores is not None else own.cores,
                          inter=inter, leaders_algorithm=leaders, itemsize=itemsize)
        for p in ranks:
            if collective == "ps" and fit is not None:
                t = costs.ps_time(fit, algorithm, p, n, setting, **want)
            else:
                t = costs.time(collective, algorithm, p, n, p_n, setting)
            rows.append({"collective": collective, "algorithm": algorithm,
                         "ran_as": ran_as(collective, algorithm, p, n, setting),
                         "ranks": p, "bytes": n, "seconds": t,
                         **({"fit_sizes": regime} if regime not in (None, "*") else {})})
    return rows


#: How far past the sizes a parameter set was fitted at a prediction goes unremarked.
EXTRAPOLATION = 4


def caveats(fit, collective: str, algorithm: str, sizes: Sequence[int],
            want: Optional[dict] = None) -> list[str]:
    """What a reader of ``fit``'s predictions at ``sizes`` must know (pure): a parameter set
    fitted at fewer than 3 sizes (its per-byte terms are guesses), and sizes more than
    :data:`EXTRAPOLATION` times past those it was fitted at."""
    notes: dict[str, None] = {}
    for lookup in (("broadcast", "gather") if collective == "ps" else (collective,)):
        for n in sizes:
            group = fit.select(lookup, algorithm if collective != "ps" else "library", n,
                               **(want or {}))
            if not group.fitted_bytes:
                continue
            lo, hi, count = group.fitted_bytes
            if count < 3:
                notes[f"{group.label()} was fitted at {count} size(s): its per-byte terms are "
                      "not determined, so its predictions at other sizes are guesses"] = None
            elif n > hi * EXTRAPOLATION or n * EXTRAPOLATION < lo:
                notes[f"{format_size(n)} is outside the sizes {group.label()} was fitted at "
                      f"({format_size(lo)} to {format_size(hi)}): extrapolated"] = None
    return list(notes)


def ran_as(collective: str, algorithm: str, p: int, n: int, setting: Setting) -> str:
    """The algorithm ``algorithm`` stands for at ``p`` ranks and ``n`` bytes."""
    if collective == "ps":
        if algorithm != "library":
            return algorithm
        return "+".join(costs.resolve(c, "library", p, n, setting)[0]
                        for c in ("broadcast", "gather"))
    if algorithm == "hierarchical":
        return f"hierarchical({setting.leaders_algorithm})"
    return costs.resolve(collective, algorithm, p, n, setting)[0]


def comm_from_fit(fit, arch: str, algorithm: str, want: Mapping[str, Optional[str]],
                  ranks_per_node: Optional[int] = None,
                  itemsize: int = 4) -> Callable[[int], Callable[[int], float]]:
    """comm_at(N) -> comm(nbytes): the all-reduce among N workers, or a PS step
    with N workers and one server, priced by the fit's set that ``want`` picks
    (backend, library, placement, form); GPUs drive the ranks, so no oversubscription.
    ``ranks_per_node``: the ranks sharing a node (default: as many as the fitted node's cores);
    ``itemsize``: the bytes of a gradient's element."""

    def comm_at(workers: int) -> Callable[[int], float]:
        def comm(nbytes: int) -> float:
            if arch == "ps":
                return costs.ps_time(fit, algorithm, workers + 1, nbytes, None, ranks_per_node, **want)
            return costs.allreduce_time(fit, algorithm, workers, nbytes, ranks_per_node, itemsize, **want)
        return comm
    return comm_at
