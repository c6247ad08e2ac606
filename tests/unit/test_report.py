"""Tables, plots and the HTML page of ddlcomm.report, on synthetic points (no MPI)."""
from __future__ import annotations

import re

import pytest
from matplotlib.colors import to_rgba

from ddlcomm.report import (render_compare, render_points, render_run, render_runs, series_key,
                            varying_dimensions, write_run_report)
from ddlcomm.report.tables import avg_busbw, format_gbps, format_us

COLLECTIVES = {"broadcast": (None, 1.0), "gather": (None, 0.5), "allreduce": ("sum", 1.0)}
SIZES = [4, 64, 1024, 16384, 1 << 20, 16 << 20]
RUN = {"id": 7, "started_at": "2025-11-21T05:50:00", "ended_at": "2025-11-21T05:51:10",
       "status": "done", "error": None, "host": "node<1>", "cpu_model": "Xeon & co", "cores": 16,
       "os": "Linux 6.1", "python": "3.11.9", "mpi_library": "Open MPI", "mpi_version": "5.0.11",
       "ddlcomm_version": "0.1.0", "git_commit": "abc1234",
       "command": "ddlcomm bench " + "--sizes 4B:16MiB " * 8, "config": {"ranks": 2}}


def make_point(collective: str, form: str, nbytes: int, **over) -> dict:
    op, factor = COLLECTIVES[collective]
    t = 2.0 + nbytes / 5e3 * (3 if form == "object" else 1)
    algbw = nbytes / (t * 1e-6) / 1e9
    point = dict(run_id=7, backend="mpi", library="Open MPI", library_version="5.0.11",
                 collective=collective, form=form, algorithm="library", dtype="float32", op=op,
                 bytes=nbytes, count=nbytes // 4, ranks=2, root=0, in_place=False,
                 iterations=100, warmup=10, t_min_us=0.9 * t, t_avg_us=t, t_max_us=1.2 * t,
                 t_p50_us=t, t_p99_us=1.5 * t, algbw_GBps=algbw, busbw_GBps=algbw * factor,
                 check="passed", error=None, extra={"segments": nbytes // 4})
    point.update(over)
    return point


@pytest.fixture
def points() -> list[dict]:
    pts = [make_point(c, f, s) for c in COLLECTIVES for f in ("buffer", "object") for s in SIZES]
    bad = next(p for p in pts if p["collective"] == "gather" and p["bytes"] == 1024
               and p["form"] == "object")
    bad.update(check="failed", error="rank 1: wrong value at index 3")
    return pts


def test_facts_that_follow_a_data_path_name_no_series():
    """The nccl-chief path's chief, GPU sharing and sync were series of their own: tables
    grew their columns and the plots' legends ran off the figure."""
    facts = {"host": {"sync": False}, "host-staged": {"sync": True},
             "nccl-chief": {"sync": True, "chief": 1, "gpu_sharing": "NCCL_HOSTID per rank"}}
    pts = [make_point("allreduce", "buffer", s, extra={"phase": phase, "path": path, **more})
           for path, more in facts.items() for phase in ("allreduce", "d2h") for s in SIZES]
    assert varying_dimensions(pts) == ["phase", "path"]
    from ddlcomm.report import plots
    long = [make_point("allreduce", "buffer", s, extra={"phase": f"broadcast.broadcast{i}", "path": path})
            for i in range(6) for path in ("host-staged", "nccl-chief") for s in SIZES]
    short = [make_point("allreduce", "buffer", s, extra={"phase": p}) for p in "ab" for s in SIZES]
    for pts, columns, taller in ((long, 1, True), (short, 3, False)):   # 3: the band's entry too
        fig = plots.latency_figure(pts, "allreduce")
        assert fig.legends[0]._ncols == columns and (fig.get_figheight() > 4.4) == taller
        plots._pyplot().close(fig)


def test_varying_dimensions_and_series_key(points):
    assert varying_dimensions(points) == ["form"]  # extra 'segments' varies only with size
    one_form = [p for p in points if p["form"] == "buffer"]
    assert varying_dimensions(one_form) == []
    assert series_key(points[0], []) == ""
    mixed = points + [make_point("allreduce", "buffer", 4, library="MPICH",
                               extra={"segments": 1, "phase": "warm"})]
    assert varying_dimensions(mixed) == ["library", "form"]     # phase follows the library
    mixed.append(make_point("allreduce", "buffer", 4, library="MPICH",
                            extra={"segments": 1, "phase": "cold"}))
    dims = varying_dimensions(mixed)
    assert dims == ["library", "form", "phase"]
    assert series_key(mixed[0], dims) == "mpi/Open MPI buffer phase=-"
    own = [make_point("allreduce", "buffer", 4, algorithm=a,
                      extra={"kernel": "C kernel, avx2"} if a != "library" else {})
           for a in ("library", "ring")]
    assert varying_dimensions(own) == ["algorithm"]             # the kernel follows it
    assert series_key(make_point("allreduce", "object", 4, ranks=4, in_place=True),
                      ["form", "ranks", "in_place"]) == "object 4 ranks in-place"


def test_render_points_tables(points):
    text = render_points(points)
    blocks = text.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [
        "# broadcast  float32  2 ranks  (Open MPI 5.0.11)",
        "# gather  float32  2 ranks  (Open MPI 5.0.11)",
        "# allreduce  float32 sum  2 ranks  (Open MPI 5.0.11)"]
    header = blocks[0].splitlines()[1].split()
    assert header == ["size", "count", "iters", "form", "min_us", "avg_us", "max_us", "p50_us",
                      "p99_us", "algbw_GB/s", "busbw_GB/s", "check"]
    rows = blocks[0].splitlines()[3:15]
    assert len(rows) == 12 and rows[0].split()[:4] == ["4B", "1", "100", "buffer"]
    assert rows[1].split()[3] == "object" and rows[-1].split()[0] == "16MiB"
    # nccl-tests' headline under each table: mean busbw over the sizes, per series
    assert blocks[0].splitlines()[15].startswith("# avg bus bandwidth: buffer ")
    assert "noise" not in text                                   # nothing flagged
    assert "FAILED" in blocks[1] and "FAILED" not in blocks[0] + blocks[2]
    assert "wrong value at index 3" in blocks[1]
    # no form column when only one form is shown
    single = render_points([p for p in points if p["form"] == "buffer"])
    assert " form " not in single.splitlines()[1] and "buffer" not in single


def test_number_formats():
    assert [format_us(v) for v in (1.234, 12.34, 1234.5, None)] == ["1.23", "12.3", "1234", "-"]
    assert [format_gbps(v) for v in (123.4, 12.34, 1.234, 0.001234)] == ["123", "12.3", "1.23", "0.00123"]


def test_render_runs_and_run(points):
    listed = render_runs([dict(RUN, n_points=36, n_passed=35, n_failed=1,
                               collectives=["broadcast", "gather"], point_ranks="2,3",
                               point_backends="mpi,gloo")])
    head, _, row = listed.splitlines()
    assert head.split()[:7] == ["id", "started", "status", "host", "library", "backends", "ranks"]
    assert " mpi,gloo  2,3 " in row
    assert "2025-11-21 05:50:00" in row and "Open MPI 5.0.11" in row and "broadcast,gather" in row
    from ddlcomm.report.tables import format_when            # the store's times are UTC: said so
    assert format_when("2026-11-20T23:00:00+00:00") == "2026-11-20 23:00:00 UTC"
    assert format_when("2026-11-21T01:00:00+02:00") == "2026-11-20 23:00:00 UTC"
    assert format_when(0) == "1970-01-01 00:00:00 UTC" and format_when(None) == "-"
    assert row.endswith("...") and len(row.split("ddlcomm bench")[1]) <= 60
    shown = render_run(RUN)
    assert "host:" in shown and "git commit: abc1234" in shown and "config:" in shown
    assert "gpus:" not in shown and "load:" not in shown        # a run stored before schema 2, 4
    verdict = "no GPU: GPU memory kinds (pinned, device), nccl and the GPU paths are unavailable here"
    assert f"gpus:       {verdict}" in render_run(dict(RUN, machine={"gpu_verdict": verdict}))
    assert render_runs([]) == "(no runs)"
    busy = render_run(dict(RUN, load={"ranks": 4, "usable_cores": 2, "wall_s": 1.0}))
    assert "load:       load average ? -> ?; 4 ranks on 2 CPUs over 1.0 s" in busy
    assert "warning:    oversubscribed: 4 ranks on 2 usable CPUs" in busy


def test_render_compare():
    def row(nbytes, a, b, **kw):
        return dict(backend="mpi", library="Open MPI", collective="allreduce", form="buffer",
                    algorithm="library", dtype="float32", op="sum", bytes=nbytes, ranks=2,
                    in_place=False, t_avg_us_a=a, t_avg_us_b=b, ratio=(b / a if a and b else None),
                    busbw_GBps_a=1.5, busbw_GBps_b=2.0, check_a="passed", check_b="failed", **kw)
    text = render_compare([row(1024, 10.0, 12.3, ratio_p50=0.9), row(4, 2.0, None)], RUN, 9)
    lines = text.splitlines()
    assert lines[0].startswith("a = run 7 (node<1>, Open MPI 5.0.11") and lines[1] == "b = run 9"
    assert lines[3] == "# allreduce  float32 sum  2 ranks  (Open MPI)"
    assert lines[4].split() == ["size", "avg_us_a", "avg_us_b", "b/a", "b/a_p50", "busbw_a",
                                "busbw_b", "check_a", "check_b"]
    first, second = lines[6].split(), lines[7].split()
    assert first[0] == "4B" and first[3] == "-" and first[2] == "-"
    assert second[:5] == ["1KiB", "10.0", "12.3", "1.23x", "0.90x"] and second[-1] == "FAILED"
    # a workload's phases are a row's own key: a column where they differ
    phases = [dict(row(1024, t, t), collective="ps-sync", phase=ph)
              for t, ph in ((5.0, "broadcast"), (1.0, "apply"), (9.0, "step"))]
    lines = render_compare(phases, RUN, 9).splitlines()
    assert lines[4].split()[:2] == ["size", "phase"]
    assert [line.split()[1] for line in lines[6:9]] == ["apply", "broadcast", "step"]
    # where a size's two sides' senders differ in huge pages, both are shown, and why
    text = render_compare([row(4 << 20, 170.0, 79.0, huge_a=0.5, huge_b=1.0),
                           row(16 << 20, 700.0, 560.0, huge_a=0.875, huge_b=1.0)], RUN, 9)
    lines = text.splitlines()
    assert lines[4].split() == ["size", "avg_us_a", "avg_us_b", "b/a", "b/a_p50", "busbw_a",
                                "busbw_b", "huge_a", "huge_b", "check_a", "check_b"]
    assert lines[6].split()[7:9] == ["50%", "100%"] and lines[7].split()[7] == "passed"
    assert "huge_a, huge_b: the part of the arrays the data came from on huge pages" in text
    assert "huge_a" not in render_compare([row(4, 1.0, 1.0, huge_a=0.5, huge_b=0.6)], RUN, 9)


def test_write_run_report(points, tmp_path):
    index = write_run_report(RUN, points, tmp_path / "report")
    assert index == tmp_path / "report" / "index.html"
    page = index.read_text(encoding="utf-8")
    assert "<title>ddlcomm run 7</title>" in page and page.count("<svg") == 6
    assert "node&lt;1&gt;" in page and "Xeon &amp; co" in page  # escaped
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page)
    assert "<script" not in page and "<link" not in page
    assert page.count('class="failed"') == 1 and "35 passed" in page
    for coll in COLLECTIVES:
        for kind in ("latency", "bandwidth"):
            png = tmp_path / "report" / f"{coll}-{kind}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # navigation bar, the CSV beside the page and linked, nccl-tests' headline, iterations
    assert '<nav><a href="#run">Run</a><a href="#summary">Summary</a>' in page
    assert '<a href="#c-gather">gather</a><a href="#c-allreduce">allreduce</a>' in page
    assert page.count('href="points.csv"') == 2 and '<section id="c-broadcast">' in page
    csv = (tmp_path / "report" / "points.csv").read_text().splitlines()
    assert csv[0].startswith("run_id,backend,library,collective") and len(csv) == len(points) + 1
    assert "avg bus bandwidth: buffer <b>" in page and "<th>avg bus bandwidth (GB/s)</th>" in page
    assert "<th>iters</th>" in page
    # a quiet run, no flagged point: its one warning is the failed point, named in the summary
    assert page.count("<li>") == 2 and "noise" not in page and "oversubscribed" not in page
    assert '<span class="bad">1 point failed the check</span>' in page
    assert "<li>gather 1KiB object: rank 1: wrong value at index 3</li>" in page


def test_failed_points_break_the_lines_and_leave_the_averages(points):
    from ddlcomm.report.plots import bandwidth_figure, latency_figure
    gather = [p for p in points if p["collective"] == "gather"]
    obj = [p for p in gather if p["form"] == "object"]
    healthy = [p["busbw_GBps"] for p in obj if p["check"] == "passed"]
    assert dict((name, (v, n)) for name, v, n in avg_busbw(gather))["object"] == \
        (pytest.approx(sum(healthy) / len(healthy)), len(SIZES) - 1)
    for make, key in ((latency_figure, "t_p50_us"), (bandwidth_figure, "busbw_GBps")):
        fig = make(gather, "gather")
        ax = fig.axes[0]
        line = next(line for line in ax.get_lines() if line.get_label() == "object")
        y = list(line.get_ydata())
        failed = [i for i, p in enumerate(sorted(obj, key=lambda p: p["bytes"])) if p["check"] == "failed"]
        assert [i for i, v in enumerate(y) if v != v] == failed           # NaN: the line breaks
        cross = ax.collections[-1]                                         # the cross, in its colour
        assert tuple(cross.get_edgecolor()[0]) == pytest.approx(to_rgba(line.get_color()))
        assert any(t.get_text() == "check failed (line broken there)" for t in fig.legends[0].texts)
    assert "mean time" in bandwidth_figure(gather, "gather").axes[0].get_ylabel()


@pytest.fixture
def text_only(monkeypatch):
    """Run reports without their figures, for tests of the page's words: drawing them took
    most of such a test's 9-15 s (the figures have tests of their own)."""
    from ddlcomm.report import html
    monkeypatch.setattr(html, "_figures", lambda *args: "")


@pytest.mark.usefixtures("text_only")
def test_run_report_warns_of_a_run_that_did_not_end(points, tmp_path):
    run = dict(RUN, status="interrupted", error="interrupted (SIGTERM) during allreduce 512KiB")
    page = write_run_report(run, points, tmp_path / "r").read_text()
    assert "the run is <b>interrupted</b>: interrupted (SIGTERM) during allreduce 512KiB" in page
    page = write_run_report(dict(RUN, status="running", stale="its owner died"), points,
                            tmp_path / "s").read_text()
    assert "the run is <b>stale (its owner died while it ran)</b>" in page
    assert "<th>status</th><td>stale</td>" in page.replace("\n", "")        # the facts say so too
    page = write_run_report(dict(RUN, status="running"), points, tmp_path / "t").read_text()
    assert "the run is still <b>running</b>: the tables hold the points it stored so far" in page


def test_run_report_warns_of_noise_and_shows_ps_async(points, tmp_path):
    noisy = [dict(p, t_p50_us=8000.0, t_p99_us=8100.0) if p["bytes"] == 1024 else p for p in points]
    ps = dict(make_point("allreduce", "buffer", 1 << 20), collective="ps-async",
              extra={"phase": "step", "pushes_per_s": 812.3, "staleness_mean": 0.75,
                     "staleness_max": 2})
    load = {"ranks": 3, "usable_cores": 2, "wall_s": 9.0, "loadavg_before": [0.1, 0, 0],
            "loadavg_after": [2.0, 1, 1], "busy_s": 17.0, "steal_s": 0.0, "own_cpu_s": 16.0,
            "others_cpu_s": 1.0, "others_cores": 0.11}
    page = write_run_report(dict(RUN, load=load), noisy + [ps], tmp_path / "r").read_text()
    assert '<div class="warn"><b>Warning</b>' in page
    assert "oversubscribed: 3 ranks on 2 usable CPUs" in page
    assert "machine load</th><td>load average 0.10 -&gt; 2.00; others 0.11 cores" in page
    assert page.count('class="noisy"') == 5 and page.count('class="failed"') == 1  # failed wins
    assert "Q (2 points: 1KiB buffer, 1KiB object)" in page
    assert "server <b>812</b> pushes/s, staleness mean <b>0.75</b>, max <b>2</b>" in page
    assert "<th>pushes/s</th><th>stale_mean</th><th>stale_max</th>" in page


def test_figures_need_sizes(points):
    from ddlcomm.report.plots import latency_figure
    with pytest.raises(ValueError, match="barrier"):
        latency_figure([dict(make_point("broadcast", "buffer", 0), collective="barrier")], "barrier")


def test_the_table_says_what_auto_ran():
    from ddlcomm.report.tables import points_table
    pts = [make_point("allreduce", "buffer", s, algorithm=a,
                      extra={"algorithm_run": ran if a == "auto" else a})
           for s, ran in ((1024, "library"), (1 << 20, "shm")) for a in ("library", "auto")]
    headers, rows = points_table(pts)
    col = headers.index("auto_ran")
    assert [(r[0], r[headers.index("algorithm")], r[col]) for r in rows] == [
        ("1KiB", "auto", "library"), ("1KiB", "library", "-"), ("1MiB", "auto", "shm"),
        ("1MiB", "library", "-")]
    assert "auto_ran" not in points_table(pts[:1])[0]


def test_a_models_size_gets_its_own_tick():
    """A --model workload's one size (16.1MiB) sat beside a 16MiB tick, the axis running on
    empty to 32MiB."""
    from ddlcomm.report.plots import latency_figure
    ax = latency_figure([make_point("allreduce", "buffer", 16_900_000)], "allreduce").axes[0]
    assert list(ax.get_xticks()) == [16_900_000]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["~16.1MiB"]
    sweep = latency_figure([make_point("allreduce", "buffer", s) for s in SIZES], "allreduce").axes[0]
    assert len(sweep.get_xticks()) == 23                    # every power of two, 4B..16MiB


def test_a_series_keeps_its_colour_from_figure_to_figure():
    from ddlcomm.report.plots import latency_figure, series_styles
    pts = [make_point(c, "buffer", s, algorithm=a) for c, algs in
           (("allreduce", ("library", "ring", "rhd")), ("broadcast", ("library", "rhd")))
           for a in algs for s in (1024, 4096)]
    styles = series_styles(pts)
    assert {a: st["color"] for a, st in styles.items()} == {"library": "C0", "ring": "C1", "rhd": "C2"}
    for coll in ("allreduce", "broadcast"):
        lines = latency_figure(pts, coll, styles).axes[0].get_lines()
        assert {line.get_label(): line.get_color() for line in lines} == \
            {a: styles[a]["color"] for a in ({"library", "rhd"} | ({"ring"} if coll == "allreduce" else set()))}


def test_no_two_series_look_alike_past_ten():
    """20 series (2 backends x 5 algorithms x 2 forms) drew in 10 colours: pairs alike."""
    from ddlcomm.report.plots import latency_figure
    pts = [make_point("allreduce", form, s, algorithm=a, backend=b) for b in ("mpi", "gloo")
           for a in ("library", "ring", "rhd", "shm", "auto") for form in ("buffer", "object")
           for s in (1024, 4096)]
    lines = latency_figure(pts, "allreduce").axes[0].get_lines()
    looks = [(line.get_color(), line.get_marker()) for line in lines if line.get_label()[0] != "_"]
    assert len(looks) == 20 and len(set(looks)) == 20


def test_series_of_two_factors_share_a_colour_per_factor():
    """Backend x phase drew three unrelated colours per backend: now a colour per phase
    (the factor of more values) and a marker per backend."""
    from ddlcomm.report.plots import latency_figure, series_styles
    pts = [make_point("allreduce", "buffer", s, backend=b, library=b, extra={"phase": ph})
           for b in ("mpi", "gloo") for ph in ("d2h", "collective", "h2d") for s in (1024, 4096)]
    looks = {label: (st["color"], st["marker"]) for label, st in series_styles(pts).items()}
    assert len(looks) == 6 and len(set(looks.values())) == 6
    for ph in ("d2h", "collective", "h2d"):
        assert len({c for label, (c, _) in looks.items() if label.endswith(f"phase={ph}")}) == 1
    for b in ("mpi", "gloo"):
        assert len({m for label, (_, m) in looks.items() if label.startswith(b)}) == 1
    lines = latency_figure(pts, "allreduce").axes[0].get_lines()
    assert {(line.get_color(), line.get_marker()) for line in lines
            if line.get_label()[0] != "_"} == set(looks.values())


@pytest.mark.usefixtures("text_only")
def test_a_run_failed_by_its_checks_alone_is_not_called_cut_short(points, tmp_path):
    run = dict(RUN, status="failed", error="1 points failed their check")
    page = write_run_report(run, points, tmp_path / "r").read_text()
    assert "the run is <b>failed</b>" not in page and "1 point failed the check" in page
    crashed = dict(RUN, status="failed", error="ranks ended with exit code 3 during gather")
    page = write_run_report(crashed, [p for p in points if p["check"] == "passed"],
                            tmp_path / "c").read_text()
    assert "the run is <b>failed</b>: ranks ended with exit code 3 during gather" in page


@pytest.mark.usefixtures("text_only")
def test_points_whose_arrays_were_partly_on_huge_pages_are_named(points, tmp_path):
    """A size whose NumPy arrays some rank had partly on huge pages gets one line under its
    table (and in the report): its time depends on where the allocator put them."""
    def pages(share):
        return {"memory": "numpy", "huge_share_ranks": share}
    marked = [dict(p, extra={**p["extra"], "pages": pages([0.5, 1.0] if p["bytes"] == 16 << 20
                                                             else [0.0, 0.0])})
              for p in points if p["collective"] == "broadcast"]
    text = render_points(marked)
    assert "pages (2 points: 16MiB buffer, 16MiB object): NumPy's arrays 50-100% on huge pages" in text
    assert "--memory hugepage or pageable" in text
    assert "pages (" not in render_points([dict(p, extra={"pages": pages([1.0, 1.0])}) for p in marked])
    assert "pages (" not in render_points(points)                  # nothing recorded: nothing said
    page = write_run_report(RUN, marked, tmp_path / "r").read_text()
    assert "<b>pages</b><ul><li>pages (2 points: 16MiB buffer, 16MiB object)" in page


def test_the_shm_all_reduces_time_by_phase_follows_its_table(tmp_path):
    phases = ("wait_free", "stage", "wait_ready", "reduce", "wait_reduced", "unstage")

    def timed(*us):
        return dict(zip(phases, us))
    pts = [make_point("allreduce", "buffer", 1 << 20, algorithm=a, extra=e) for a, e in (
        ("library", {}),
        ("shm", {"shm_chunk": 1 << 19, "shm_stream": False,
                 "shm_phases_us": {"0": timed(1, 10, 1, 20, 8, 10), "1": timed(1, 10, 3, 20, 6, 10)}}),
        ("shm@128KiB", {"shm_chunk": 1 << 17, "shm_stream": False}))]
    text = render_points(pts)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("# shm's time by phase"))
    assert lines[at + 1].split() == ["size", "series", *phases, "sum", "waiting"]
    # the ranks' mean per phase, their sum, the larger of the two ranks' waiting shares (10/50)
    assert lines[at + 3].split() == ["1MiB", "shm", "1.0", "10.0", "2.0", "20.0", "7.0", "10.0", "50.0", "20%"]
    assert len(lines) == at + 4
    # the chunk is what ran, not a series; no phases, no table
    assert "shm_chunk" not in text and "time by phase" not in render_points(pts[:1])
    assert "time by phase" in _html_of(pts, tmp_path) and "time by phase" not in _html_of(pts[:1], tmp_path)


def _html_of(pts, tmp_path) -> str:
    """The run report's page of ``pts``."""
    out = tmp_path / f"report-{len(pts)}"
    return write_run_report(RUN, pts, out).read_text(encoding="utf-8")


def test_bandwidths_orders_of_magnitude_apart_share_a_log_axis():
    """MPI and Gloo in one run: on a linear axis Gloo's line lay on zero."""
    from ddlcomm.report.plots import bandwidth_figure
    fast = [make_point("allreduce", "buffer", s) for s in SIZES]
    slow = [make_point("allreduce", "buffer", s, backend="gloo", library="Gloo",
                       busbw_GBps=p["busbw_GBps"] / 50, algbw_GBps=p["algbw_GBps"] / 50)
            for s, p in zip(SIZES, fast)]
    apart = bandwidth_figure(fast + slow, "allreduce").axes[0]
    assert apart.get_yscale() == "log" and "log scale" in apart.get_ylabel()
    near = bandwidth_figure(fast, "allreduce").axes[0]
    assert near.get_yscale() == "linear" and near.get_ylim()[0] == 0


def test_a_run_without_points_lists_what_it_asked_for():
    """Its backends and ranks showed '-' though its configuration names them."""
    out = render_runs([{"id": 3, "status": "interrupted", "config": {"backends": ["mpi", "gloo"], "ranks": 3},
                        "n_points": 0}])
    row = out.splitlines()[2].split()
    assert "mpi,gloo" in row and "3" in row[row.index("mpi,gloo"):]


def test_an_algorithms_pieces_are_ordered_by_size():
    """shm@1MiB sat between shm@128KiB and shm@256KiB (ordered as text)."""
    from ddlcomm.report.tables import points_table
    names = ["shm@1MiB", "shm", "shm@256KiB", "library", "shm@128KiB"]
    headers, rows = points_table([make_point("allreduce", "buffer", 1 << 20, algorithm=a) for a in names])
    assert [r[headers.index("algorithm")] for r in rows] == [
        "library", "shm", "shm@128KiB", "shm@256KiB", "shm@1MiB"]


def log_axis_labels(values) -> tuple[list[str], list[str]]:
    """The major and minor tick labels of a log axis (``plots.log_y``) over ``values``."""
    from ddlcomm.report import plots
    plt = plots._pyplot()
    fig, ax = plt.subplots()
    ax.plot(range(len(values)), values)
    plots.log_y(ax)
    fig.canvas.draw()
    labels = [[t.get_text() for t in ax.get_yticklabels(minor=minor) if t.get_text()]
              for minor in (False, True)]
    plt.close(fig)
    return labels[0], labels[1]


def test_a_log_axis_under_a_decade_is_labelled_in_plain_numbers():
    """matplotlib labelled the minor ticks of a narrow log range as 3×10^0."""
    for values, minor in (([2.1, 2.5, 3.4], True), ([2, 500, 30000], False)):
        labels = log_axis_labels(values)[1]
        assert ("3" in labels and not any("10^" in t for t in labels)) if minor else labels == []


def test_a_log_axis_labels_its_decades_in_plain_text():
    """The decades as 10⁵, not mathtext ($10^{5}$), whose parsing was over half of a report's
    samples under py-spy (the report of the default suite: 16% less time without it)."""
    from ddlcomm.report import plots
    assert [plots.decade_label(v) for v in (1e-3, 1.0, 10.0, 1e5, 2.5, 0.0)] == \
        ["10⁻³", "10⁰", "10¹", "10⁵", "2.5", ""]
    labels = log_axis_labels([0.01, 3, 20000])[0]
    assert "10⁻²" in labels and "10⁴" in labels and not any("$" in t for t in labels), labels
    major, minor = log_axis_labels([6, 12, 40])   # under a decade: the decade in it as plainly
    assert "10" in major and "20" in minor and all(t.isascii() for t in major + minor), (major, minor)


def test_a_fit_figure_draws_held_out_points_apart_from_fitted_ones():
    """A series held out in part (--holdout bytes=4MiB) was drawn all hollow, labelled
    'held out', its fitted points indistinguishable from the one held out."""
    from types import SimpleNamespace
    from ddlcomm.report import model
    key = {"library": "Open MPI", "backend": "mpi", "placement": "host", "form": "buffer",
           "algorithm": "library", "collective": "allreduce"}
    rs = [{**key, "ranks": 2, "bytes": b, "model_s": 1e-6 * (i + 1), "measured_s": 1.1e-6 * (i + 1),
           "rel_err": -0.09, "heldout": b >= 1 << 22} for i, b in enumerate([1 << 10, 1 << 14, 1 << 22])]
    fig = model.fit_figure(SimpleNamespace(residuals=rs), SimpleNamespace(key=key))
    marks = {line.get_label(): (list(line.get_xdata()), line.get_markerfacecolor())
             for line in fig.axes[0].get_lines() if "measured" in line.get_label()}
    assert marks["2 ranks measured"][0] == [1 << 10, 1 << 14] and marks["2 ranks measured"][1] != "none"
    assert marks["2 ranks measured (held out)"] == ([1 << 22], "none")
