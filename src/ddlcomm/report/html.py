"""One self-contained HTML page per run: a navigation bar, the run's metadata
and warnings, a summary with nccl-tests' avg bus bandwidth, then per
collective its plots and table.

The page inlines its CSS and every figure as SVG, and refers to nothing
outside itself but the CSV of its points written beside it (no URLs, no
scripts), so it can be mailed or archived as one file.  PNG copies of the
figures are written beside it for slides and docs.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from ..machine import load
from ..results import export
from ..results.store import ENDINGS
from ..units import counted, format_size
from . import plots
from .tables import (EXTRA_COLUMNS, PHASES_TITLE, RATIO_COLUMNS, Point, avg_busbw, format_gbps, format_when,
                     group_by_collective, heading, run_library, noise_notes, pages_note, phases_table, points_table,
                     run_warnings, series_key, varying_dimensions)

#: The CSV of the run's points, written beside index.html.
CSV_NAME = "points.csv"

_CSS = """
body { font-family: system-ui, sans-serif; margin: 0 auto 2em; padding: 0 1em; max-width: 1400px; color: #222; }
h1 { margin-bottom: .2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 13px; margin: .5em 0; }
th, td { padding: 2px 8px; border-bottom: 1px solid #eee; }
th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.meta th { width: 11em; } table.meta td { font-family: monospace; }
tr.failed td { background: #fde2e2; } td.FAILED { color: #b00; font-weight: bold; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.plots svg { width: 100%; height: auto; } figure { margin: 0; }
.summary { font-size: 15px; } .bad { color: #b00; font-weight: bold; }
pre { background: #f7f7f7; padding: .5em; white-space: pre-wrap; }
nav { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #ccc;
      padding: .4em 0; z-index: 1; font-size: 14px; }
nav a { margin-right: 1.2em; text-decoration: none; color: #0645ad; }
.warn { background: #fff4d6; border-left: 4px solid #e0a800; padding: .4em .8em; margin: .5em 0; }
.warn ul { margin: .2em 0; padding-left: 1.2em; } tr.noisy td { background: #fff4d6; }
.headline { font-size: 15px; } .headline b { font-size: 17px; }
"""


def _inline_svg(path: Path) -> str:
    """An SVG file's ``<svg>`` element alone: no XML prolog, doctype or metadata."""
    text = path.read_text(encoding="utf-8")
    text = text[text.index("<svg"):]
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)


def _safe_name(name: str) -> str:
    """A collective name usable as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "collective"


def _meta_table(run: Mapping[str, Any]) -> str:
    rows = [("status", "stale" if run.get("stale") else run.get("status")),
            ("started", format_when(run.get("started_at"))),
            ("ended", format_when(run.get("ended_at"))), ("host", run.get("host")),
            ("CPU", run.get("cpu_model")), ("cores", run.get("cores")), ("OS", run.get("os")),
            ("Python", run.get("python")), ("Library", run_library(run)),
            ("ddlcomm version", run.get("ddlcomm_version")), ("git commit", run.get("git_commit")),
            ("command", run.get("command"))]
    if run.get("load"):
        rows.append(("machine load", load.describe(run["load"])))
    if run.get("error"):
        rows.append(("error", run["error"]))
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v if v not in (None, '') else '-'))}</td></tr>"
                   for k, v in rows)
    html = f'<table class="meta">{body}</table>'
    if run.get("config"):
        config = json.dumps(run["config"], indent=2, sort_keys=True, default=str)
        html += f"<details><summary>configuration</summary><pre>{escape(config)}</pre></details>"
    if run.get("machine"):
        machine = json.dumps(run["machine"], indent=2, default=str)
        html += (f"<details><summary>machine (ddlcomm info)</summary>"
                 f"<pre>{escape(machine)}</pre></details>")
    return html


def _warnings(run: Mapping[str, Any], points: Sequence[Point], noise: bool = True) -> str:
    """A visible box of what makes this run's numbers doubtful: a run that did not end
    (interrupted, failed: its error), points whose check failed, the machine's load
    (:func:`run_warnings`) and, where the page's tables have the noise column
    (``noise``), that a noise marker flagged points."""
    items = []
    failed = sum(p.get("check") == "failed" for p in points)
    status = f"stale ({run['stale']} while it ran)" if run.get("stale") else run.get("status")
    # a run failed by its checks alone ran to its end: the failed points say it below
    if run.get("stale") or status in ENDINGS and not (status == "failed" and failed):
        items.append(f"the run is <b>{escape(str(status))}</b>"
                     + (f": {escape(str(run['error']))}" if run.get("error") else "")
                     + " (what it asked for and did not measure is not in the tables)")
    elif status == "running":
        items.append("the run is still <b>running</b>: the tables hold the points it stored "
                     "so far (write the report again when it has ended)")
    if failed:
        items.append(f'<span class="bad">{counted(failed, "point")} failed the check</span> '
                     "(listed in the summary; left out of the plots' lines and the averages)")
    items += [escape(w) for w in run_warnings(run)]
    if noise and any(noise_notes(group) for group in group_by_collective(points).values()):
        items.append("some points look like scheduler noise: see the <b>noise</b> column and "
                     "the notes under each table")
    if not items:
        return ""
    return f'<div class="warn"><b>Warning</b><ul>{"".join(f"<li>{i}</li>" for i in items)}</ul></div>'


def _busbw_table(points: Sequence[Point]) -> str:
    """nccl-tests' headline per collective and series: avg bus bandwidth over the sizes."""
    rows = [(coll, name, value, n) for coll, group in group_by_collective(points).items()
            for name, value, n in avg_busbw(group)]
    if not rows:
        return ""
    body = "".join(f"<tr><td>{escape(c)}</td><td>{escape(name or '-')}</td>"
                   f'<td class="num"><b>{format_gbps(v)}</b></td><td class="num">{n}</td></tr>'
                   for c, name, v, n in rows)
    return ("<table><thead><tr><th>collective</th><th>series</th><th>avg bus bandwidth (GB/s)</th>"
            f"<th>sizes</th></tr></thead><tbody>{body}</tbody></table>")


def _summary(points: Sequence[Point]) -> str:
    count = {c: sum(p.get("check") == c for p in points) for c in ("passed", "failed", "skipped")}
    failed = f'<span class="bad">{count["failed"]} failed</span>' if count["failed"] else "0 failed"
    colls = ", ".join(escape(c) for c in group_by_collective(points))
    html = (f'<p class="summary">{len(points)} points: {count["passed"]} passed, {failed}, '
            f'{count["skipped"]} check skipped. Collectives: {colls or "-"}. '
            f'All points as CSV: <a href="{CSV_NAME}">{CSV_NAME}</a>.</p>')
    errors = [p for p in points if p.get("error")]
    if errors:
        varying = varying_dimensions(points)
        where = [" ".join(x for x in (str(p.get("collective")), format_size(int(p.get("bytes") or 0)),
                                      series_key(p, varying)) if x) for p in errors]
        items = "".join(f"<li>{escape(w)}: {escape(str(p['error']))}</li>" for w, p in zip(where, errors))
        html += f'<ul class="bad">{items}</ul>'
    return html + _busbw_table(points)


def _td_class(numeric: bool, text: str) -> str:
    classes = " ".join(c for c in ("num" if numeric else "", "FAILED" if text == "FAILED" else "") if c)
    return f' class="{classes}"' if classes else ""


#: Headers of the points table that hold numbers (right-aligned).
_NUMERIC = {"size", "count", "iters", "ranks", *(h for h, _ in RATIO_COLUMNS),
            *(h for h, _, _ in EXTRA_COLUMNS)}


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool],
                row_css: Callable[[Sequence[str]], str] = lambda row: "") -> str:
    """A table of text cells: the ``numeric`` columns right-aligned, each row's class from
    ``row_css`` (``""``: none)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(f"<td{_td_class(num, c)}>{escape(c)}</td>" for num, c in zip(numeric, row))
        css = row_css(row)
        body.append(f'<tr class="{css}">{cells}</tr>' if css else f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _data_table(points: Sequence[Point]) -> str:
    """The terminal table's columns as HTML; rows whose check failed, or that a noise
    marker flagged, highlighted."""
    headers, rows = points_table(points)
    marks = headers.index("noise") if "noise" in headers else None
    return _html_table(headers, rows,
                       [h in _NUMERIC or h.endswith(("_us", "GB/s")) for h in headers],
                       lambda row: "failed" if row[-1] == "FAILED"
                       else "noisy" if marks is not None and row[marks] != "-" else "")


def _headline(points: Sequence[Point]) -> str:
    """Above a collective's plots: its avg bus bandwidth per series, and ps-async's
    server rate and staleness where measured."""
    parts = [f"{escape(name) + ' ' if name else ''}<b>{format_gbps(v)}</b> GB/s"
             for name, v, _ in avg_busbw(points)]
    html = f'<p class="headline">avg bus bandwidth: {", ".join(parts)}</p>' if parts else ""
    servers = {}                  # ps-async: every phase point of one run of it carries the same
    for p in sorted(points, key=lambda p: p.get("bytes") or 0):
        e = p.get("extra") or {}
        if e.get("pushes_per_s") is not None:
            where = f"{format_size(int(p.get('bytes') or 0))} {p.get('backend')}/{p.get('library')}"
            servers.setdefault(where, e)
    for where, e in servers.items():
        html += (f'<p class="headline">{escape(where)}: server <b>{e["pushes_per_s"]:.0f}</b> '
                 f'pushes/s, staleness mean <b>{e.get("staleness_mean", 0):.2f}</b>, '
                 f'max <b>{e.get("staleness_max", "-")}</b> updates</p>')
    return html


def _phases(points: Sequence[Point]) -> str:
    """The shm all-reduce's time by phase (:func:`phases_table`), where points recorded it."""
    headers, rows = phases_table(points)
    if not rows:
        return ""
    return f"<p>{escape(PHASES_TITLE)}</p>" + _html_table(headers, rows, [h != "series" for h in headers])


def _notes(points: Sequence[Point]) -> str:
    """The noise markers' legend with the points they flag, and the points whose arrays
    were partly on huge pages (:func:`pages_note`), visibly under the table."""
    blocks = []
    for title, notes in (("noise", noise_notes(points)), ("pages", [pages_note(points)])):
        items = "".join(f"<li>{escape(n)}</li>" for n in notes if n)
        if items:
            blocks.append(f'<div class="warn"><b>{title}</b><ul>{items}</ul></div>')
    return "".join(blocks)


def _figures(points: Sequence[Point], collective: str, out_dir: Path,
             styles: Mapping[str, Mapping[str, str]]) -> str:
    """Latency and bandwidth figures side by side (PNG copies written to ``out_dir``), each
    series in its style of the whole page (``styles``)."""
    parts = []
    for kind, make in (("latency", plots.latency_figure), ("bandwidth", plots.bandwidth_figure)):
        try:
            fig = make(points, collective, styles)
        except ValueError:  # nothing above 0 bytes (barrier): the table says it all
            return ""
        paths = plots.save(fig, out_dir / f"{_safe_name(collective)}-{kind}")
        parts.append(f"<figure>{_inline_svg(paths['svg'])}</figure>")
    return f'<div class="plots">{"".join(parts)}</div>'


def _nav(sections: Sequence[tuple[str, str]]) -> str:
    """The navigation bar: the run, the summary, each collective, the CSV."""
    links = [("#run", "Run"), ("#summary", "Summary"),
             *((f"#{anchor}", name) for anchor, name in sections), (CSV_NAME, "CSV")]
    return "<nav>" + "".join(f'<a href="{escape(h)}">{escape(t)}</a>' for h, t in links) + "</nav>"


def write_run_report(run: Mapping[str, Any], points: Sequence[Point], out_dir: str | Path) -> Path:
    """Write ``out_dir/index.html`` for ``run`` and its ``points``; return its path.

    Also writes ``out_dir/points.csv`` (``ddlcomm results export --format
    csv``'s columns), and ``out_dir/<collective>-latency.{png,svg}`` and
    ``-bandwidth.{png,svg}`` for each collective with sizes above 0 bytes.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CSV_NAME).write_text(export.to_csv(points), encoding="utf-8")
    title = f"ddlcomm run {run.get('id')}"
    sections, anchors, styles = [], [], plots.series_styles(points)
    for collective, group in group_by_collective(points).items():
        anchor = f"c-{_safe_name(collective)}"
        anchors.append((anchor, collective))
        sections.append(f'<section id="{escape(anchor)}"><h2>{escape(heading(group))}</h2>'
                        f"{_headline(group)}{_figures(group, collective, out, styles)}"
                        f"{_data_table(group)}{_notes(group)}{_phases(group)}</section>")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>{_nav(anchors)}"
            f'<h1 id="run">{escape(title)}</h1>{_warnings(run, points)}{_meta_table(run)}'
            f'<h2 id="summary">Summary</h2>{_summary(points)}'
            f"{''.join(sections) or '<p>No points were recorded.</p>'}</body></html>\n")
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
