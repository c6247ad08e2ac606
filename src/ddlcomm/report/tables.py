"""Terminal tables of stored points and runs (pure functions returning strings).

A *point* is one measured collective at one size (a dict as the results store
returns it); a *run* is the dict describing one ``ddlcomm`` invocation.  Points
of one table or plot are told apart by their *varying dimensions*: the fields
among :data:`DIMENSIONS` (and keys of ``point["extra"]`` such as ``phase``) that
take more than one value.  Tables show one column per varying dimension; plots
draw one series per combination, named by :func:`series_key`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Optional

from ..errors import UsageError
from ..machine import load
from ..measure import noise
from ..pages import huge_shares
from ..results.compare import EXTRA_KEYS
from ..results.versus import targets
from ..units import counted, format_size, parse_size, printable

Point = Mapping[str, Any]

#: Fields that may distinguish the series of one collective, in display order.
DIMENSIONS = ("backend", "library", "form", "algorithm", "dtype", "op", "ranks", "in_place")
#: Timing and bandwidth columns of a points table, and the point keys they show.
_METRIC_HEADERS = ("min_us", "avg_us", "max_us", "p50_us", "p99_us", "algbw_GB/s", "busbw_GB/s")
_METRIC_KEYS = ("t_min_us", "t_avg_us", "t_max_us", "t_p50_us", "t_p99_us", "algbw_GBps", "busbw_GBps")
_SCALAR = (str, int, float, bool, type(None))
#: Columns shown when a point's ``extra`` has the key: header, key, format (ps-async's
#: server rate and the staleness of the updates it applied; a device call's µs of buffer-kind
#: look-ups, ``--kind-cache``).
EXTRA_COLUMNS = (("pushes/s", "pushes_per_s", "{:.0f}"), ("stale_mean", "staleness_mean", "{:.2f}"),
                 ("stale_max", "staleness_max", "{}"), ("lookup_us", "kind_lookup_us_per_call", "{:.2f}"))
#: The point's median time over a floor measured in the same run: header, key.  ``add_us``
#: is one NumPy reduction pass over the point's bytes (host buffers), ``floor_us`` one
#: device-to-device copy of them (device buffers), each timed on every rank at once.
RATIO_COLUMNS = (("x_add", "add_us"), ("x_floor", "floor_us"))
#: Keys of ``extra`` that are measurements of a point, never a series (a copy phase's bytes,
#: the pinned copy bandwidths and how many ranks copy, the kind look-ups of a device call,
#: the pipelined shm all-reduce's chunk and whether it wrote its result streaming).
MEASUREMENTS = (*(key for _, key in RATIO_COLUMNS), *(key for _, key, _ in EXTRA_COLUMNS),
                "copy_bytes", "kind_lookups", "kind_lookups_per_call", "kind_lookup_us",
                "copy_alone_GBps", "copy_at_once_GBps", "copiers", "shm_chunk", "shm_stream",
                "shm_spin_us")
#: Keys of ``extra`` a workload's points are told apart by first (the facts that follow
#: them are no series of their own): its phase, its data path.
LEADING_EXTRAS = ("phase", "path")
#: The key of ``extra`` under which the pipelined shm all-reduce stores each rank's µs per
#: call by phase (:data:`ddlcomm.comm.shm.PIPE_PHASES`, whose waits end in ``wait``).
PHASES_KEY = "shm_phases_us"


# --------------------------------------------------------------------------- formatting

def format_us(value: float | None) -> str:
    """A time in µs: 2 decimals below 10, 1 below 1000, else a whole number."""
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"


def format_gbps(value: float | None) -> str:
    """A bandwidth in GB/s: 3 significant digits (2 decimals from 1 to 10, whole from 100)."""
    if value is None or not math.isfinite(value):
        return "-"
    if value == 0:
        return "0.00"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_check(check: str | None) -> str:
    """``passed``/``skipped`` as they are, ``failed`` as ``FAILED`` so it stands out."""
    return "FAILED" if check == "failed" else (check or "-")


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]],
                 right: Sequence[bool] | None = None) -> str:
    """Align ``rows`` of strings under ``headers``, two spaces between columns.

    ``right[i]`` right-aligns column ``i`` (numbers); by default every column
    whose cells all look numeric is right-aligned.
    """
    rows = [list(map(str, row)) for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if right is None:
        right = [all(_looks_numeric(r[i]) for r in rows) and bool(rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cells, widths, right)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _looks_numeric(text: str) -> bool:
    t = text.rstrip("x")
    try:
        float(t)
        return True
    except ValueError:
        return t == "-"


# --------------------------------------------------------------------------- dimensions

def dimension_value(point: Point, dim: str) -> Any:
    """Value of ``dim`` in ``point``: a field of :data:`DIMENSIONS` or a key of ``extra``."""
    if dim in DIMENSIONS:
        return point.get(dim)
    return (point.get("extra") or {}).get(dim)


def varying_dimensions(points: Sequence[Point]) -> list[str]:
    """Dimensions that tell apart points of one collective, in display order.

    A field of :data:`DIMENSIONS` counts when it takes more than one value
    among the points of one collective (so ``op`` is not "varying" merely
    because broadcast has none and allreduce has ``sum``).  A key of ``extra``
    (e.g. ``phase``) counts when its scalar values differ between points of
    the same collective and size that the varying fields and the keys counted
    before it (:data:`LEADING_EXTRAS` first) do not tell apart, so per-size
    details such as a segment count, and details that follow a field or a key
    (the kernel of an algorithm, a data path's GPU sharing), are not mistaken
    for a series.
    """
    by_coll: dict[Any, list[Point]] = {}
    for p in points:
        by_coll.setdefault(p.get("collective"), []).append(p)

    def varies(dim: str, groups: Iterable[list[Point]]) -> bool:
        return any(len({repr(dimension_value(p, dim)) for p in g}) > 1 for g in groups)

    dims = [d for d in DIMENSIONS if varies(d, by_coll.values())]
    extra_keys: list[str] = []
    for p in points:
        for k, v in (p.get("extra") or {}).items():
            if k not in DIMENSIONS and k not in MEASUREMENTS and k not in extra_keys \
                    and isinstance(v, _SCALAR):
                extra_keys.append(k)
    # one at a time, the workloads' phase and path first: a key counts where it varies among
    # points the dimensions chosen so far do not tell apart, so a key that follows a field
    # or a chosen key (an algorithm's kernel, a path's GPU sharing) names no series of its own
    def apart() -> Iterable[list[Point]]:
        """The points ``dims`` do not tell apart, by collective and size."""
        by_size: dict[tuple, list[Point]] = {}
        for p in points:
            by_size.setdefault((p.get("collective"), p.get("bytes"),
                                *(repr(dimension_value(p, d)) for d in dims)), []).append(p)
        return by_size.values()

    groups = apart()
    for k in [k for k in LEADING_EXTRAS if k in extra_keys] + \
            [k for k in extra_keys if k not in LEADING_EXTRAS]:
        if varies(k, groups):
            dims.append(k)
            groups = apart()                 # regrouped only when a key was counted
    return dims


def _cell(dim: str, value: Any) -> str:
    """A dimension's value as a table cell."""
    if value is None:
        return "-"
    if dim == "in_place":
        return "yes" if value else "no"
    return str(value)


def series_key(point: Point, varying: Sequence[str]) -> str:
    """Name of the series ``point`` belongs to, from its ``varying`` dimensions.

    E.g. ``"mpi/Open MPI buffer"`` when backend, library and form vary;
    ``""`` when nothing varies (a single series).
    """
    parts: list[str] = []
    if "backend" in varying or "library" in varying:
        parts.append(f"{point.get('backend')}/{point.get('library')}")
    for dim in varying:
        value = dimension_value(point, dim)
        if dim in ("backend", "library"):
            continue
        if dim == "ranks":
            parts.append(counted(value, "rank"))
        elif dim == "in_place":
            parts.append("in-place" if value else "out-of-place")
        elif dim in DIMENSIONS:
            parts.append(_cell(dim, value))
        else:
            parts.append(f"{dim}={_cell(dim, value)}")
    return " ".join(parts)


def _sort_value(value: Any) -> tuple:
    """Sort key that orders numbers numerically, never compares int with str, and orders
    an algorithm's pieces by size (``shm@128KiB`` before ``shm@1MiB``)."""
    if isinstance(value, (int, float)):
        return (0, value)
    text = str(value)
    base, at, rest = text.partition("@")
    piece, plus, kernel = rest.partition("+")
    try:
        return (1, base, parse_size(piece) if at else -1, plus + kernel)
    except UsageError:
        return (1, text, -1, "")


def group_by_collective(points: Iterable[Point]) -> dict[str, list[Point]]:
    """Points grouped per collective, collectives in first-seen order."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(str(p.get("collective")), []).append(p)
    return groups


def heading(points: Sequence[Point], varying: Sequence[str] | None = None) -> str:
    """Title of one collective's table: collective, fixed dtype/op/ranks, library.

    E.g. ``"allreduce  float32 sum  2 ranks  (Open MPI 5.0.11)"``; a dimension
    that varies is left out (it has a column of its own).
    """
    varying = varying_dimensions(points) if varying is None else varying
    first = points[0]
    parts = [str(first.get("collective"))]
    fixed = [str(first[d]) for d in ("dtype", "op") if d not in varying and first.get(d)]
    if fixed:
        parts.append(" ".join(fixed))
    if "ranks" not in varying and first.get("ranks") is not None:
        parts.append(counted(first["ranks"], "rank"))
    for dim, default in (("form", "buffer"), ("algorithm", "library")):
        if dim not in varying and first.get(dim) not in (None, default):
            parts.append(f"{dim} {first[dim]}")
    if "in_place" not in varying and first.get("in_place"):
        parts.append("in-place")
    libs = list(dict.fromkeys(f"{p.get('library')} {p.get('library_version') or ''}".strip()
                              for p in points if p.get("library")))
    if libs:
        parts.append(f"({', '.join(libs)})")
    return "  ".join(parts)


# --------------------------------------------------------------------------- points

def _extra_cell(point: Point, key: str, fmt: str) -> str:
    value = dimension_value(point, key)
    return "-" if value is None else fmt.format(value)


def points_table(points: Sequence[Point]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows of one collective's points (shared with the HTML page).

    Rows are sorted by size, then series; columns are size, count, iters
    (timed iterations), one per varying dimension, the timings in µs, algbw
    and busbw in GB/s, :data:`RATIO_COLUMNS` (``x_add``, ``x_floor``: median time
    over a floor of the same bytes, where a point measured it), :data:`EXTRA_COLUMNS`
    that any point has, ``auto_ran`` (what ``--algorithm auto`` ran at that size,
    when a point is auto's), ``noise`` (the markers of :mod:`ddlcomm.measure.noise`,
    when any point raised one) and check.
    """
    varying = varying_dimensions(points)
    ordered = sorted(points, key=lambda p: (p.get("bytes") or 0,
                                            [_sort_value(dimension_value(p, d)) for d in varying]))
    ratios = [c for c in RATIO_COLUMNS if any(dimension_value(p, c[1]) for p in points)]
    extras = [c for c in EXTRA_COLUMNS if any(dimension_value(p, c[1]) is not None for p in points)]
    auto = any(p.get("algorithm") == "auto" for p in points)
    with_noise = any(noise.point_flags(p) for p in points)
    headers = ["size", "count", "iters", *varying, *_METRIC_HEADERS,
               *(h for h, _ in ratios), *(h for h, _, _ in extras), *(["auto_ran"] if auto else []),
               *(["noise"] if with_noise else []), "check"]
    rows = []
    for p in ordered:
        times = [format_us(p.get(k)) for k in _METRIC_KEYS[:5]]
        bws = [format_gbps(p.get(k)) for k in _METRIC_KEYS[5:]]
        ratio = [format_ratio(_over(p, key)) for _, key in ratios]
        marks = [noise.markers(noise.point_flags(p)) or "-"] if with_noise else []
        rows.append([format_size(int(p.get("bytes") or 0)), str(p.get("count", "-")),
                     str(p.get("iterations") or "-"),
                     *[_cell(d, dimension_value(p, d)) for d in varying],
                     *times, *bws, *ratio, *[_extra_cell(p, key, fmt) for _, key, fmt in extras],
                     *([_auto_ran(p)] if auto else []), *marks, format_check(p.get("check"))])
    return headers, rows


def _auto_ran(p: Point) -> str:
    """What ``--algorithm auto`` ran at the point's size (``-`` for another algorithm)."""
    return str(dimension_value(p, "algorithm_run") or "?") if p.get("algorithm") == "auto" else "-"


def _over(p: Point, key: str) -> Optional[float]:
    """The point's median time over the floor stored as ``key`` (None without both)."""
    floor = dimension_value(p, key)
    return p["t_p50_us"] / floor if floor and p.get("t_p50_us") else None


def noise_notes(points: Sequence[Point]) -> list[str]:
    """One legend line per noise marker that some of ``points`` raised, with the
    points' sizes and series, e.g. ``"Q (2 points: 8MiB, 16MiB): p50 sits on ..."``."""
    varying = varying_dimensions(points)
    flagged: dict[str, list[str]] = {}
    for p in sorted(points, key=lambda p: p.get("bytes") or 0):
        for flag in noise.point_flags(p):
            where = f"{format_size(int(p.get('bytes') or 0))} {series_key(p, varying)}".strip()
            flagged.setdefault(flag, []).append(where)
    notes = []
    for flag, (mark, meaning) in noise.FLAGS.items():
        if flag in flagged:
            which = flagged[flag]
            listed = ", ".join(which[:8]) + (f", ... ({len(which) - 8} more)" if len(which) > 8 else "")
            notes.append(f"{mark} ({counted(len(which), 'point')}: {listed}): {meaning}")
    return notes


#: A rank's NumPy arrays count as partly on huge pages between these parts.
PARTLY_HUGE = (0.02, 0.98)


def pages_note(points: Sequence[Point]) -> str:
    """One line naming the points whose NumPy arrays were partly on huge pages at some rank
    (their ``pages``' ``huge_share_ranks``), ``""`` where none was: there a single copy
    between processes costs several times more from the small part, so such a size's time
    depends on where the allocator put the arrays."""
    varying = varying_dimensions(points)
    which, shares = [], []
    for p in sorted(points, key=lambda p: p.get("bytes") or 0):
        ranks = [s for s in huge_shares(p) if s is not None]
        if any(PARTLY_HUGE[0] < s < PARTLY_HUGE[1] for s in ranks):
            which.append(f"{format_size(int(p.get('bytes') or 0))} {series_key(p, varying)}".strip())
            shares += ranks
    if not which:
        return ""
    listed = ", ".join(which[:8]) + (f", ... ({len(which) - 8} more)" if len(which) > 8 else "")
    low, high = f"{min(shares) * 100:.0f}", f"{max(shares) * 100:.0f}"
    return (f"pages ({counted(len(which), 'point')}: {listed}): NumPy's arrays "
            f"{low if low == high else low + '-' + high}% on huge pages; an MPI's single copy "
            "costs several times more from small pages, so such times vary with where the "
            "arrays fell (--memory hugepage or pageable fixes them)")


def avg_busbw(points: Sequence[Point]) -> list[tuple[str, float, int]]:
    """nccl-tests' "avg bus bandwidth" of one collective's points, per series:
    (series name, mean busbw in GB/s over its sizes above 0 bytes, number of sizes).
    A point whose check failed is left out: its time is not the collective's."""
    varying = varying_dimensions(points)
    series: dict[str, list[float]] = {}
    for p in points:
        if (p.get("bytes") or 0) > 0 and p.get("busbw_GBps") is not None \
                and p.get("check") != "failed":
            series.setdefault(series_key(p, varying), []).append(float(p["busbw_GBps"]))
    return [(name, sum(v) / len(v), len(v)) for name, v in series.items()]


def format_avg_busbw(points: Sequence[Point]) -> str:
    """``avg bus bandwidth: 1.23 GB/s`` (or ``buffer 1.23, object 0.45 GB/s`` per series),
    ``""`` when no point has a size."""
    avgs = avg_busbw(points)
    if not avgs:
        return ""
    text = ", ".join(f"{name} {format_gbps(v)}".strip() for name, v, _ in avgs)
    return f"avg bus bandwidth: {text} GB/s"


def _errors(points: Sequence[Point], varying: Sequence[str]) -> list[str]:
    """One line per point that recorded an error."""
    return [f"  ! {format_size(int(p.get('bytes') or 0))} {series_key(p, varying)}: {p['error']}".rstrip()
            for p in points if p.get("error")]


#: Above the time-by-phase table, in the terminal and the HTML page.
PHASES_TITLE = ("shm's time by phase: µs per call, the ranks' mean; waiting: the largest share "
                "of a rank's time spent waiting for the others")


def phases_table(points: Sequence[Point]) -> tuple[list[str], list[list[str]]]:
    """The pipelined shm all-reduce's time by phase, where points recorded it: per point,
    the ranks' mean µs per call in each phase, the sum, and the largest share of a rank's
    time spent waiting for the others (headers and rows; no rows where no point has phases)."""
    timed = [p for p in points if dimension_value(p, PHASES_KEY)]
    if not timed:
        return [], []
    varying = varying_dimensions(points)
    names = list(next(iter(dimension_value(timed[0], PHASES_KEY).values())))
    rows = []
    for p in sorted(timed, key=lambda p: (p.get("bytes") or 0,
                                          [_sort_value(dimension_value(p, d)) for d in varying])):
        ranks = list(dimension_value(p, PHASES_KEY).values())
        mean = [sum(r.get(n, 0.0) for r in ranks) / len(ranks) for n in names]
        waiting = max(sum(v for n, v in r.items() if n.startswith("wait")) / (sum(r.values()) or 1)
                      for r in ranks)
        rows.append([format_size(int(p.get("bytes") or 0)), series_key(p, varying) or "-",
                     *[f"{v:.1f}" for v in mean], f"{sum(mean):.1f}", _percent(waiting)])
    return ["size", "series", *names, "sum", "waiting"], rows


def render_points(points: Iterable[Point]) -> str:
    """One table per collective (first-seen order), each under a ``# heading`` line.

    Under each table: its avg bus bandwidth per series (nccl-tests' headline),
    a legend line per noise marker raised (:func:`noise_notes`), the points whose
    arrays were partly on huge pages (:func:`pages_note`), the points that
    recorded an error, and the shm all-reduce's time by phase (:func:`phases_table`).
    """
    blocks = []
    for group in group_by_collective(points).values():
        varying = varying_dimensions(group)
        headers, rows = points_table(group)
        right = [h not in ("check", "noise") and (h not in varying or h == "ranks") for h in headers]
        block = [f"# {heading(group, varying)}", format_table(headers, rows, right)]
        block += [f"# {line}" for line in [format_avg_busbw(group)] if line]
        block += [f"  noise {note}" for note in noise_notes(group)]
        block += [f"  {note}" for note in [pages_note(group)] if note]
        block += _errors(group, varying)
        headers, rows = phases_table(group)
        if rows:
            block += [f"# {PHASES_TITLE}", format_table(headers, rows, [h != "series" for h in headers])]
        blocks.append("\n".join(block))
    return "\n\n".join(blocks) if blocks else "(no points)"


# --------------------------------------------------------------------------- runs

def format_when(value: Any) -> str:
    """A timestamp (ISO string or seconds since the epoch) as ``YYYY-MM-DD HH:MM:SS UTC``
    (the store's are UTC); a timestamp without a zone as it stands, no zone named."""
    if value is None or value == "":
        return "-"
    if isinstance(value, (int, float)):
        when = datetime.fromtimestamp(value, timezone.utc)
    else:
        try:
            when = datetime.fromisoformat(str(value))
        except ValueError:
            return str(value).replace("T", " ")[:19]
        if when.tzinfo is None:
            return when.strftime("%Y-%m-%d %H:%M:%S")
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _truncate(text: Any, width: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= width else text[:width - 3] + "..."


def run_library(run: Mapping[str, Any]) -> str:
    """The library of a run's first backend and its version (the MPI's under ``mpi``, Gloo's
    or NCCL's torch otherwise; ``-`` when it recorded none)."""
    return f"{run.get('mpi_library') or ''} {run.get('mpi_version') or ''}".strip() or "-"


def render_runs(runs: Iterable[Mapping[str, Any]]) -> str:
    """Table of runs for ``ddlcomm results list``.

    ``library`` is the library of the run's first backend (as ``results show`` says it).  Besides the run fields, each run may carry the summary keys ``n_points``,
    ``n_passed``, ``n_failed`` (ints) and ``collectives`` (list or string);
    missing ones show ``-``.  A ``stale`` run (running, but it cannot be any more:
    :func:`ddlcomm.results.store.stale_why`) shows as ``stale``.
    """
    headers = ["id", "started", "status", "host", "library", "backends", "ranks", "points",
               "passed", "failed", "collectives", "command"]
    rows = []
    for r in runs:
        colls = _listed(r.get("collectives"))
        status = "stale" if r.get("stale") else str(r.get("status") or "-")
        asked = r.get("config") or {}             # a run without points: what it asked for
        rows.append([str(r.get("id", "-")), format_when(r.get("started_at")), status,
                     str(r.get("host") or "-"), run_library(r),
                     r.get("point_backends") or _listed(asked.get("backends")) or "-",
                     r.get("point_ranks") or _listed(asked.get("ranks")) or "-",
                     *[str(r.get(k, "-")) if r.get(k) is not None else "-"
                       for k in ("n_points", "n_passed", "n_failed")],
                     _truncate(colls, 40) or "-", _truncate(printable(r.get("command") or ""), 60) or "-"])
    if not rows:
        return "(no runs)"
    right = [True, False, False, False, False, False, False, True, True, True, False, False]
    return format_table(headers, rows, right)


def _listed(value: Any) -> str:
    """A configuration's value as a cell: a list comma-joined, None as ''."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "" if value is None else str(value)


def run_warnings(run: Mapping[str, Any]) -> list[str]:
    """What the run's load record warns of (:func:`ddlcomm.machine.load.warnings`)."""
    return load.warnings(run.get("load") or {})


def render_run(run: Mapping[str, Any]) -> str:
    """``key: value`` lines describing one run (``results show``; points follow),
    with its load and a ``warning`` line per :func:`run_warnings`."""
    fields = [
        ("run", run.get("id")),
        ("status", f"stale (running, but {run['stale']})" if run.get("stale") else run.get("status")),
        ("started", format_when(run.get("started_at"))), ("ended", format_when(run.get("ended_at"))),
        ("host", run.get("host")), ("cpu", run.get("cpu_model")), ("cores", run.get("cores")),
        ("os", run.get("os")), ("python", run.get("python")), ("library", run_library(run)),
        ("ddlcomm", run.get("ddlcomm_version")), ("git commit", run.get("git_commit")),
        ("command", run.get("command")),
    ]
    if run.get("error"):
        fields.append(("error", run["error"]))
    if run.get("machine"):
        fields.append(("gpus", run["machine"].get("gpu_verdict")))
    if run.get("load"):
        fields.append(("load", load.describe(run["load"])))
        fields += [("warning", text) for text in run_warnings(run)]
    config = run.get("config")
    if config:
        fields.append(("config", ", ".join(f"{k}={v}" for k, v in config.items())
                       if isinstance(config, Mapping) else config))
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k + ':':<{width + 1}} {'-' if v is None or v == '' else printable(str(v))}"
                     for k, v in fields)


# --------------------------------------------------------------------------- compare

def _run_label(run: Mapping[str, Any] | int | str) -> str:
    if not isinstance(run, Mapping):
        return f"run {run}"
    return f"run {run.get('id')} ({run.get('host') or '?'}, {run_library(run)}, {format_when(run.get('started_at'))})"


def format_ratio(ratio: float | None) -> str:
    """A time ratio as ``1.23x`` (``0.0012x`` below 0.01: never ``0.00x``), ``-`` when one
    side is missing."""
    if ratio is None or not math.isfinite(ratio):
        return "-"
    return f"{ratio:.2f}x" if ratio == 0 or abs(ratio) >= 0.01 else f"{ratio:.2g}x"


#: The compare table's legend of a ``~`` ratio.
NOISE_LEGEND = ("~ : within noise: the two points' p50..p99 ranges overlap, so the runs' own "
                "spread allows the difference")
PAGES_LEGEND = ("huge_a, huge_b: the part of the arrays the data came from on huge pages, shown "
                "where a size's two points differ by a quarter or more; an MPI's single copy "
                "costs several times more from small pages, so the ratio there may be the pages "
                "(--memory hugepage or pageable fixes them)")
#: How far apart two points' senders' huge pages are before a comparison shows them.
PAGES_APART = 0.25


def _pages_apart(row: Mapping[str, Any]) -> bool:
    a, b = row.get("huge_a"), row.get("huge_b")
    return a is not None and b is not None and abs(a - b) >= PAGES_APART


def _compare_ratio(row: Mapping[str, Any]) -> str:
    """``b/a`` of a compare row, ``~`` in front when it is within noise."""
    text = format_ratio(row.get("ratio"))
    return f"~{text}" if row.get("noise") and text != "-" else text


def render_compare(rows: Iterable[Mapping[str, Any]], run_a: Mapping[str, Any] | int,
                   run_b: Mapping[str, Any] | int) -> str:
    """Side-by-side table of matched points of two runs, one table per collective.

    ``rows`` carry the key fields (backend, library, collective, form,
    algorithm, dtype, op, bytes, ranks, in_place) and ``t_avg_us_a/_b``,
    ``ratio`` (b/a, or None), ``noise`` (within noise: the ratio gets a ``~``
    and the table a legend line), ``busbw_GBps_a/_b``, ``check_a/_b``.
    ``run_a`` and ``run_b`` are run dicts or run ids.  A ratio above 1 means b
    is slower.
    """
    rows = list(rows)
    out = [f"a = {_run_label(run_a)}", f"b = {_run_label(run_b)}"]
    for group in group_by_collective(rows).values():
        varying = [d for d in varying_dimensions(group) if d in DIMENSIONS]
        for own in EXTRA_KEYS:       # data path, phase, training configuration: a row's own key
            if len({r.get(own) for r in group}) > 1:
                varying.append(own)
        group = sorted(group, key=lambda r: (r.get("bytes") or 0,
                                             [_sort_value(r.get(d)) for d in varying]))
        pages = any(_pages_apart(r) for r in group)
        headers = ["size", *varying, "avg_us_a", "avg_us_b", "b/a", "b/a_p50",
                   "busbw_a", "busbw_b", *(["huge_a", "huge_b"] if pages else []),
                   "check_a", "check_b"]
        table = [[format_size(int(r.get("bytes") or 0)), *[_cell(d, r.get(d)) for d in varying],
                  format_us(r.get("t_avg_us_a")), format_us(r.get("t_avg_us_b")),
                  _compare_ratio(r), format_ratio(r.get("ratio_p50")),
                  format_gbps(r.get("busbw_GBps_a")), format_gbps(r.get("busbw_GBps_b")),
                  *([_percent(r.get("huge_a")) if _pages_apart(r) else "",
                     _percent(r.get("huge_b")) if _pages_apart(r) else ""] if pages else []),
                  format_check(r.get("check_a")), format_check(r.get("check_b"))]
                 for r in group]
        right = [h not in varying or h == "ranks" for h in headers[:-2]] + [False, False]
        out += ["", f"# {heading(group, varying)}", format_table(headers, table, right)]
    if len(out) == 2:
        out.append("(no matching points)")
    else:
        if any(r.get("noise") and r.get("ratio") is not None for r in rows):
            out += ["", NOISE_LEGEND]
        if any(_pages_apart(r) for r in rows):
            out += ["", PAGES_LEGEND]
    return "\n".join(out)


def _percent(share: Optional[float]) -> str:
    return "-" if share is None else f"{share:.0%}"


def render_kernels(rows: Iterable[Mapping[str, Any]], available: Mapping[str, str]) -> str:
    """``ddlcomm kernels``' table, then a line per kernel missing here."""
    rows = list(rows)
    reference = rows[0]["reference"] if rows else "the reference"
    text = format_table(["dtype", "kernel", "runs on", "size", "median_us", "GB/s", f"vs {reference}"],
                        [[r["dtype"], r["kernel"], r["runs_on"], format_size(r["bytes"]),
                          format_us(r["t_ms"] * 1e3), f"{r['GBps']:.2f}", f"{r['vs_reference']:.2f}x"]
                         for r in rows])
    missing = [f"kernel {name}: {state}" for name, state in available.items()
               if state.startswith("missing")]
    return "\n".join([text, *missing])


def format_markdown(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """``rows`` of strings under ``headers`` as a Markdown (pipe) table."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(headers), line(["---"] * len(headers))] + [line(r) for r in rows])


def _spread_ratio(spread) -> str:
    """A ratio over runs: its median, with the lowest-highest range where runs differ."""
    if spread is None:
        return "-"
    text = format_ratio(spread.median)
    return text if spread.n < 2 or spread.low == spread.high else \
        f"{text} ({format_ratio(spread.low)[:-1]}-{format_ratio(spread.high)[:-1]})"


def _ratio_at(found: Optional[tuple[float, int]]) -> str:
    """A target's (ratio, size) as ``1.23x at 16MiB``; where no size qualified, says so."""
    return "- (no size measured there)" if found is None else \
        f"{format_ratio(found[0])} at {format_size(found[1])}"


def render_versus(tables: Sequence[Any], goals: Mapping[str, int], markdown: bool = False) -> str:
    """``ddlcomm results versus``: per library, memory, dtype and rank count, each size's median
    time (µs) of every algorithm, the library over the best own (speedup), ``auto`` over
    the library (and what ``auto`` ran), the best own over the floor measured in the same
    run; then the figures of :func:`ddlcomm.results.versus.targets` for ``goals``
    (``speedup_from``, ``floor_from``, ``auto_below``, in bytes)."""
    out = []
    for t in tables:
        floor = {key: header for header, key in RATIO_COLUMNS}.get(t.floor, "x_floor")
        floored = any(r.x_floor for r in t.rows)         # none where nothing reduces (broadcast)
        owned = any(r.best for r in t.rows)              # none where the run had library,auto only
        versus_lib = owned and any(r.speedup for r in t.rows)   # none without library points
        auto = "auto" in t.algorithms
        headers = ["size", *t.algorithms, *(["best own"] if owned else []),
                   *(["lib / best"] if versus_lib else []), *(["auto / lib"] if auto else []),
                   *([f"{floor} (best)"] if floored else [])]
        rows = [[format_size(r.nbytes), *[format_us(r.times[a].median) if a in r.times else "-"
                                          for a in t.algorithms],
                 *([r.best or "-"] if owned else []),
                 *([_spread_ratio(r.speedup)] if versus_lib else []),
                 *([_spread_ratio(r.auto) + (f" [{','.join(r.auto_ran)}]" if r.auto_ran else "")]
                   if auto else []),
                 *([_spread_ratio(r.x_floor)] if floored else [])] for r in t.rows]
        kind, _, variant = t.memory.partition(", ")      # e.g. "device, kind cache off"
        memory = "host (NumPy's allocator)" if kind == "numpy" else kind
        title = (f"{t.library}, {t.ranks} ranks, {t.dtype}, {memory} memory"
                 f"{', ' + variant if variant else ''} ({counted(t.runs, 'run')})")
        got = targets(t, **goals)
        summary = [
            *([f"lib / best from {format_size(goals['speedup_from'])}: lowest "
               f"{_ratio_at(got.min_speedup)}"] if versus_lib else []),
            *([f"{floor} (best) from {format_size(goals['floor_from'])}: highest "
               f"{_ratio_at(got.max_x_floor)}"] if floored else []),
            *([f"auto / lib below {format_size(goals['auto_below'])}: highest {_ratio_at(got.max_auto)}"]
              if auto else [])]        # (it said "no size measured there")
        if markdown:
            out += [f"#### {title}", "", format_markdown(headers, rows), "",
                    *[f"- {s}" for s in summary], ""]
        else:
            out += [f"# {title}", format_table(headers, rows), *summary, ""]
    out.append("times: p50 in µs, the median over the runs; ratios: taken within each run, "
               "median (lowest-highest) over the runs")
    return "\n".join(out)
