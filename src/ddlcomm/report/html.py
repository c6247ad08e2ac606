"""One self-contained HTML page per run: metadata, summary, plots and tables.

The page inlines its CSS and every figure as SVG, and refers to nothing
outside itself (no URLs, no scripts), so it can be mailed or archived as one
file.  PNG copies of the figures are written beside it for slides and docs.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from . import plots
from .tables import Point, format_when, group_by_collective, heading, points_table

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; }
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
"""


def _inline_svg(path: Path) -> str:
    """An SVG file's ``<svg>`` element alone: no XML prolog, doctype or metadata."""
    text = path.read_text(encoding="utf-8")
    text = text[text.index("<svg"):]
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)


def _safe_name(name: str) -> str:
    """A collective name usable as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "collective"


def _meta_table(run: Mapping[str, Any]) -> str:
    mpi = f"{run.get('mpi_library') or ''} {run.get('mpi_version') or ''}".strip()
    rows = [("status", run.get("status")), ("started", format_when(run.get("started_at"))),
            ("ended", format_when(run.get("ended_at"))), ("host", run.get("host")),
            ("CPU", run.get("cpu_model")), ("cores", run.get("cores")), ("OS", run.get("os")),
            ("Python", run.get("python")), ("MPI library", mpi),
            ("ddlcomm version", run.get("ddlcomm_version")), ("git commit", run.get("git_commit")),
            ("command", run.get("command"))]
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


def _summary(points: Sequence[Point]) -> str:
    count = {c: sum(p.get("check") == c for p in points) for c in ("passed", "failed", "skipped")}
    failed = f'<span class="bad">{count["failed"]} failed</span>' if count["failed"] else "0 failed"
    colls = ", ".join(escape(c) for c in group_by_collective(points))
    html = (f'<p class="summary">{len(points)} points: {count["passed"]} passed, {failed}, '
            f'{count["skipped"]} check skipped. Collectives: {colls or "-"}.</p>')
    errors = [p for p in points if p.get("error")]
    if errors:
        items = "".join(f"<li>{escape(str(p.get('collective')))} {escape(str(p.get('bytes')))} B: "
                        f"{escape(str(p['error']))}</li>" for p in errors)
        html += f'<ul class="bad">{items}</ul>'
    return html


def _td_class(numeric: bool, text: str) -> str:
    classes = " ".join(c for c in ("num" if numeric else "", "FAILED" if text == "FAILED" else "") if c)
    return f' class="{classes}"' if classes else ""


def _data_table(points: Sequence[Point]) -> str:
    """The terminal table's columns as HTML; rows whose check failed highlighted."""
    headers, rows = points_table(points)
    numeric = [i for i, h in enumerate(headers) if h in ("size", "count", "ranks") or h.endswith(("_us", "GB/s"))]
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(f"<td{_td_class(i in numeric, c)}>{escape(c)}</td>" for i, c in enumerate(row))
        css = ' class="failed"' if row[-1] == "FAILED" else ""
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figures(points: Sequence[Point], collective: str, out_dir: Path) -> str:
    """Latency and bandwidth figures side by side (PNG copies written to ``out_dir``)."""
    parts = []
    for kind, make in (("latency", plots.latency_figure), ("bandwidth", plots.bandwidth_figure)):
        try:
            fig = make(points, collective)
        except ValueError:  # nothing above 0 bytes (barrier): the table says it all
            return ""
        paths = plots.save(fig, out_dir / f"{_safe_name(collective)}-{kind}")
        parts.append(f"<figure>{_inline_svg(paths['svg'])}</figure>")
    return f'<div class="plots">{"".join(parts)}</div>'


def write_run_report(run: Mapping[str, Any], points: Sequence[Point], out_dir: str | Path) -> Path:
    """Write ``out_dir/index.html`` for ``run`` and its ``points``; return its path.

    Also writes ``out_dir/<collective>-latency.{png,svg}`` and
    ``-bandwidth.{png,svg}`` for each collective with sizes above 0 bytes.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"ddlcomm run {run.get('id')}"
    sections = []
    for collective, group in group_by_collective(points).items():
        sections.append(f"<section><h2>{escape(heading(group))}</h2>"
                        f"{_figures(group, collective, out)}{_data_table(group)}</section>")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1>{_meta_table(run)}<h2>Summary</h2>{_summary(points)}"
            f"{''.join(sections) or '<p>No points were recorded.</p>'}</body></html>\n")
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
