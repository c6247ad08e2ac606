"""The library's collective against ddlcomm's own algorithms, measured side by side (pure).

A run of ``ddlcomm bench --algorithm library,ring,rhd,shm,auto`` times each
algorithm at each size in the same run (``library,auto`` alone gives ``auto``'s
ratio only).  :func:`versus` turns the points of
such runs into one table per (library, memory, dtype, ranks; a reduction op other
than sum, a table apart): for each size, every
algorithm's median time (the median over the runs of each point's p50) and
ratios taken within each run, then summarised over the runs (median, lowest,
highest):

* ``speedup``: the library's time over the best own algorithm's (ring, rhd,
  shm and their kernel variants; ``auto`` and ``library`` are not "own");
* ``auto``: ``auto``'s time over the library's;
* ``x_floor``: the best own algorithm's time over the floor measured in the
  same run (``add_us``: one NumPy reduction pass over the bytes, host
  buffers; ``floor_us``: one device-to-device copy of them, device buffers).

:func:`targets` reads issue-style goals off a table: the smallest speed-up
from one size up, the largest floor ratio from another, the largest
``auto``/library ratio below a third.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

Point = Mapping[str, Any]

#: The algorithms that are not ddlcomm's own in a side-by-side run.
NOT_OWN = ("library", "auto")
#: A point's floor (key), in the order looked for: host reduction pass, device copy.
FLOORS = ("add_us", "floor_us")


@dataclass(frozen=True)
class Spread:
    """A figure over the runs: its median, lowest and highest, and how many runs gave it."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Optional["Spread"]:
        return cls(statistics.median(values), min(values), max(values), len(values)) \
            if values else None


@dataclass
class Row:
    """One size of a table."""

    nbytes: int
    times: dict[str, Spread] = field(default_factory=dict)    # algorithm -> p50 (µs) over runs
    best: Optional[str] = None            # the own algorithm with the lowest median time
    speedup: Optional[Spread] = None      # library / best own, per run
    auto: Optional[Spread] = None         # auto / library, per run
    auto_ran: tuple[str, ...] = ()        # what auto ran (algorithm_run), every run's
    x_floor: Optional[Spread] = None      # best own / floor, per run


@dataclass
class Table:
    """The rows of one library, memory kind, dtype and rank count."""

    library: str
    memory: str
    dtype: str
    ranks: int
    algorithms: list[str]
    rows: list[Row]
    runs: int
    floor: Optional[str]                  # which floor x_floor is over (FLOORS), if any


def _p50(point: Point) -> Optional[float]:
    value = point.get("t_p50_us")
    return value if value is not None else point.get("t_avg_us")


def versus(points: Iterable[Point], collective: str = "allreduce",
           from_bytes: int = 0) -> list[Table]:
    """The side-by-side tables of ``collective``'s checked buffer points (flat records,
    :func:`ddlcomm.results.export.point_record`; sizes from ``from_bytes``), only where a
    run measured the library beside at least one own algorithm or ``auto``."""
    # (library, memory, dtype, ranks) -> run -> bytes -> algorithm -> point
    by: dict[tuple, dict[Any, dict[int, dict[str, Point]]]] = \
        defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    kept = [p for p in points
            if p.get("collective") == collective and p.get("check") == "passed"
            and p.get("form", "buffer") == "buffer" and p["bytes"] >= from_bytes
            and p.get("phase") in (None, collective) and _p50(p) is not None]
    # a run's library along a GPU data path (ddlcomm's own algorithms beside it run on the
    # buffers themselves): its tables say so; per library, since one run can stage one
    # backend's (an MPI's, with --path left out) and hand another (Gloo) the device buffers
    staged = {(p.get("run_id"), p.get("library")): p["path"] for p in kept
              if (p.get("algorithm") or "library") == "library" and p.get("path") not in (None, "host")}
    for p in kept:
        memory = str(p.get("memory") or "host")
        path = staged.get((p.get("run_id"), p.get("library")))
        if path:
            memory += f", the library {path}"
        if p.get("kind_cache") == "off":                # Awan's cache-off runs: a table apart
            memory += ", kind cache off"
        if p.get("op") not in (None, "sum"):            # another op's runs: a table apart
            memory += f", op {p['op']}"
        key = (str(p.get("library")), memory, str(p.get("dtype")), int(p["ranks"]))
        by[key][p.get("run_id")][int(p["bytes"])][str(p.get("algorithm") or "library")] = p
    tables = []
    for (library, memory, dtype, ranks), runs in sorted(by.items()):
        runs = {r: sizes for r, sizes in runs.items()
                if any(_compared(algs, memory.startswith("device")) for algs in sizes.values())}
        if runs:
            tables.append(_table(library, memory, dtype, ranks, runs))
    return tables


def _compared(algorithms: Iterable[str], device: bool) -> bool:
    """Whether one size of a run compares anything: the library beside an own algorithm or
    ``auto`` (on device buffers an own algorithm alone: a host-only MPI has no collective of
    its own to run there, and ddlcomm's algorithms still give their times and x_floor)."""
    names = set(algorithms)
    own = bool(names - set(NOT_OWN))
    return (own and ("library" in names or device)) or {"library", "auto"} <= names


def _table(library: str, memory: str, dtype: str, ranks: int,
           runs: Mapping[Any, Mapping[int, Mapping[str, Point]]]) -> Table:
    algorithms = sorted({a for sizes in runs.values() for algs in sizes.values() for a in algs},
                        key=lambda a: (a != "library", a == "auto", a))
    floor = next((k for k in FLOORS if any(p.get(k) for sizes in runs.values()
                                          for algs in sizes.values() for p in algs.values())), None)
    rows = [_row(nbytes, [sizes[nbytes] for sizes in runs.values() if nbytes in sizes],
                 algorithms, floor)
            for nbytes in sorted({n for sizes in runs.values() for n in sizes})]
    return Table(library, memory, dtype, ranks, algorithms, rows, len(runs), floor)


def _row(nbytes: int, at: list[Mapping[str, Point]], algorithms: list[str],
         floor: Optional[str]) -> Row:
    """One size: ``at`` holds each run's points at it by algorithm."""
    row = Row(nbytes)
    for a in algorithms:
        spread = Spread.of([_p50(algs[a]) for algs in at if a in algs])
        if spread is not None:
            row.times[a] = spread
    own = {a: s for a, s in row.times.items() if a not in NOT_OWN}
    row.best = min(own, key=lambda a: own[a].median) if own else None
    speedups, autos, floors, ran = [], [], [], []
    for algs in at:
        lib, best, auto = algs.get("library"), algs.get(row.best), algs.get("auto")
        if lib is not None and best is not None and _p50(best):
            speedups.append(_p50(lib) / _p50(best))
        if lib is not None and auto is not None and _p50(lib):
            autos.append(_p50(auto) / _p50(lib))
            ran.append(str(auto.get("algorithm_run") or "?"))
        if best is not None and floor is not None and best.get(floor):
            floors.append(_p50(best) / best[floor])
    row.speedup, row.auto, row.x_floor = Spread.of(speedups), Spread.of(autos), Spread.of(floors)
    row.auto_ran = tuple(sorted(set(ran)))
    return row


@dataclass(frozen=True)
class Targets:
    """A table's figures against goals: each (value, at which size) or None where no size
    qualifies.  Medians over the runs."""

    min_speedup: Optional[tuple[float, int]]    # from ``speedup_from`` up
    max_x_floor: Optional[tuple[float, int]]    # from ``floor_from`` up
    max_auto: Optional[tuple[float, int]]       # below ``auto_below``


def targets(table: Table, speedup_from: int, floor_from: int, auto_below: int) -> Targets:
    """The smallest speed-up from ``speedup_from`` bytes, the largest floor ratio from
    ``floor_from``, the largest ``auto``/library ratio below ``auto_below``."""
    def pick(values, best):
        values = [(s.median, row.nbytes) for row, s in values if s is not None]
        return best(values) if values else None
    rows = table.rows
    return Targets(
        pick([(r, r.speedup) for r in rows if r.nbytes >= speedup_from], min),
        pick([(r, r.x_floor) for r in rows if r.nbytes >= floor_from], max),
        pick([(r, r.auto) for r in rows if r.nbytes < auto_below], max))
