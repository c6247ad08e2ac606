"""Latency and bandwidth versus message size (matplotlib, 'Agg' backend).

matplotlib is imported inside the functions, so ``import ddlcomm.report``
stays cheap and works without it until a plot is asked for.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from ..units import format_size
from .tables import (Point, dimension_value, group_by_collective, heading, series_key,
                     varying_dimensions)

_DPI = 110
_FIGSIZE = (6.4, 4.4)


def _pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive 'Agg' backend."""
    # matplotlib is slow to import (~0.5 s): loaded on the first figure, not by --help or a rank
    import matplotlib
    matplotlib.use("Agg")
    # pyplot only after use("Agg"), so it never picks an interactive backend
    import matplotlib.pyplot as plt
    return plt


def _select(points: Sequence[Point], collective: str) -> list[Point]:
    """Points of ``collective`` with a size above 0 bytes (a log axis cannot show 0)."""
    chosen = [p for p in points if p.get("collective") == collective and (p.get("bytes") or 0) > 0]
    if not chosen:
        raise ValueError(f"no points of {collective!r} with a size above 0 bytes to plot")
    return chosen


def _series(points: Sequence[Point]) -> list[tuple[str, list[Point]]]:
    """(label, points sorted by size) per series, labels from the varying dimensions."""
    varying = varying_dimensions(points)
    series: dict[str, list[Point]] = {}
    for p in points:
        series.setdefault(series_key(p, varying), []).append(p)
    return [(label, sorted(ps, key=lambda p: p["bytes"])) for label, ps in series.items()]


#: Markers of the 1st, 2nd, ... ten series (none is a cross, the mark of a failed point):
#: past matplotlib's ten colours a colour comes back, and the marker tells them apart.
MARKERS = ("o", "s", "^", "D", "v", "<", ">")


def series_styles(points: Sequence[Point]) -> dict[str, dict[str, str]]:
    """A style (``color``, ``marker``) per series label over every collective of ``points``,
    in the order they were measured, so that a series keeps its look from one figure to
    the next (by the order of each figure's own series, ``rhd`` was red in one and orange
    in another), and no two series of a figure look alike.

    Where series differ in two or more factors (backend x phase, algorithm x form), the
    factor of fewest values (the last on a tie) picks the marker and the others the
    colour, so that the lines of one backend, or of one phase, share a colour; where they
    would need more than ten colours or more markers than :data:`MARKERS`, and where one
    factor varies, the ``i``-th series takes :func:`nth_style`."""
    parts: dict[str, Optional[tuple[str, tuple]]] = {}
    for collective, group in group_by_collective(points).items():
        varying = varying_dimensions(group)
        factor = _marker_factor(group, varying)
        for p in group:
            parts.setdefault(series_key(p, varying) or collective, None if factor is None else (
                series_key(p, [d for d in varying if d not in factor]),
                tuple(repr(dimension_value(p, d)) for d in factor)))
    heads = list(dict.fromkeys(part[0] for part in parts.values() if part))
    tails = list(dict.fromkeys(part[1] for part in parts.values() if part))
    if len(heads) > 10 or len(tails) > len(MARKERS):
        parts = dict.fromkeys(parts)
    single = [label for label, part in parts.items() if part is None]
    return {label: nth_style(single.index(label)) if part is None else
            {"color": f"C{heads.index(part[0])}", "marker": MARKERS[tails.index(part[1])]}
            for label, part in parts.items()}


def _marker_factor(group: Sequence[Point], varying: Sequence[str]) -> Optional[tuple[str, ...]]:
    """The factor of the series of ``group`` (one collective) that takes the marker: the
    one of fewest values, the last on a tie; backend and library are one factor.  None
    where fewer than two factors vary."""
    pair = tuple(d for d in ("backend", "library") if d in varying)
    factors = ([pair] if pair else []) + [(d,) for d in varying if d not in pair]
    if len(factors) < 2:
        return None
    return min(reversed(factors),
               key=lambda f: len({tuple(repr(dimension_value(p, d)) for d in f) for p in group}))


def nth_style(i: int) -> dict[str, str]:
    """The look of the ``i``-th series of a figure: matplotlib's ten colours, then the same
    colours with the next of :data:`MARKERS`."""
    return {"color": f"C{i % 10}", "marker": MARKERS[i // 10 % len(MARKERS)]}


def time_unit(longest_us: float) -> tuple[str, float]:
    """A time axis's unit and its size in µs: ms, or µs where every time is under a
    millisecond (ticks of 10^-3 ms read badly)."""
    return ("µs", 1.0) if longest_us < 1e3 else ("ms", 1e3)


def _style(styles: Optional[Mapping[str, Mapping[str, str]]], label: str) -> dict[str, str]:
    """The line style of series ``label`` (matplotlib's next colour and a dot where none)."""
    return {"marker": "o", **(styles or {}).get(label, {})}


def log_y(ax: Any) -> None:
    """A log time or bandwidth axis: its decades in plain text (:func:`decade_label`); a
    range under a decade is labelled on its minor ticks, in plain numbers (matplotlib wrote
    them as ``3×10^0``), and so is a decade within it (``10``, not ``10¹``, beside ``20``)."""
    from matplotlib.ticker import FuncFormatter     # matplotlib is slow to import: when drawn
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if _labelled(ax, v) else decade_label(v)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if _labelled(ax, v) else ""))


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def decade_label(value: float) -> str:
    """A log axis's major tick as text: ``10⁵``, ``10⁻³`` (Unicode superscripts), other values
    as ``%g``.  matplotlib's own labels are mathtext (``$10^{5}$``): without its parsing the
    default suite's report takes 16% less time (docs/benchmarks.md, "The log axes' decades
    in plain text")."""
    if value <= 0:
        return ""
    power = round(math.log10(value))
    if math.isclose(value, 10.0 ** power, rel_tol=1e-9):
        return "10" + str(power).translate(_SUPERSCRIPT)
    return f"{value:g}"


def _labelled(ax: Any, value: float) -> bool:
    """Whether a tick is labelled as a plain number: only where the axis spans less than a
    decade (else a minor tick gets no label, since the decades' labels say it and minor ones
    would crowd them, and a decade gets :func:`decade_label`'s)."""
    lo, hi = sorted(ax.get_ylim())
    return lo > 0 and hi / lo < 10 and value > 0


def _size_axis(ax: Any, points: Sequence[Point]) -> None:
    """log2 x axis with a labelled tick at every power of two (4B, 8B, ... 1KiB, ...); where
    the sizes are not powers of two (a model's gradients) or few, a tick at each size."""
    # matplotlib is slow to import: only when a figure is drawn (see _pyplot)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    sizes = sorted({p["bytes"] for p in points})
    lo, hi = math.floor(math.log2(sizes[0])), math.ceil(math.log2(sizes[-1]))
    ax.set_xscale("log", base=2)
    ticks = [2.0 ** e for e in range(lo, hi + 1)]
    if len(sizes) <= 2 or any(s & (s - 1) for s in sizes):
        ticks, lo, hi = sizes, math.log2(sizes[0]), math.log2(sizes[-1])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(round(x)))))
    ax.set_xlim(2.0 ** lo / 1.2, 2.0 ** hi * 1.2)
    many = hi - lo > 12
    ax.tick_params(axis="x", labelrotation=90 if many else 45, labelsize="x-small" if many else "small")
    ax.set_xlabel("message size")
    ax.grid(True, which="major", alpha=0.3)


#: A legend entry's width in inches at fontsize "small": its handle and the gaps, then each
#: character of its label (an estimate: measuring the text would cost a draw).
_ENTRY_IN, _CHAR_IN = 0.55, 0.065
#: A legend row's height in inches at fontsize "small"; rows past the first two grow the figure.
_ROW_IN = 0.18


def _finish(fig: Any, ax: Any, title: str, extra_handles: Sequence[Any] = ()) -> Any:
    """Title and a legend below the axes, outside them, so it never covers the data: in as
    many columns (up to 3) as its longest label lets fit across the figure, the figure made
    taller for the rows past two (long labels ran off both edges)."""
    handles, labels = ax.get_legend_handles_labels()
    handles, labels = handles + list(extra_handles), labels + [h.get_label() for h in extra_handles]
    if len(handles) > 1 or any(labels):
        width = _ENTRY_IN + _CHAR_IN * max(len(label) for label in labels)
        ncol = max(1, min(len(handles), 3, int(fig.get_figwidth() // width)))
        rows = -(-len(handles) // ncol)
        fig.set_figheight(fig.get_figheight() + _ROW_IN * max(0, rows - 2))
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize="small", frameon=False)
    ax.set_title(title, fontsize="medium")
    return fig


def values(ps: Sequence[Point], key: str) -> list[float]:
    """Each point's ``key``, NaN where its check failed (the series' line breaks there: a
    wrong result is no time of the collective) or where it has none."""
    return [math.nan if p.get("check") == "failed" or p.get(key) is None else float(p[key])
            for p in ps]


def _mark_failed(ax: Any, ps: Sequence[Point], key: str, color: Any) -> bool:
    """Crosses in the series' colour on its points whose check failed; whether any."""
    bad = [p for p in ps if p.get("check") == "failed" and (p.get(key) or 0) > 0]
    if bad:
        ax.scatter([p["bytes"] for p in bad], [p[key] for p in bad], marker="x", s=70,
                   color=color, linewidths=2, zorder=5, clip_on=False)     # whole at the axes' ends
    return bool(bad)


def _failed_handle() -> Any:
    """The legend entry of :func:`_mark_failed`'s crosses."""
    # matplotlib is slow to import: only when a figure is drawn (see _pyplot)
    from matplotlib.lines import Line2D
    return Line2D([], [], color="gray", marker="x", linestyle="", markersize=8, markeredgewidth=2,
                  label="check failed (line broken there)")


def _title(points: Sequence[Point], what: str) -> str:
    """E.g. ``"allreduce latency"`` over ``"float32 sum, 2 ranks (Open MPI 5.0.11)"``."""
    name, _, rest = heading(points).partition("  ")
    rest = rest.replace("  (", " (").replace("  ", ", ")
    return f"{name} {what}\n{rest}" if rest else f"{name} {what}"


def latency_figure(points: Sequence[Point], collective: str,
                   styles: Optional[Mapping[str, Mapping[str, str]]] = None) -> Any:
    """Median time per call (p50, µs, log scale) versus size, p50..p99 shaded, per series.

    Returns a matplotlib Figure; raises ValueError if ``collective`` has no
    point above 0 bytes.
    """
    plt = _pyplot()
    # matplotlib is slow to import: only when a figure is drawn (see _pyplot)
    from matplotlib.patches import Patch
    chosen = _select(points, collective)
    styles = styles or series_styles(chosen)
    fig, ax = plt.subplots(figsize=_FIGSIZE, layout="constrained")
    failed = False
    series = _series(chosen)
    alpha = 0.2 if len(series) <= 3 else 0.08       # many bands would bury the lines
    for label, ps in series:
        ps = [p for p in ps if (p.get("t_p50_us") or 0) > 0]
        if not ps:
            continue
        x = [p["bytes"] for p in ps]
        p50 = values(ps, "t_p50_us")
        (line,) = ax.plot(x, p50, markersize=4, label=label or collective,
                          **_style(styles, label or collective))
        p99 = [max(p.get("t_p99_us") or p50_, p50_) for p, p50_ in zip(ps, p50)]
        if len(x) > 1:
            ax.fill_between(x, p50, p99, color=line.get_color(), alpha=alpha, linewidth=0)
        else:               # one size: no area to shade, a bar from p50 to p99 instead
            ax.vlines(x, p50, p99, color=line.get_color(), alpha=0.3, linewidth=8)
        failed |= _mark_failed(ax, ps, "t_p50_us", line.get_color())
    _size_axis(ax, chosen)
    log_y(ax)
    ax.set_ylabel("median time per call, p50 (µs)")
    band = Patch(color="gray", alpha=0.3, label="p50..p99 over iterations")
    return _finish(fig, ax, _title(chosen, "latency"), [band, *([_failed_handle()] if failed else [])])


#: Series whose peak bandwidths lie further apart than this share a log bandwidth axis.
LOG_BANDWIDTH_SPREAD = 20


def bandwidth_figure(points: Sequence[Point], collective: str,
                     styles: Optional[Mapping[str, Mapping[str, str]]] = None) -> Any:
    """Bus bandwidth (GB/s, bytes over the mean time, as nccl-tests and the tables) versus
    size per series; algbw dashed where it differs; on a log axis where the series' peaks
    lie more than :data:`LOG_BANDWIDTH_SPREAD` times apart.  Points without a bandwidth (a
    workload's local apply phase) are left out.

    Returns a matplotlib Figure; raises ValueError if ``collective`` has no
    point above 0 bytes.
    """
    plt = _pyplot()
    # matplotlib is slow to import: only when a figure is drawn (see _pyplot)
    from matplotlib.lines import Line2D
    chosen = _select(points, collective)
    styles = styles or series_styles(chosen)
    fig, ax = plt.subplots(figsize=_FIGSIZE, layout="constrained")
    dashed = failed = False
    peaks = []
    for label, ps in _series(chosen):
        ps = [p for p in ps if p.get("busbw_GBps") is not None]
        if not ps:
            continue
        x = [p["bytes"] for p in ps]
        bus, alg = values(ps, "busbw_GBps"), values(ps, "algbw_GBps")
        peaks.append(max((b for b in bus if b == b), default=0.0))
        (line,) = ax.plot(x, bus, markersize=4, label=label or collective,
                          **_style(styles, label or collective))
        if any(not math.isclose(a, b, rel_tol=1e-6) for a, b in zip(alg, bus) if a == a):
            ax.plot(x, alg, linestyle="--", linewidth=1, color=line.get_color(), alpha=0.8)
            dashed = True
        failed |= _mark_failed(ax, ps, "busbw_GBps", line.get_color())
    _size_axis(ax, chosen)
    apart = [p for p in peaks if p > 0]
    log = len(apart) > 1 and max(apart) > LOG_BANDWIDTH_SPREAD * min(apart)
    if log:             # series orders of magnitude apart: on a linear axis the slow ones lie on 0
        log_y(ax)
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{'' if dashed else 'bus '}bandwidth: bytes / mean time (GB/s"
                  f"{', log scale' if log else ''})")
    styles = [Line2D([], [], color="gray", label="busbw (solid)"),
              Line2D([], [], color="gray", linestyle="--", label="algbw (dashed)")] if dashed else []
    return _finish(fig, ax, _title(chosen, "bandwidth"),
                   [*styles, *([_failed_handle()] if failed else [])])


def save(fig: Any, path_without_suffix: str | Path) -> dict[str, Path]:
    """Write ``fig`` as PNG (110 dpi) and SVG next to each other, then close it.  Every
    figure is laid out by matplotlib's constrained layout, its legend and labels within
    the figure: no second draw to find a tight box (a fifth of a report's time).

    Returns ``{"png": Path, "svg": Path}``.  The SVG carries no metadata (no
    dates or URLs), so it can be inlined in a self-contained page.
    """
    plt = _pyplot()
    base = Path(path_without_suffix)
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = {"png": base.with_name(base.name + ".png"), "svg": base.with_name(base.name + ".svg")}
    try:
        fig.savefig(paths["png"], dpi=_DPI)
        # the layout the PNG's draw made, kept for the SVG: constrained layout would lay the
        # figure out again (a quarter of a figure's time) for the same figure
        fig.set_layout_engine("none")
        fig.savefig(paths["svg"],
                    metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    finally:
        plt.close(fig)
    return paths
