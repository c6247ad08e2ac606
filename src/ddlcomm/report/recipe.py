"""Reports of named experiments, laid out like the papers' figures.

One figure per group (e.g. per collective), one panel per environment (host,
N containers; or per MPI library), one line per implementation or library,
time per call against the varied quantity (ranks, workers).  The page is
self-contained like a run's report, with PNG copies beside it.
"""
from __future__ import annotations

from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Any, Callable, Sequence

from ..results import export
from ..units import format_size
from . import plots
from .html import _CSS, CSV_NAME, _inline_svg, _safe_name
from .tables import format_check, format_us, format_when, run_library, run_warnings

Point = dict
Key = Callable[[Point], Any]


def _groups(points: Sequence[Point], key: Key) -> dict[Any, list[Point]]:
    out: dict[Any, list[Point]] = defaultdict(list)
    for p in points:
        out[key(p)].append(p)
    return out


#: What a recipe figure plots by default: (the points' key, in µs; the axis's words).
TIME_PER_CALL = ("t_avg_us", "avg time per call")


def _figure(points: Sequence[Point], title: str, panel_of: Key, x_of: Key, line_of: Key,
            x_label: str, panel_order: Sequence[Any], x_bytes: bool = False,
            y: tuple[str, str] = TIME_PER_CALL):
    plt = plots._pyplot()
    key, words = y
    points = [p for p in points if p.get(key) is not None]
    panels = [p for p in panel_order if any(panel_of(q) == p for q in points)]
    panels += sorted({panel_of(q) for q in points} - set(panels), key=str)   # none left out
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True,
                             squeeze=False, layout="constrained")
    lines = sorted({line_of(p) for p in points}, key=str)
    styles = {name: plots.nth_style(i) for i, name in enumerate(lines)}
    unit, scale = plots.time_unit(max(p[key] for p in points))
    for ax, panel in zip(axes[0], panels):
        for name in lines:
            ps = sorted((p for p in points if panel_of(p) == panel and line_of(p) == name),
                        key=x_of)
            if ps:                  # broken at a failed point, a cross in its colour there
                ax.plot([x_of(p) for p in ps], [t / scale for t in plots.values(ps, key)],
                        label=str(name), **styles[name])
                bad = [p for p in ps if p.get("check") == "failed"]
                ax.scatter([x_of(p) for p in bad], [p[key] / scale for p in bad],
                           marker="x", color=styles[name]["color"], s=60, zorder=5)
        over = sorted({x_of(p) for p in points if panel_of(p) == panel and not x_bytes
                       and p.get("run_cores") and (p.get("ranks") or 0) > p["run_cores"]})
        if over:                    # its runs had more ranks than their machine had CPUs
            ax.axvspan(over[0] - 0.5, over[-1] + 0.5, color="gray", alpha=0.12, linewidth=0,
                       label="more ranks than CPUs (oversubscribed)")
        ax.set_title(str(panel))
        ax.set_xlabel(x_label)
        ticks = sorted({x_of(p) for p in points if panel_of(p) == panel})
        if x_bytes:                          # message sizes: log scale, at most ~8 labels
            ax.set_xscale("log", base=2)
            ticks = ticks[::max(1, len(ticks) // 8)]
        ax.set_xticks(ticks)
        if x_bytes:
            ax.set_xticklabels([format_size(int(t)) for t in ticks], rotation=45, fontsize=7)
        plots.log_y(ax)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"{words} ({unit})")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        h, lab = ax.get_legend_handles_labels()
        handles += [x for x, y in zip(h, lab) if y not in labels]
        labels += [y for y in lab if y not in labels]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(labels)), fontsize=8)
    fig.suptitle(title)
    return fig


def write_recipe_report(title: str, points: Sequence[Point], out_dir: str | Path, *,
                        figure_of: Key, panel_of: Key, x_of: Key, line_of: Key, x_label: str,
                        panel_order: Sequence[Any], notes: Sequence[str] = (),
                        unavailable: Sequence[tuple[str, str]] = (), x_bytes: bool = False,
                        y: tuple[str, str] = TIME_PER_CALL) -> Path:
    """Write ``out_dir/index.html``, one PNG/SVG per figure and the points' CSV; return the
    page's path.

    ``x_bytes``: x is a message size (log scale, labelled 4B ... 256MiB); ``y``: what the
    figures plot (a key of the points in µs, and its words), the time per call by default.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    body = [f"<h1>{escape(title)}</h1>"]
    body += [f"<p>{escape(n)}</p>" for n in notes]
    if unavailable:
        items = "".join(f"<li><b>{escape(v)}</b>: {escape(r)}</li>" for v, r in unavailable)
        body.append(f"<h2>Not available on this machine</h2><ul>{items}</ul>")
    for name, group in _groups(points, figure_of).items():
        fig = _figure(group, str(name), panel_of, x_of, line_of, x_label, panel_order, x_bytes, y)
        files = plots.save(fig, out / _safe_name(str(name)))
        body.append(f"<h2>{escape(str(name))}</h2><figure>{_inline_svg(files['svg'])}</figure>")
    rows = sorted(points, key=lambda p: (str(figure_of(p)), str(panel_of(p)), str(line_of(p)), x_of(p)))
    head = "".join(f"<th>{h}</th>" for h in ("figure", "panel", "line", x_label, "avg_us",
                                            "p50_us", "p99_us", "check", "run"))
    trs = "".join(
        f"<tr class=\"{'failed' if p.get('check') == 'failed' else ''}\">"
        f"<td>{escape(str(figure_of(p)))}</td><td>{escape(str(panel_of(p)))}</td>"
        f"<td>{escape(str(line_of(p)))}</td>"
        f"<td class=num>{escape(format_size(x_of(p)) if x_bytes else str(x_of(p)))}</td>"
        f"<td class=num>{format_us(p['t_avg_us'])}</td><td class=num>{format_us(p['t_p50_us'])}</td>"
        f"<td class=num>{format_us(p['t_p99_us'])}</td><td>{format_check(p['check'])}</td>"
        f"<td class=num>{p.get('run_id', '')}</td></tr>" for p in rows)
    if rows:
        (out / CSV_NAME).write_text(export.to_csv(points), encoding="utf-8")
        body.append(f'<h2>All points</h2><p><a href="{CSV_NAME}">the points (CSV)</a></p>'
                    f"<table><tr>{head}</tr>{trs}</table>")
    page = out / "index.html"
    page.write_text(f"<!doctype html><html><head><meta charset=utf-8><title>{escape(title)}"
                    f"</title><style>{_CSS}</style></head><body>{''.join(body)}</body></html>",
                    encoding="utf-8")
    return page


def session_section(tag: str, db: Path, runs: Sequence[dict]) -> str:
    """Where a recipe page's points come from: the session's tag (``reproduce NAME
    --report-only TAG`` rewrites the page), its database and, per run, when and where it
    ran (host, CPU, its first backend's library, commit), its status and what its load warns of."""
    head = "".join(f"<th>{h}</th>" for h in ("run", "started", "host", "cpu", "cores", "library",
                                            "commit", "status", "warnings"))
    trs = "".join(
        f"<tr><td class=num>{r.get('id')}</td><td>{escape(format_when(r.get('started_at')))}</td>"
        + "".join(f"<td>{escape(str(r.get(k) or '-'))}</td>" for k in ("host", "cpu_model", "cores"))
        + f"<td>{escape(run_library(r))}</td><td>{escape(str(r.get('git_commit') or '-')[:12])}</td>"
        f"<td>{escape(str(r.get('status') or '-'))}</td>"
        f"<td>{escape('; '.join(run_warnings(r)) or '-')}</td></tr>" for r in runs)
    return (f"<h2>Session</h2><p>tag <code>{escape(tag)}</code> (rewrite this page with "
            f"<code>ddlcomm reproduce {escape(tag.partition(':')[0])} --report-only {escape(tag)} "
            f"--db {escape(str(db))}</code>); its runs:</p><table><tr>{head}</tr>{trs}</table>")
