"""Tests of run comparison."""
from __future__ import annotations

import pytest

from ddlcomm.results.compare import compare


def point(collective: str, nbytes: int, t_avg_us: float | None, **extra) -> dict:
    return dict(backend="mpi", library="Open MPI", collective=collective, form="buffer",
                algorithm="library", dtype="float32", op="sum", bytes=nbytes, ranks=4,
                in_place=False, t_avg_us=t_avg_us, busbw_GBps=1.0, check="passed", extra=extra)


def test_ratios_and_order():
    a = [point("allreduce", 1024, 10.0), point("allreduce", 4, 2.0), point("bcast", 4, 1.0)]
    b = [point("bcast", 4, 3.0), point("allreduce", 4, 1.0), point("allreduce", 1024, 20.0)]
    rows = compare(a, b)
    assert [(r["collective"], r["bytes"]) for r in rows] == [
        ("allreduce", 4), ("allreduce", 1024), ("bcast", 4)]
    assert [r["ratio"] for r in rows] == pytest.approx([0.5, 2.0, 3.0])
    r = rows[1]
    assert (r["t_avg_us_a"], r["t_avg_us_b"]) == (10.0, 20.0)
    assert (r["busbw_GBps_a"], r["check_a"], r["check_b"], r["phase"]) == (1.0, "passed", "passed", None)


def test_one_sided_rows_and_missing_times():
    a = [point("allreduce", 4, 2.0), point("allreduce", 8, 0.0), point("gather", 4, None)]
    b = [point("allreduce", 8, 1.0), point("gather", 4, 5.0), point("scatter", 4, 1.0)]
    rows = {(r["collective"], r["bytes"]): r for r in compare(a, b)}
    assert rows[("allreduce", 4)]["t_avg_us_b"] is None and rows[("allreduce", 4)]["ratio"] is None
    assert rows[("allreduce", 4)]["check_b"] is None
    assert rows[("allreduce", 8)]["ratio"] is None          # a is 0
    assert rows[("gather", 4)]["ratio"] is None             # a missing
    assert rows[("scatter", 4)]["t_avg_us_a"] is None and rows[("scatter", 4)]["t_avg_us_b"] == 1.0


def test_phase_and_key_fields_separate_points():
    a = [point("allreduce", 4, 1.0, phase="fwd"), point("allreduce", 4, 2.0, phase="bwd")]
    b = [point("allreduce", 4, 4.0, phase="bwd"), {**point("allreduce", 4, 9.0), "dtype": "int8"}]
    rows = compare(a, b)
    assert len(rows) == 3          # fwd (A only), bwd (both), int8 (B only)
    bwd = [r for r in rows if r["phase"] == "bwd"]
    assert len(bwd) == 1 and bwd[0]["ratio"] == 2.0
    assert compare([], []) == []


def test_median_ratio_beside_the_averages():
    """An average pulled up by a few slow iterations (7 us against a p50 of 2.5) read 0.17x."""
    a = [point("allreduce", 4, 7.0) | {"t_p50_us": 2.5, "t_p99_us": 3.1}]
    b = [point("allreduce", 4, 1.2) | {"t_p50_us": 1.5, "t_p99_us": 1.9}]
    (row,) = compare(a, b)
    assert row["ratio"] == pytest.approx(1.2 / 7) and row["ratio_p50"] == pytest.approx(0.6)


def test_runs_that_share_no_point_say_where_they_differ():
    from ddlcomm.results.compare import unmatched
    a = [point("allreduce", 4, 1.0)]
    assert unmatched(compare(a, [point("allreduce", 4, 1.0) | {"ranks": 3}])) == ["ranks"]
    assert unmatched(compare(a, a)) == []
    assert unmatched(compare(a, [])) == []


def test_a_ratio_far_below_one_is_not_printed_as_zero():
    from ddlcomm.report.tables import format_ratio
    assert [format_ratio(r) for r in (0.0012, 0.05, 1.234, None)] == ["0.0012x", "0.05x", "1.23x", "-"]


def test_each_side_says_its_senders_huge_pages():
    """A row carries the part of the arrays the data came from on huge pages, each side's
    (a broadcast's root, a gather's other ranks), or its memory kind's where that fixes it."""
    pages = {"memory": "numpy", "huge_share_ranks": [0.5, 1.0]}
    a = [point("broadcast", 4 << 20, 170.0, pages=pages), point("gather", 4 << 20, 350.0, pages=pages)]
    b = [dict(point("broadcast", 4 << 20, 79.0), memory="hugepage"), point("gather", 4 << 20, 140.0)]
    rows = {r["collective"]: r for r in compare(a, b)}
    assert (rows["broadcast"]["huge_a"], rows["broadcast"]["huge_b"]) == (0.5, 1.0)
    assert (rows["gather"]["huge_a"], rows["gather"]["huge_b"]) == (1.0, None)


def test_senders_huge_share():
    from ddlcomm.pages import senders_huge_share
    shares = {"pages": {"memory": "numpy", "huge_share_ranks": [0.5, 1.0, None, 0.0]}}
    assert senders_huge_share(dict(shares, collective="allreduce")) == 0.5        # every rank sends
    assert senders_huge_share(dict(shares, collective="broadcast")) == 0.5        # the root's
    assert senders_huge_share(dict(shares, collective="broadcast", root=1)) == 1.0
    assert senders_huge_share(dict(shares, collective="gather")) == 0.5           # the others'
    assert senders_huge_share(dict(shares, collective="broadcast", root=2)) is None
    assert senders_huge_share({"extra": {"pages": {"huge_share_ranks": [0.25]}}}) == 0.25
    assert senders_huge_share({"memory": "pageable"}) == 0.0
    assert senders_huge_share({"pages": {"memory": "numpy"}}) is None and senders_huge_share({}) is None


def test_points_of_several_data_paths_are_paired_by_path():
    """One run measured along host-staged and direct (choi2021's step): the key had no path,
    so the last point stored of each key won, and a ratio could set one path against another."""
    def along(path, us):
        p = point("broadcast", 4, us, phase="broadcast")
        p["extra"] = {**p.get("extra", {}), **({"path": path} if path else {})}
        return p
    a = [along("host-staged", 100.0), along("direct", 50.0), along(None, 10.0)]
    b = [along("direct", 500.0), along("host-staged", 110.0), along(None, 20.0)]
    rows = compare(a, b)
    ratios = {r["path"]: r["ratio"] for r in rows}
    assert ratios == {"host-staged": pytest.approx(1.1), "direct": pytest.approx(10.0), "host": pytest.approx(2.0)}
    from ddlcomm.report.tables import render_compare
    header = next(line for line in render_compare(rows, 1, 2).splitlines() if line.startswith("size"))
    assert "path" in header.split()


def test_training_configurations_of_one_run_are_rows_of_their_own():
    """A train run with --overlap both holds two configurations under one key: the last won,
    and the table showed half the points."""
    def run(scale):
        return [point("allreduce", 4, t * scale) | {"extra": {"workload": "train", "phase": "iteration",
                                                              "overlap": overlap}}
                for overlap, t in ((False, 2.0), (True, 1.0))]
    rows = compare(run(1.0), run(1.5))
    assert [(r["overlap"], r["ratio"]) for r in rows] == [(False, pytest.approx(1.5)),
                                                          (True, pytest.approx(1.5))]
    from ddlcomm.report import render_compare
    text = render_compare(rows, 1, 2)
    assert "overlap" in text and text.count("1.50") >= 2
