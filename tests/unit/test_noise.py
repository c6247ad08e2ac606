"""Noise made visible: scheduler quanta and wide spreads of points, the machine's
load around a run (pure parts, on sample /proc text), within-noise comparisons."""
from __future__ import annotations

import pytest

from ddlcomm.machine import load
from ddlcomm.measure import noise
from ddlcomm.report.tables import avg_busbw, format_avg_busbw, noise_notes, render_points
from ddlcomm.results.compare import compare, within_noise

STAT = """cpu  303118 0 141535 190328 2332 0 2397 1913 0 0
cpu0 135811 0 68895 113148 699 0 1153 959 0 0
cpu1 167306 5 72640 77179 1633 10 1244 953 0 0
cpu2 100 0 100 100 0 0 0
intr 3476414 0 0 0
ctxt 123
"""


def pt(nbytes: int, p50: float, p99: float, **over) -> dict:
    p = dict(backend="mpi", library="Open MPI", collective="allreduce", form="buffer",
             algorithm="library", dtype="float32", op="sum", bytes=nbytes, count=nbytes // 4,
             ranks=2, in_place=False, iterations=50, t_min_us=p50, t_avg_us=p50, t_max_us=p50,
             t_p50_us=p50, t_p99_us=p99, algbw_GBps=1.0, busbw_GBps=2.0, check="passed", extra={})
    p.update(over)
    return p


# ------------------------------------------------------------------ point flags

@pytest.mark.parametrize("p50, flagged", [
    (8000.0, True), (16000.0, True), (7900.0, True), (12100.0, True), (4000.0, True),
    (3950.0, True), (32000.0, True),    # within 3% of one quantum of 1..8 quanta
    (12300.0, False), (3000.0, False), (10000.0, False), (6000.0, False), (2.0, False),
    (None, False), (0.0, False),
    (36000.0, False), (124663.0, False),  # past 8 quanta every time is near some multiple
])
def test_on_quanta(p50, flagged):
    assert noise.on_quanta(p50) is flagged


def test_on_quanta_named_constants():
    assert noise.SCHED_QUANTUM_US == 4000.0
    assert noise.on_quanta(1000.0, quantum_us=1000.0) and not noise.on_quanta(1500.0, quantum_us=1000.0)
    assert noise.on_quanta(8400.0, tolerance=0.12) and not noise.on_quanta(8400.0)
    assert noise.MAX_QUANTA == 8


def test_wide_spread_and_flags():
    assert noise.wide_spread(10.0, 20.5) and not noise.wide_spread(10.0, 20.0)
    assert not noise.wide_spread(None, 5.0) and not noise.wide_spread(0.0, 5.0)
    assert noise.point_flags(pt(4, 8000.0, 30000.0)) == ["quanta", "spread"]
    assert noise.point_flags(pt(4, 5.0, 6.0)) == []
    assert noise.markers(["quanta", "spread"]) == "QS" and noise.markers([]) == ""


def test_table_marks_and_lists_flagged_points():
    points = [pt(4, 5.0, 6.0), pt(1024, 8000.0, 8100.0), pt(2048, 10.0, 50.0)]
    text = render_points(points)
    lines = text.splitlines()
    assert lines[1].split()[-2:] == ["noise", "check"]
    rows = {ln.split()[0]: ln.split() for ln in lines[3:6]}
    assert rows["4B"][-2] == "-" and rows["1KiB"][-2] == "Q" and rows["2KiB"][-2] == "S"
    notes = noise_notes(points)
    assert notes[0].startswith("Q (1 point: 1KiB): p50 sits on a multiple of the 4 ms")
    assert notes[1].startswith("S (1 point: 2KiB): p99 is more than 2x p50")
    assert "  noise Q (1 point: 1KiB)" in text


def test_noise_notes_list_series_and_cut_long_lists():
    many = [pt(4 << i, 8000.0, 8000.0, form=f) for i in range(10) for f in ("buffer", "object")]
    (note,) = noise_notes(many)
    assert note.startswith("Q (20 points: 4B buffer, 4B object, 8B buffer")
    assert "(12 more)" in note


def test_avg_busbw_per_series():
    points = [pt(4, 5, 5, busbw_GBps=1.0), pt(8, 5, 5, busbw_GBps=3.0),
              pt(4, 5, 5, form="object", busbw_GBps=0.5), pt(0, 5, 5, busbw_GBps=0.0)]
    assert avg_busbw(points) == [("buffer", 2.0, 2), ("object", 0.5, 1)]
    assert format_avg_busbw(points) == "avg bus bandwidth: buffer 2.00, object 0.5 GB/s"
    assert format_avg_busbw(points[:2]) == "avg bus bandwidth: 2.00 GB/s"
    assert format_avg_busbw([pt(0, 5, 5)]) == ""


def test_ps_async_columns():
    extra = {"workload": "ps-async", "phase": "step", "pushes_per_s": 1234.4,
             "staleness_mean": 0.5, "staleness_max": 1}
    text = render_points([pt(1 << 20, 100.0, 120.0, collective="ps-async", extra=extra)])
    header, _, row = text.splitlines()[1:4]
    assert header.split()[-4:] == ["pushes/s", "stale_mean", "stale_max", "check"]
    assert row.split()[-4:] == ["1234", "0.50", "1", "passed"]


# ------------------------------------------------------------------ compare

def test_within_noise():
    assert within_noise(pt(4, 10.0, 30.0), pt(4, 20.0, 25.0)) is True       # overlapping
    assert within_noise(pt(4, 10.0, 12.0), pt(4, 20.0, 25.0)) is False      # B clearly slower
    assert within_noise(pt(4, 20.0, 25.0), pt(4, 10.0, 12.0)) is False      # B clearly faster
    assert within_noise(pt(4, 10.0, 12.0), pt(4, 12.0, 13.0)) is True       # touching
    assert within_noise({}, pt(4, 1.0, 2.0)) is None
    assert within_noise(pt(4, 1.0, None), pt(4, 1.0, 2.0)) is None


def test_compare_rows_carry_noise_and_render_legend():
    from ddlcomm.report import render_compare
    a = [pt(4, 10.0, 30.0), pt(8, 10.0, 11.0)]
    b = [pt(4, 20.0, 25.0, t_avg_us=20.0), pt(8, 40.0, 41.0, t_avg_us=40.0)]
    rows = compare(a, b)
    assert [r["noise"] for r in rows] == [True, False]
    text = render_compare(rows, 1, 2)
    lines = text.splitlines()
    assert lines[6].split()[3] == "~2.00x" and lines[7].split()[3] == "4.00x"
    assert lines[-1].startswith("~ : within noise")
    assert "within noise" not in render_compare(compare(a[1:], b[1:]), 1, 2)


# ------------------------------------------------------------------ load

def test_parse_loadavg():
    assert load.parse_loadavg("1.97 3.03 3.44 5/115 13641\n") == [1.97, 3.03, 3.44]
    with pytest.raises(ValueError):
        load.parse_loadavg("1.0")


def test_parse_cpu_stat_and_ticks():
    per_cpu = load.parse_cpu_stat(STAT)
    assert sorted(per_cpu) == [0, 1, 2]                     # the aggregate line is left out
    assert per_cpu[1]["nice"] == 5 and per_cpu[1]["steal"] == 953 and per_cpu[2].get("steal") is None
    ticks = load.cpu_ticks(per_cpu, [1])
    assert ticks == {"busy": 167306 + 5 + 72640 + 10 + 1244, "steal": 953}
    both = load.cpu_ticks(per_cpu, [0, 2, 7])               # cpu7 absent: counts 0
    assert both == {"busy": 135811 + 68895 + 1153 + 200, "steal": 959}


def snap(wall, busy, steal, own, loadavg=(0.5, 0.4, 0.3), cpus=(0, 1)):
    return {"wall": wall, "cpus": list(cpus), "ticks": {"busy": busy, "steal": steal},
            "loadavg": list(loadavg), "own_cpu_s": own, "tick_s": 0.01}


def test_summarize_and_warnings_of_a_quiet_run():
    # 10 s on 2 cores: busy 19 s of which the run's own 18.5 s; others 0.5 s = 0.05 cores
    rec = load.summarize(snap(100.0, 1000, 0, 1.0), snap(110.0, 2900, 5, 19.5, (2.0, 1, 1)), 2)
    assert rec["wall_s"] == 10.0 and rec["busy_s"] == 19.0 and rec["own_cpu_s"] == 18.5
    assert rec["others_cpu_s"] == 0.5 and rec["others_cores"] == 0.05 and rec["steal_s"] == 0.05
    assert rec["loadavg_before"] == [0.5, 0.4, 0.3] and rec["loadavg_after"] == [2.0, 1, 1]
    assert load.warnings(rec) == [] and load.warnings({}) == []
    line = load.describe(rec)
    assert line.startswith("load average 0.50 -> 2.00; others 0.05 cores (0.5 s); steal 0.1 s")
    assert line.endswith("2 ranks on 2 CPUs over 10.0 s") and load.describe({}) == "-"


def test_warnings_of_a_busy_oversubscribed_stolen_run():
    rec = load.summarize(snap(0.0, 0, 0, 0.0, (185.9, 200, 90)), snap(10.0, 2000, 100, 12.0), 3)
    assert rec["others_cpu_s"] == 8.0 and rec["others_cores"] == 0.8 and rec["steal_s"] == 1.0
    warned = load.warnings(rec)
    assert warned[0] == ("oversubscribed: 3 ranks on 2 usable CPUs, so ranks wait for each "
                         "other's time slices")
    assert warned[1] == "loaded before the run: 1-minute load average 185.90 on 2 usable CPUs"
    assert warned[2].startswith("busy machine: other processes kept 0.80 of the run's 2 CPUs")
    assert warned[3].startswith("stolen CPU time: the hypervisor gave 1.0 s") and "(5.0%)" in warned[3]
    assert load.warnings(dict(rec, loadavg_before=[2.0, 0, 0], ranks=2, others_cores=0.2,
                              steal_s=0.1)) == []                # at the limits: quiet


def test_summarize_without_own_cpu_or_proc():
    rec = load.summarize(snap(0.0, 0, 0, 0.0), snap(10.0, 2000, 0, 0.1), None, own=False)
    assert rec["busy_s"] == 20.0 and rec["own_cpu_s"] is None and rec["others_cores"] is None
    assert load.warnings(rec) == []
    assert "busy 20.0 s (the ranks' own share unknown)" in load.describe(rec)
    assert "? ranks on 2 CPUs" in load.describe(rec)
    blind = dict(snap(0.0, 0, 0, 0.0), ticks=None, loadavg=None)
    rec = load.summarize(blind, blind, 2)
    assert rec["busy_s"] is None and rec["loadavg_before"] is None
    assert load.describe(rec).startswith("load average ? -> ?")


def test_snapshot_reads_this_machine():
    now = load.snapshot()
    assert now["cpus"] and now["tick_s"] > 0 and now["own_cpu_s"] > 0
    if load.PROC_STAT.exists():
        assert now["ticks"]["busy"] > 0 and len(now["loadavg"]) == 3
    assert load.snapshot([0])["cpus"] == [0]
