"""Tables and the report page of ``ddlcomm model`` (fits, predictions, S-SGD).

Text tables for the terminal, and one self-contained HTML page per fit:
measured vs modelled time per size for every fitted group and rank count
(held-out points marked), the relative error per point, and predicted
all-reduce and PS step time up to ``max_ranks`` ranks for each library the
fit covers.  matplotlib is imported inside the drawing functions.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any, Optional

from ..collectives import COLLECTIVES
from ..model import costs
from ..model.calibrate import SET_KEYS, family_summary, summarize
from ..units import format_size
from . import plots
from .html import _CSS, _inline_svg, _safe_name
from .plots import _pyplot, _size_axis
from .tables import format_table, format_us


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _sci(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"


#: The table's headers of the three classic parameters (the others go by their names).
HEADERS = {"alpha": "alpha_s", "beta": "beta_s/B", "gamma": "gamma_s/B"}
GREEK = {"alpha": "α", "beta": "β", "gamma": "γ"}


def _valued(name: str, value: float) -> str:
    """A parameter as captions write it: ``beta_spill`` -> ``β_spill = 1e-10 s/B``."""
    head, _, tail = name.partition("_")
    return f"{GREEK[head]}{'_' + tail if tail else ''} = {value:.3g} {'s' if head == 'alpha' else 's/B'}"


# ------------------------------------------------------------------ terminal
def render_groups(fit) -> str:
    headers = ["backend", "library", "placement", "form", "algorithm", "collective", "sizes",
               *(HEADERS.get(name, name) for name in costs.PARAMETERS), "cache",
               "points", "median_err", "max_err"]
    rows = []
    for g in fit.groups:
        k, pr, cache = g.key, g.params, fit.cache_of(g)
        rows.append([str(k.get("backend")), str(k.get("library")), str(k.get("placement")),
                     str(k.get("form")), str(k.get("algorithm")), str(k.get("collective")),
                     str(k.get("regime")), *(_sci(getattr(pr, name)) for name in costs.PARAMETERS),
                     format_size(cache) if cache else "-", str(g.points),
                     _pct(g.median_rel_err), _pct(g.max_rel_err)])
    return format_table(headers, rows)


def render_residuals(residuals: Sequence[Mapping[str, Any]]) -> str:
    """Measured against modelled per point; backend, placement, form and the algorithm that
    ran are columns where the points differ in them (else rows would look alike)."""
    differ = [k for k in ("backend", "placement", "form", "algorithm")
              if len({str(r.get(k)) for r in residuals}) > 1]
    headers = ["library", *differ, "collective", "model_alg", "ranks", "size", "measured_us",
               "model_us", "error", "set"]

    def order(r):
        return (r["heldout"], str(r["library"]), *(str(r.get(k)) for k in differ),
                str(r["collective"]), r["ranks"], r["bytes"])
    rows = [[str(r["library"]), *(str(r.get(k)) for k in differ), str(r["collective"]),
             str(r["model_algorithm"]), str(r["ranks"]), format_size(r["bytes"]),
             format_us(r["measured_s"] * 1e6), format_us(r["model_s"] * 1e6),
             f"{100 * r['rel_err']:+.1f}%", "holdout" if r["heldout"] else "fit"]
            for r in sorted(residuals, key=order)]
    return format_table(headers, rows)


def render_summary(fit) -> str:
    s = fit.meta.get("summary", {})
    from_b = fit.meta.get("summary_bytes", 0)
    lines = []
    for name in ("fitted", "heldout"):
        for label, key in (("all sizes", name), (f">= {format_size(from_b)}", f"{name}_from_{from_b}B")):
            v = s.get(key) or {}
            if v.get("points"):
                lines.append(f"{name:8} {label:>12}: {v['points']:4} points, median |error| "
                             f"{_pct(v['median_rel_err'])}, max {_pct(v['max_rel_err'])}")
    held = [r for r in fit.residuals if r["heldout"] and r["bytes"] >= from_b]
    libraries = sorted({str(r["library"]) for r in held})
    for lib in libraries if len(libraries) > 1 else ():
        v = summarize([r["rel_err"] for r in held if str(r["library"]) == lib])
        lines.append(f"heldout  {'>= ' + format_size(from_b):>12}: {v['points']:4} points, median "
                     f"|error| {_pct(v['median_rel_err'])}, max {_pct(v['max_rel_err'])}  ({lib})")
    families = family_summary(fit)
    if families:
        lines.append(f"per library and collective, >= {format_size(from_b)}: median |error| "
                     "of the fitted points, of the held-out points")
        for (lib, coll), v in families.items():
            lines.append(f"  {lib:>10} {coll:<10} fitted {_pct(v['fitted']['median_rel_err']):>7} "
                         f"({v['fitted']['points']}), held out {_pct(v['heldout']['median_rel_err']):>7} "
                         f"({v['heldout']['points']})")
    return "\n".join(lines)


def _cache(fit, cache: Optional[float]) -> str:
    """The machine's last-level cache the fit was given, and whether each set fitted its own."""
    if not cache:
        return "none (no spill term)"
    if all(g.cache is None for g in fit.groups):       # a fit file from before caches were fitted
        return format_size(cache)
    return f"{format_size(cache)} reported, each set's fitted from it (column cache)"


def _pages(fit) -> str:
    """The THP mode a fit priced single copies' pages with, and at how many of its points the
    senders' pages were measured instead (the rest by the rule, ``node.small_page_part``)."""
    if not fit.thp and not fit.meta.get("pages_measured"):
        return "not known (no page term)"
    measured = fit.meta.get("pages_measured")
    return (f"{fit.thp or 'not known'}" + (f"; the senders' pages measured at {measured} of "
                                             f"{fit.meta.get('points_fitted')} points"
                                             if measured else ""))


def render_fit(fit, residuals: bool = False) -> str:
    parts = [render_groups(fit)]
    if residuals:
        parts.append(render_residuals(fit.residuals))
    else:
        held = [r for r in fit.residuals if r["heldout"]]
        if held:
            parts.append("held-out points:\n" + render_residuals(held))
    cache, bandwidth = fit.meta.get("cache_bytes"), fit.bandwidth
    copies = (", ".join(f"{k}: {b / 1e9:.1f}" for k, b in bandwidth) + " GB/s"
              if bandwidth else "not measured (no contention term)")
    beyond = fit.meta.get("beyond_delta")
    fitted = sum(not r["heldout"] for r in fit.residuals)
    outliers = (f" ({beyond} of the {fitted} fitted points beyond δ: each pulls by its sign)"
                if beyond else "")
    parts.append(f"weighting: {fit.meta.get('weighting')}{outliers}; metric: {fit.meta.get('metric')}; "
                 f"cache: {_cache(fit, cache)}; "
                 f"copy bandwidth by concurrent copies: {copies}; "
                 f"transparent huge pages: {_pages(fit)}")
    parts.append(render_summary(fit))
    notes = fit.meta.get("notes") or []
    if notes:
        parts.append("notes:\n" + "\n".join(f"  {n}" for n in notes))
    return "\n\n".join(p for p in parts if p)


def render_tuning(table: Mapping[str, Any]) -> str:
    """A tuning table (``comm/tuning.build``): per library, collective and rank count,
    the bands of ``auto``, then each measured size's winner and its margin over the
    library's own collective where it was measured, in the time that ranked them."""
    metric = str(table.get("metric", "t_avg_us")).removeprefix("t_").removesuffix("_us")
    lines = []
    for t in table["tables"]:
        bands = ", ".join(f"{format_size(start) if start else '0'}+: {alg}"
                          for start, alg in t["bands"])
        lines.append(f"{t['library']} {t['collective']}, {t['ranks']} ranks: {bands}")
    rows = []
    for t in table["tables"]:
        for size in t["sizes"]:
            us = size["us"]
            lib = us.get("library")
            rows.append([t["library"], t["collective"], str(t["ranks"]), format_size(size["bytes"]),
                         size["best"], format_us(us[size["best"]]),
                         format_us(lib) if lib is not None else "-",
                         f"{lib / us[size['best']]:.2f}x" if lib else "-"])
    table_text = format_table(["library", "collective", "ranks", "bytes", "fastest",
                               f"{metric} us", f"library {metric} us", "gain"], rows)
    return "\n".join(lines) + "\n\n" + table_text


def render_predictions(rows: Sequence[Mapping[str, Any]]) -> str:
    """predict's table; a split fit's rows name the sizes of the set that priced them.  The
    bandwidth counts a collective's bytes as its measured points do (a gather's p messages:
    :meth:`Collective.algbw_bytes`), a PS step's its message."""
    split = any("fit_sizes" in r for r in rows)
    headers = ["collective", "algorithm", "ran_as", "ranks", "size", "time_us", "algbw_GB/s",
               *(["fit_sizes"] if split else [])]
    out = []
    for r in rows:
        t = r["seconds"]
        coll = COLLECTIVES.get(r["collective"])
        moved = coll.algbw_bytes(r["bytes"], r["ranks"]) if coll is not None else r["bytes"]
        bw = f"{moved / t / 1e9:.3g}" if t > 0 else "-"
        out.append([r["collective"], r["algorithm"], r["ran_as"], str(r["ranks"]),
                    format_size(r["bytes"]), format_us(t * 1e6), bw,
                    *([r.get("fit_sizes", "*")] if split else [])])
    return format_table(headers, out)


def render_ssgd(preds, phases, overlap: str) -> str:
    headers = ["workers", "t_iter_ms", "t_comm_ms", "exposed_ms", "hidden_ms", "speedup",
               "efficiency"]
    rows = [[str(p.workers), f"{p.t_iter * 1e3:.3f}", f"{p.t_comm * 1e3:.3f}",
             f"{p.exposed * 1e3:.3f}", f"{p.hidden * 1e3:.3f}", f"{p.speedup:.2f}",
             f"{100 * p.efficiency:.1f}%"] for p in preds]
    head = (f"S-SGD (Shi & Chu), overlap {overlap}: t_io {phases.t_io * 1e3:g} ms, t_h2d "
            f"{phases.t_h2d * 1e3:g} ms, t_f {phases.t_f * 1e3:g} ms, t_b {phases.t_b * 1e3:g} ms, "
            f"t_u {phases.t_u * 1e3:g} ms, {len(phases.layers)} layers")
    return head + "\n" + format_table(headers, rows)


# ------------------------------------------------------------------ figures
def _group_label(key: Mapping[str, Any]) -> str:
    parts = [str(key.get("library")), str(key.get("collective"))]
    if key.get("placement") not in (None, "host"):
        parts.append(str(key["placement"]))
    if key.get("form") not in (None, "buffer"):
        parts.append(str(key["form"]))
    if key.get("algorithm") not in (None, "library"):
        parts.append(str(key["algorithm"]))
    return " ".join(parts)


def _same_group(r: Mapping[str, Any], key: Mapping[str, Any]) -> bool:
    return (r["library"] == key.get("library") and r["backend"] == key.get("backend")
            and r["placement"] == key.get("placement") and r["form"] == key.get("form")
            and r["algorithm"] == key.get("algorithm")
            and key.get("collective") in ("*", r["collective"]))


def families(fit) -> dict[tuple, list]:
    """Fitted groups by everything but their size regime: one figure each."""
    out: dict[tuple, list] = {}
    for g in fit.groups:
        out.setdefault(tuple((k, v) for k, v in g.key.items() if k != "regime"), []).append(g)
    return out


def _error_axis(ex: Any, rs: Sequence[dict]) -> None:
    """The relative errors' panel: within ±200% at most, a point past it drawn as a
    triangle at the edge with its value beside it."""
    ex.axhline(0, color="gray", linewidth=0.8)
    ex.set_ylabel("(model − measured)\n/ measured (%)", fontsize="small")
    errs = [100 * r["rel_err"] for r in rs]
    lim = min(200.0, max(20.0, max(abs(e) for e in errs) * 1.1))
    ex.set_ylim(-lim, lim)
    off = [(r["bytes"], e, lim * 0.92 * (1 if e > 0 else -1)) for r, e in zip(rs, errs)
           if abs(e) > lim]
    for b, e, y in off:
        ex.scatter([b], [y], marker="^" if e > 0 else "v", color="black", s=25, zorder=5)
        ex.annotate(f"{e:+.0f}%", (b, y), fontsize="x-small", xytext=(4, 0),
                    textcoords="offset points", va="center")


def fit_figure(fit, group) -> Any:
    """Measured (markers) vs modelled (lines) time per size, one colour per rank
    count, held-out points hollow; below, the relative error per point.  All
    size regimes of ``group``'s family are drawn (the model is piecewise)."""
    plt = _pyplot()
    rs = [r for r in fit.residuals if _same_group(r, group.key)]
    fig, (ax, ex) = plt.subplots(2, 1, figsize=(6.4, 6.0), layout="constrained", sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1.3]})
    colls = sorted({r["collective"] for r in rs})
    for i, ranks in enumerate(sorted({r["ranks"] for r in rs})):
        color = f"C{i}"
        for j, coll in enumerate(colls):
            pts = sorted((r for r in rs if r["ranks"] == ranks and r["collective"] == coll),
                         key=lambda r: r["bytes"])
            if not pts:
                continue
            label = f"{ranks} ranks" + (f" {coll}" if len(colls) > 1 else "")
            x = [r["bytes"] for r in pts]
            ls = ["-", "--", ":"][j % 3]
            ax.plot(x, [r["model_s"] * 1e6 for r in pts], color=color, linestyle=ls,
                    marker="_" if len(x) == 1 else None, markersize=14,   # one size: no line
                    label=f"{label} model")
            ex.plot(x, [100 * r["rel_err"] for r in pts], color=color, linestyle=ls)
            for held in (False, True):          # a series may be held out in part (bytes=...)
                part = [r for r in pts if bool(r["heldout"]) == held]
                if not part:
                    continue
                face = "none" if held else color
                ax.plot([r["bytes"] for r in part], [r["measured_s"] * 1e6 for r in part],
                        linestyle="none", marker="o", markersize=5, color=color, markerfacecolor=face,
                        label=f"{label} measured" + (" (held out)" if held else ""))
                ex.plot([r["bytes"] for r in part], [100 * r["rel_err"] for r in part], linestyle="none",
                        marker="o", markersize=3, color=color, markerfacecolor=face)
    if not rs:
        raise ValueError("no points of this group")
    plots.log_y(ax)
    ax.set_ylabel("time per call (µs)")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"{_group_label(group.key)}: measured vs model", fontsize="medium")
    _error_axis(ex, rs)
    _size_axis(ex, [{"bytes": r["bytes"]} for r in rs])
    ex.xaxis.set_tick_params(labelbottom=True)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize="x-small",
               frameon=False)
    return fig


def scaling_rows(fit, max_ranks: int, sizes: Sequence[int]) -> list[dict]:
    """Predicted all-reduce (library and ring) and PS step time per parameter set of the
    fit (``set``: its library, and its backend, placement or form where the sets differ in
    them), at 2, 4, ..., ``max_ranks`` ranks (one node's cores per node: no
    oversubscription), for each size.  A set without the collectives a line needs has none."""
    sets = fit.parameter_sets()
    differ = [k for k in SET_KEYS if k == "library" or len({s[k] for s in sets}) > 1]
    ranks = []
    p = 2
    while p <= max_ranks:
        ranks.append(p)
        p *= 2
    if ranks[-1] != max_ranks:
        ranks.append(max_ranks)
    rows = []
    for want in sets:
        label = " ".join(str(want[k]) for k in differ)
        for what, needs, alg in (("allreduce (library)", ("allreduce",), "library"),
                                 ("allreduce (ring)", ("allreduce",), "ring"),
                                 ("PS step (library)", ("broadcast", "gather"), "library")):
            if not all(fit.has(c, **want) for c in needs):
                continue
            price = costs.ps_time if needs[0] == "broadcast" else costs.allreduce_time
            rows += [{"set": label, "what": what, "bytes": n, "ranks": p,
                      "seconds": price(fit, alg, p, n, **want)} for n in sizes for p in ranks]
    return rows


def scaling_figure(rows: Sequence[Mapping[str, Any]], nbytes: int) -> Any:
    """Predicted time versus ranks (log-log) at one size: a colour (and marker) per
    parameter set, a line style per what is predicted; the legend names each once, so a
    fit of many sets (72 of a woo2020 session) keeps a readable figure."""
    plt = _pyplot()
    # matplotlib is slow to import: only when a figure is drawn (see _pyplot)
    from matplotlib.lines import Line2D
    chosen = [r for r in rows if r["bytes"] == nbytes]
    series: dict[tuple, list] = {}
    for r in chosen:
        series.setdefault((r["set"], r["what"]), []).append(r)
    styles = {"allreduce (library)": "-", "allreduce (ring)": "--", "PS step (library)": ":"}
    sets = list(dict.fromkeys(k[0] for k in series))
    whats = list(dict.fromkeys(k[1] for k in series))
    ncol = 3 if len(sets) > 8 else 2
    legend_rows = -(-(len(sets) + len(whats)) // ncol)
    fig, ax = plt.subplots(figsize=(6.4, 4.0 + 0.17 * legend_rows), layout="constrained")
    unit, scale = plots.time_unit(max(r["seconds"] for r in chosen) * 1e6)
    for (label, what), rs in series.items():
        rs = sorted(rs, key=lambda r: r["ranks"])
        ax.plot([r["ranks"] for r in rs], [r["seconds"] * 1e6 / scale for r in rs],
                linestyle=styles.get(what, "-"), markersize=3, **plots.nth_style(sets.index(label)))
    ax.set_xscale("log", base=2)
    ranks = sorted({r["ranks"] for r in chosen})     # each one predicted (--max-ranks 3 too)
    ax.set_xticks(ranks, [str(p) for p in ranks], minor=False)
    plots.log_y(ax)
    ax.set_xlabel("ranks")
    ax.set_ylabel(f"predicted time ({unit})")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"predicted {_predicted(whats)}, {format_size(nbytes)} per rank\n"
                 "(fitted parameters, one node's cores per node)", fontsize="medium")
    handles = [Line2D([], [], linestyle="", markersize=5, label=label, **plots.nth_style(i))
               for i, label in enumerate(sets)]
    handles += [Line2D([], [], color="gray", linestyle=styles.get(w, "-"), label=w) for w in whats]
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize="x-small",
               frameon=False)
    return fig


def _predicted(whats: Sequence[str]) -> str:
    """What the scaling figures predict, in words: "all-reduce and PS step"."""
    names = list(dict.fromkeys("PS step" if w.startswith("PS") else "all-reduce" for w in whats))
    return " and ".join(names)


def _not_predicted(whats: Sequence[str]) -> list[str]:
    """Why a scaling line is missing: the fit lacks a collective it is priced from."""
    lines = []
    if not any(w.startswith("allreduce") for w in whats):
        lines.append("No all-reduce predicted: no parameter set of the fit has allreduce points.")
    if not any(w.startswith("PS") for w in whats):
        lines.append("No PS step predicted: it is priced as a broadcast then a gather, and no "
                     "parameter set of the fit has both (fit runs of both collectives to see it).")
    return lines


# ------------------------------------------------------------------ page
def write_model_report(fit, out_dir: Path, max_ranks: int = 1024,
                       sizes: Sequence[int] = (1 << 20, 64 << 20)) -> Path:
    """Write ``out_dir/index.html`` (figures inline as SVG, PNG copies beside it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for i, groups in enumerate(families(fit).values()):
        try:
            fig = fit_figure(fit, groups[0])
        except ValueError:
            continue
        paths = plots.save(fig, out / f"fit-{i:02d}-{_safe_name(_group_label(groups[0].key))}")
        lines = []
        for g in groups:
            p = g.params
            values = ", ".join(_valued(name, getattr(p, name)) for name in costs.PARAMETERS)
            regime = g.key.get("regime") or "*"
            lines.append(f"{_group_label(g.key)}, "
                         f"{'every size' if regime == '*' else 'sizes ' + regime}: {values}; "
                         f"{g.points} points fitted, median "
                         f"|error| {_pct(g.median_rel_err)}, max {_pct(g.max_rel_err)}")
        caption = "<br>".join(escape(line) for line in lines)
        sections.append(f"<figure>{_inline_svg(paths['svg'])}<figcaption>{caption}"
                        f"</figcaption></figure>")
    rows = scaling_rows(fit, max_ranks, sizes)
    whats = list(dict.fromkeys(r["what"] for r in rows))
    scaling = [f"<p>{escape(line)}</p>" for line in _not_predicted(whats)]
    for n in sizes:
        if any(r["bytes"] == n for r in rows):
            paths = plots.save(scaling_figure(rows, n), out / f"predicted-{_safe_name(format_size(n))}")
            scaling.append(f"<figure>{_inline_svg(paths['svg'])}</figure>")
    summary = escape(render_summary(fit))
    table = escape(render_groups(fit))
    meta = escape(json.dumps({k: v for k, v in fit.meta.items() if k != "summary"},
                             indent=1, default=str))
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>ddlcomm model report</title><style>{_CSS}</style></head><body>"
            f"<h1>ddlcomm model report</h1><h2>Summary</h2><pre>{summary}</pre>"
            f"<h2>Fitted parameters</h2><pre>{table}</pre>"
            f"<details><summary>fit settings</summary><pre>{meta}</pre></details>"
            f"<h2>Measured vs modelled, per size</h2><div class=\"plots\">{''.join(sections)}</div>"
            f"<h2>Predicted {_predicted(whats) + ' ' if whats else ''}time to {max_ranks} ranks</h2>"
            f"<div class=\"plots\">{''.join(scaling)}</div>"
            f"<h2>Residuals</h2><pre>{escape(render_residuals(fit.residuals))}</pre>"
            f"</body></html>\n")
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
