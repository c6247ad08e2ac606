"""Reports of training runs (``ddlcomm train``, recipes shi2018 and awan2019).

A terminal summary (one row per configuration: measured and predicted
iteration time, images/s, exposed and hidden communication, loss, replica
check; then the scaling rows) and a self-contained HTML page with PNG copies:
the stacked per-phase breakdown of every configuration with the model's
prediction marked, measured against predicted iteration time, weak-scaling
speed-up against ideal and against the model, and the one-worker batch sweep.
Works on points as the store returns them and on flattened exported records.
"""
from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..results import export
from ..units import fusion_label
from . import plots
from .html import _CSS, CSV_NAME, _inline_svg, _meta_table, _warnings
from .tables import format_table

Point = Mapping[str, Any]
#: Stacked phases, bottom to top, with their colours; hidden communication drawn apart.
STACK = (("io", "io", "#8c564b"), ("h2d", "h2d", "#e377c2"), ("forward", "forward", "#1f77b4"),
         ("backward", "backward", "#ff7f0e"), ("update", "update", "#2ca02c"),
         ("comm_exposed", "comm exposed", "#d62728"))


def flat(p: Point) -> dict:
    """A point with its ``extra`` fields at the top level (exported records already are)."""
    e = p.get("extra")
    return {**p, **e} if isinstance(e, Mapping) else dict(p)


def is_train_run(points: Sequence[Point]) -> bool:
    return bool(points) and all(p.get("collective") == "train" for p in points)


def iterations(points: Sequence[Point]) -> list[dict]:
    return [f for f in map(flat, points) if f.get("collective") == "train" and f.get("phase") == "iteration"]


def scaling(points: Sequence[Point]) -> list[dict]:
    return [f for f in map(flat, points) if f.get("collective") == "train" and f.get("phase") == "scaling"]


def label(f: Mapping[str, Any], ranks: bool = True) -> str:
    """E.g. ``resnet50 b2 allreduce+overlap 25MiB Open MPI@2``, ``... allreduce/ring 25MiB ...``
    (ddlcomm's own all-reduce) or ``... ddp 25MiB Gloo@2``."""
    own = f.get("algorithm") not in (None, "library")
    how = "ddp" if f.get("peer") == "ddp" else \
        f"{f.get('arch')}{'/' + f['algorithm'] if own else ''}{'+overlap' if f.get('overlap') else ''}" \
        f"{'+sleep' if f.get('wait') == 'sleep' else ''}"
    text = f"{f.get('model')} b{f.get('batch')} {how} {fusion_label(int(f.get('fusion') or 0))}" \
        f"{' cuda' if f.get('device') == 'cuda' else ''}"
    return f"{text} {f.get('library') or f.get('backend')}@{f.get('ranks')}" if ranks else text


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:+.1%}"


def summary_rows(points: Sequence[Point]) -> tuple[list[str], list[list[str]]]:
    headers = ["ranks", "library", "configuration", "t_iter_ms", "predicted_ms", "error", "images/s",
               "fwd_ms", "bwd_ms", "upd_ms", "exposed_ms", "hidden_ms", "loss", "replicas", "check"]
    rows = []
    for f in iterations(points):
        ph = f.get("phases_s") or {}
        rep = f.get("replicas_identical")
        rows.append([str(f.get("ranks")), f"{f.get('library') or f.get('backend')}", label(f, ranks=False),
                     _ms(f.get("t_iter_s")), _ms(f.get("t_iter_predicted_s")),
                     _pct(f.get("predicted_error")), f"{f.get('images_per_s') or 0:.1f}",
                     _ms(ph.get("forward")), _ms(ph.get("backward")), _ms(ph.get("update")),
                     _ms(ph.get("comm_exposed")), _ms(ph.get("comm_hidden")),
                     f"{_loss(f.get('loss_first'))}->{_loss(f.get('loss_last'))}",
                     "-" if rep is None else ("identical" if rep else "DIFFER"),
                     "FAILED" if f.get("check") == "failed" else str(f.get("check"))])
    return headers, rows


def _loss(value: Optional[float]) -> str:
    """A stored loss (NaN is stored as null)."""
    return "nan" if value is None else f"{value:.3f}"


def scaling_rows(points: Sequence[Point]) -> tuple[list[str], list[list[str]]]:
    headers = ["workers", "configuration", "t_iter_ms", "speedup", "efficiency", "speedup_model",
               "efficiency_model"]
    rows = []
    for f in sorted(scaling(points), key=lambda f: (str(f.get("library")), label(f, False),
                                                    f.get("workers") or 0)):
        sp, spm = f.get("speedup"), f.get("speedup_predicted")
        rows.append([str(f.get("workers")), f"{f.get('library') or f.get('backend')} {label(f, ranks=False)}",
                     _ms(f.get("t_iter_s")), "-" if sp is None else f"{sp:.2f}",
                     "-" if f.get("efficiency") is None else f"{f['efficiency']:.0%}",
                     "-" if spm is None else f"{spm:.2f}",
                     "-" if spm is None else f"{f.get('efficiency_predicted'):.0%}"])
    return headers, rows


def render_summary(points: Sequence[Point]) -> str:
    """The terminal summary of a training run."""
    text = format_table(*summary_rows(points))
    h, rows = scaling_rows(points)
    if rows:
        text += "\n\nweak scaling (fixed batch per worker) against one worker:\n" + format_table(h, rows)
    return text


# ------------------------------------------------------------------ figures
def phases_figure(points: Sequence[Point]) -> Any:
    """Stacked per-phase time of one iteration per configuration, the communication hidden
    behind backward hatched beside the backward segment (not on top: it is not in
    t_iter), the model's predicted iteration time marked."""
    plt = plots._pyplot()
    its = iterations(points)
    if not its:
        raise ValueError("no training iterations to draw")
    fig, ax = plt.subplots(figsize=(max(6.4, 0.9 * len(its) + 2), 4.8), layout="constrained")
    x = range(len(its))
    bottom = backward = [0.0] * len(its)
    for key, name, color in STACK:
        vals = [((f.get("phases_s") or {}).get(key) or 0.0) * 1e3 for f in its]
        ax.bar(x, vals, bottom=bottom, color=color, label=name, width=0.6)
        if key == "backward":
            backward = bottom
        bottom = [b + v for b, v in zip(bottom, vals)]
    hidden = [((f.get("phases_s") or {}).get("comm_hidden") or 0.0) * 1e3 for f in its]
    shown = [i for i in x if hidden[i] > 0]      # a bar of 0 drew a stray red tick
    if shown:
        ax.bar([i + 0.37 for i in shown], [hidden[i] for i in shown],
               bottom=[backward[i] for i in shown], fill=False, hatch="//", edgecolor="#d62728",
               width=0.12, label="comm hidden behind backward (not in t_iter)")
    measured = [(f.get("t_iter_s") or 0) * 1e3 for f in its]
    ax.scatter(x, measured, marker="_", s=500, color="black", zorder=5, label="measured t_iter")
    pred = [(i, f["t_iter_predicted_s"] * 1e3) for i, f in enumerate(its) if f.get("t_iter_predicted_s")]
    if pred:
        ax.scatter([i for i, _ in pred], [v for _, v in pred], marker="D", s=30, color="white",
                   edgecolor="black", zorder=6, label="S-SGD model t_iter")
    ax.set_xticks(list(x), [label(f) for f in its], rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("time per iteration (ms)")
    return plots._finish(fig, ax, "Time per iteration by phase (critical path: the worker with the most work)")


def predicted_figure(points: Sequence[Point]) -> Any:
    """Measured against predicted t_iter, with the ±20% band."""
    plt = plots._pyplot()
    its = [f for f in iterations(points) if f.get("t_iter_predicted_s")]
    if not its:
        raise ValueError("no predictions to draw")
    fig, ax = plt.subplots(figsize=(5.6, 5.0), layout="constrained")
    m = [f["t_iter_s"] * 1e3 for f in its]
    p = [f["t_iter_predicted_s"] * 1e3 for f in its]
    hi = max(m + p) * 1.15
    ax.plot([0, hi], [0, hi], color="gray", linewidth=1, label="predicted = measured")
    ax.fill_between([0, hi], [0, hi * 0.8], [0, hi * 1.2], color="gray", alpha=0.15, label="±20%")
    for i, f in enumerate(its):
        ax.scatter(m[i], p[i], color=f"C{i % 10}", label=label(f), zorder=5)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured t_iter (ms)")
    ax.set_ylabel("S-SGD model t_iter (ms)")
    return plots._finish(fig, ax, "Measured vs predicted iteration time")


def _from_one(fs: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """Workers and ``key`` of a configuration's scaling points, from one worker: its own
    one-worker point where it has one (a parameter server's 1 worker is 2 ranks, slower
    than the baseline), else the baseline itself, (1, 1.0)."""
    fs = sorted((f for f in fs if f.get(key) is not None), key=lambda f: f["workers"])
    head = [] if fs and fs[0]["workers"] == 1 else [(1, 1.0)]
    pairs = head + [(f["workers"], f[key]) for f in fs]
    return [w for w, _ in pairs], [v for _, v in pairs]


def scaling_figure(points: Sequence[Point]) -> Any:
    """Speed-up against workers per configuration: measured, model, ideal."""
    plt = plots._pyplot()
    sc = scaling(points)
    if not sc:
        raise ValueError("no scaling points to draw")
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    groups: dict[str, list[dict]] = {}
    for f in sc:
        groups.setdefault(f"{f.get('library') or f.get('backend')} {label(f, False)}", []).append(f)
    if all(f.get("workers", 1) == 1 for f in sc):
        raise ValueError("no scaling points beyond one worker to draw")
    top = 1
    for i, (name, fs) in enumerate(sorted(groups.items())):
        w, speedup = _from_one(fs, "speedup")
        top = max(top, *w)
        ax.plot(w, speedup, marker="o", color=f"C{i % 10}", label=name)
        w, model = _from_one(fs, "speedup_predicted")
        if len(w) > 1:
            ax.plot(w, model, linestyle="--", marker="x", color=f"C{i % 10}", label=f"{name} (model)")
    # dotted and underneath: a model line on it stays visible
    ax.plot([1, top], [1, top], color="gray", linewidth=1.5, linestyle=":", zorder=1,
            label="ideal (linear)")
    _whole_workers(ax)
    ax.set_xlabel("workers")
    ax.set_ylabel("speed-up (weak scaling)")
    ax.set_ylim(bottom=0)
    return plots._finish(fig, ax, "Speed-up against one worker")


def throughput_figure(points: Sequence[Point]) -> Any:
    """Images/s of the whole job against workers, per library and configuration."""
    plt = plots._pyplot()
    its = iterations(points)
    groups: dict[str, list[dict]] = {}
    for f in its:
        if f.get("ranks") != 1:
            groups.setdefault(f"{f.get('library')} {label(f, False)}", []).append(f)
    for fs in groups.values():          # each line starts at one worker: its own, or the baseline
        g = fs[0]
        if any(f["workers"] == 1 for f in fs):
            continue
        fs += [f for f in its if f.get("ranks") == 1 and f.get("library") == g.get("library")
               and (f.get("run_id"), f.get("device")) == (g.get("run_id"), g.get("device"))
               and (f.get("model"), f.get("batch")) == (g.get("model"), g.get("batch"))][:1]
    groups = {k: v for k, v in groups.items() if len({f["workers"] for f in v}) > 1}
    if not groups:
        raise ValueError("no worker counts to draw")
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    for name, fs in sorted(groups.items()):
        fs = sorted(fs, key=lambda f: f["workers"])
        ax.plot([f["workers"] for f in fs], [f["images_per_s"] for f in fs], marker="o", label=name)
    _whole_workers(ax)
    ax.set_xlabel("workers")
    ax.set_ylabel("images/s (whole job)")
    ax.set_ylim(bottom=0)
    return plots._finish(fig, ax, "Throughput against workers")


def batch_figure(points: Sequence[Point]) -> Any:
    """Images/s of one worker against batch size, per model."""
    plt = plots._pyplot()
    one = [f for f in iterations(points) if f.get("workers") == 1 and f.get("peer") != "ddp"]
    models = {}
    for f in one:
        models.setdefault(f.get("model"), []).append(f)
    models = {m: fs for m, fs in models.items() if len({f["batch"] for f in fs}) > 1}
    if not models:
        raise ValueError("no batch sweep to draw")
    fig, ax = plt.subplots(figsize=plots._FIGSIZE, layout="constrained")
    for m, fs in models.items():
        fs = sorted(fs, key=lambda f: f["batch"])
        ax.plot([f["batch"] for f in fs], [f["images_per_s"] for f in fs], marker="o", label=m)
    ax.set_xscale("log", base=2)
    batches = sorted({f["batch"] for fs in models.values() for f in fs})
    ax.set_xticks(batches, [str(b) for b in batches])       # 16, 32, ... (not 2^4, 2^5)
    ax.minorticks_off()
    ax.set_xlabel("batch size (one worker)")
    ax.set_ylabel("images/s")
    ax.set_ylim(bottom=0)
    return plots._finish(fig, ax, "Batch-size sweep on one worker")


def layers_figure(points: Sequence[Point]) -> Any:
    """Backward time and gradient bytes of every tensor, in the order backward makes
    them ready, for the first configuration of each model (the model's WFBP input)."""
    plt = plots._pyplot()
    firsts: dict[str, dict] = {}
    for f in iterations(points):
        if f.get("layers") and f.get("model") not in firsts:
            firsts[f["model"]] = f
    if not firsts:
        raise ValueError("no per-tensor backward times to draw")
    fig, axes = plt.subplots(len(firsts), 1, figsize=(7.2, 2.6 * len(firsts)), squeeze=False,
                             layout="constrained")
    for ax, f in zip(axes[:, 0], firsts.values()):
        ms = [t * 1e3 for t, _ in f["layers"]]
        mib = [b / (1 << 20) for _, b in f["layers"]]
        x = range(len(ms))
        ax.bar(x, ms, color="#ff7f0e", width=1.0, label="backward ms")
        ax.set_ylabel("backward (ms)")
        twin = ax.twinx()
        twin.plot(x, mib, color="#1f77b4", linewidth=1, label="gradient MiB")
        twin.set_ylabel("gradient (MiB)")
        bars, line = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
        ax.legend(bars[0] + line[0], bars[1] + line[1], loc="upper right", fontsize="x-small")
        ax.set_title(f"{label(f)}: {len(ms)} tensors, last layer first", fontsize="small")
    axes[-1, 0].set_xlabel("parameter tensor, in the order its gradient became ready")
    return fig


def _whole_workers(ax) -> None:
    """Ticks at whole worker counts only (1.5 workers is no configuration)."""
    ax.xaxis.set_major_locator(plots._pyplot().MaxNLocator(integer=True))


FIGURES = (("phases", phases_figure), ("predicted", predicted_figure),
           ("scaling", scaling_figure), ("throughput", throughput_figure), ("batch", batch_figure),
           ("layers", layers_figure))


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_train_report(run: Optional[Mapping[str, Any]], points: Sequence[Point], out_dir: str | Path,
                       title: Optional[str] = None, notes: Sequence[str] = (),
                       links: Sequence[tuple[str, str]] = ()) -> Path:
    """Write ``out_dir/index.html`` (and PNG/SVG figures and the points' CSV beside it);
    return its path.  ``links``: (text, relative address) of pages that belong with it,
    above its notes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CSV_NAME).write_text(export.to_csv(points), encoding="utf-8")
    links = [*links, ("the points (CSV)", CSV_NAME)]
    title = title or f"ddlcomm training run {run.get('id') if run else ''}".strip()
    parts = [f"<h1>{escape(title)}</h1>"]
    if run:
        parts.append(_warnings(run, points, noise=False) + _meta_table(run))   # no noise column
    parts += [f'<p><a href="{escape(href)}">{escape(text)}</a></p>' for text, href in links]
    if notes:
        parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
    parts.append("<h2>Configurations</h2>" + _html_table(*summary_rows(points)))
    parts.append("<p>t_iter_ms: wall time of the timed iterations / iterations (slowest rank); "
                 "predicted_ms: the S-SGD model fed this run's per-phase and per-tensor backward "
                 "times and the cost of its buckets aggregated alone; exposed_ms: aggregation "
                 "after backward; hidden_ms: the buckets' cost alone minus what stayed exposed.</p>")
    h, rows = scaling_rows(points)
    if rows:
        parts.append("<h2>Weak scaling</h2>" + _html_table(h, rows) +
                     "<p>speedup: workers × t_iter of one worker alone (the one-rank all-reduce run "
                     "without overlap) / t_iter; speedup_model: the S-SGD model's, from the "
                     "<b>one-worker run's</b> phases and the communication measured at that many "
                     "workers (how it scales, knowing one worker and the network). It assumes a "
                     "worker computes as fast beside others as alone: where ranks share cores "
                     "(more ranks than cores), compute slows and predicted_ms above, from each "
                     "run's own phases, is the closer figure.</p>")
    figs = []
    for name, make in FIGURES:
        try:
            fig = make(points)
        except ValueError:
            continue
        paths = plots.save(fig, out / name)
        figs.append(f"<figure>{_inline_svg(paths['svg'])}</figure>")
    if figs:
        parts.append('<h2>Figures</h2><div class="plots">' + "".join(figs) + "</div>")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}'
            f"</title><style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
