"""A measured table for ``--algorithm auto``: what was fastest on this machine.

``ddlcomm model tune`` builds it (:func:`build`) from benchmark runs that
measured several algorithms side by side (``ddlcomm bench --algorithm
library,ring,rhd,shm``): for each library, collective and rank count, the
fastest algorithm at each measured size (by the median call, each algorithm by
its fastest run), as bands: from this size up, this algorithm.  ``ddlcomm
bench --tuning FILE`` hands it to ``auto`` (:func:`ddlcomm.comm.algorithms.decide`):
where the table has the run's library, collective and rank count, ``auto`` runs
its choice (every rank reads the same file, so every rank chooses alike);
elsewhere ``auto`` keeps its rules.  A size below the smallest measured one takes the
first band.  Pure, but for :func:`load`.
"""
from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from ..errors import UsageError
from .names import split

FORMAT = "ddlcomm-tuning"
VERSION = 1

#: Algorithms a table never chooses, however fast: ``shm-map`` moves the buffers' pages into
#: shared memory, which a caller asks for by name, not ``auto`` behind its back.
ASKED_ONLY = ("shm-map",)

#: (library in lower case, collective, ranks) -> [(from bytes, algorithm), ...], ascending.
Bands = dict[tuple[str, str, int], list[tuple[int, str]]]


@dataclass(frozen=True)
class Tuning:
    """A loaded table: where it came from, and its bands."""

    path: str
    bands: Bands

    def choose(self, library: Optional[str], collective: str, nranks: int,
               nbytes: int) -> Optional[str]:
        """The measured choice, or None where the table has no such library, collective
        and rank count."""
        rows = self.bands.get(((library or "").lower(), collective, nranks))
        if not rows:
            return None
        choice = rows[0][1]
        for start, algorithm in rows:
            if nbytes >= start:
                choice = algorithm
        return choice


def build(points: Iterable[Mapping[str, Any]], metric: str = "t_p50_us",
          source: Optional[dict] = None) -> dict:
    """The table's file content from stored points (``results.export.point_record``
    form): every checked buffer point of a concrete algorithm (not ``auto``, nor
    :data:`ASKED_ONLY`);
    at each (library, collective, ranks, bytes) that one run measured with two or
    more algorithms (of one op), the fastest by ``metric`` (each algorithm by its
    fastest such run: a run of one algorithm alone is no comparison);
    consecutive sizes with the same winner make one band.
    Each size keeps every algorithm's time (µs), so the margins can be read."""
    side_by_side: dict[tuple, dict[str, float]] = defaultdict(dict)
    for p in points:
        alg, t = p.get("algorithm") or "library", p.get(metric)
        if split(alg)[0] in ("auto", *ASKED_ONLY) or p.get("form") != "buffer" \
                or p.get("check") == "failed" \
                or not t or p.get("workload") or p.get("phase"):
            continue
        key = (str(p.get("library") or p.get("backend")), p["collective"], int(p["ranks"]),
               int(p["bytes"]))
        times = side_by_side[key, p.get("run_id"), p.get("op")]
        times[alg] = min(t, times.get(alg, float("inf")))
    fastest: dict[tuple, dict[str, float]] = defaultdict(dict)
    for (key, _run, _op), times in side_by_side.items():
        if len(times) >= 2:
            for alg, t in times.items():
                fastest[key][alg] = min(t, fastest[key].get(alg, float("inf")))
    entries: dict[tuple, list[dict]] = defaultdict(list)
    for (library, collective, ranks, nbytes), times in sorted(fastest.items()):
        entries[library, collective, ranks].append(
            {"bytes": nbytes, "best": min(times, key=times.get), "us": times})
    if not entries:
        raise UsageError("no size was measured with two or more algorithms side by side",
                         "run `ddlcomm bench --algorithm library,ring,rhd,shm ...` first")
    return {"format": FORMAT, "version": VERSION, "metric": metric, **(source or {}),
            "tables": [{"library": lib, "collective": coll, "ranks": ranks,
                        "bands": _bands(sizes), "sizes": sizes}
                       for (lib, coll, ranks), sizes in entries.items()]}


def _bands(sizes: list[dict]) -> list[list]:
    bands: list[list] = []
    for row in sizes:
        if not bands or bands[-1][1] != row["best"]:
            bands.append([row["bytes"] if bands else 0, row["best"]])
    return bands


def parse(data: Any, path: str) -> Tuning:
    """A :class:`Tuning` from a table file's content (UsageError naming what is wrong)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"{path} is not a tuning table of `ddlcomm model tune`",
                         f"its \"format\" must be {FORMAT!r}")
    if data.get("version") != VERSION:
        raise UsageError(f"{path}: tuning table version {data.get('version')!r}, "
                         f"this ddlcomm reads {VERSION}", "make it again with `ddlcomm model tune`")
    bands: Bands = {}
    try:
        for t in data["tables"]:
            rows = [(int(start), str(alg)) for start, alg in t["bands"]]
            if not rows or rows != sorted(rows, key=lambda r: r[0]):
                raise ValueError("bands must be non-empty and ascending")
            bands[str(t["library"]).lower(), str(t["collective"]), int(t["ranks"])] = rows
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{path}: a malformed tuning table ({exc})",
                         "make it again with `ddlcomm model tune`") from None
    return Tuning(path, bands)


@functools.lru_cache(maxsize=8)
def load(path: str) -> Tuning:
    """The table at ``path`` (read once per process)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read the tuning table {path}: {exc.strerror or exc}",
                         "give the file `ddlcomm model tune --out` wrote") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON ({exc.msg}, line {exc.lineno})",
                         "give the file `ddlcomm model tune --out` wrote") from None
    return parse(data, path)
