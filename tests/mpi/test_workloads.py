"""Workloads end to end: real ranks, stored phases, verified steps."""
from __future__ import annotations

import json

import pytest

from conftest import run

pytestmark = pytest.mark.mpi


def bench(mpi, db, *args, timeout=240):
    res = run([mpi.ddlcomm, "bench", "--db", db, "--no-report", *args], mpi.env(), timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    out = run([mpi.ddlcomm, "results", "export", "--all", "--db", db], mpi.env(), 60)
    return res, json.loads(out.stdout)


def test_ps_sync_phases(mpi, tmp_path):
    _, points = bench(mpi, tmp_path / "w.db", "--workload", "ps-sync", "--ranks", "3",
                      "--sizes", "1KiB,64KiB", "--steps", "5")
    assert {(p["bytes"], p["phase"]) for p in points} == {
        (b, ph) for b in (1024, 65536) for ph in ("broadcast", "gather", "apply", "step")}
    assert {p["check"] for p in points} == {"passed"}
    assert {p["collective"] for p in points} == {"ps-sync"}
    for step in (p for p in points if p["phase"] == "step"):
        assert_step_counts_its_size(step)
    # apply is the server's computation: a time, no bandwidth; the others move bytes
    assert {(p["phase"], p["busbw_GBps"] is None, p["algbw_GBps"] is None) for p in points} == {
        ("broadcast", False, False), ("gather", False, False), ("apply", True, True),
        ("step", False, False)}


def test_ps_async_applies_every_push_once(mpi, tmp_path):
    res, points = bench(mpi, tmp_path / "w.db", "--workload", "ps-async", "--ranks", "4",
                        "--steps", "200", "--sizes", "4KiB")
    assert {p["phase"] for p in points} == {"step", "apply"}
    assert {p["phase"] for p in points if p["busbw_GBps"] is None} == {"apply"}
    for p in points:
        # passed: the server's final parameters are minus the sum of every push
        assert p["check"] == "passed"
        assert p["workers"] == 3 and p["steps_per_worker"] == 200
        assert p["pushes_per_s"] > 0
        # how many updates a push was behind: never more than all the others' pushes
        assert 0 <= p["staleness_mean"] <= p["staleness_max"] < 200 * 3 and \
            isinstance(p["staleness_max"], int)
    step = next(p for p in points if p["phase"] == "step")
    assert step["iterations"] == 200
    assert_step_counts_its_size(step)


def assert_step_counts_its_size(step):
    """A step's bandwidth is the step's size over its time, in every workload (ps-async
    counted its push and pull, 2x what ps-sync and allreduce count for the same bytes)."""
    bandwidth_time = step.get("bandwidth_time", "t_avg_us")
    assert step["algbw_GBps"] == pytest.approx(step["bytes"] / step[bandwidth_time] / 1e3, rel=1e-3)


def test_allreduce_model_fused(mpi, tmp_path):
    _, points = bench(mpi, tmp_path / "w.db", "--workload", "allreduce", "--ranks", "2",
                      "--model", "resnet50", "--fusion", "25MiB", "--steps", "2")
    assert {p["phase"] for p in points} == {"allreduce", "apply", "step"}
    assert {p["messages"] for p in points} == {5}           # ResNet-50 in 25 MiB buckets
    assert {p["bytes"] for p in points} == {25_557_032 * 4}
    assert {p["check"] for p in points} == {"passed"}


def test_workloads_and_backends_side_by_side(mpi, tmp_path):
    _, points = bench(mpi, tmp_path / "w.db", "--workload", "ps-sync,allreduce",
                      "--backend", "mpi,gloo", "--ranks", "3", "--sizes", "64KiB", "--steps", "3")
    step = {(p["collective"], p["backend"]) for p in points if p["phase"] == "step"}
    assert step == {(w, b) for w in ("ps-sync", "allreduce") for b in ("mpi", "gloo")}
    assert {p["library"] for p in points} == {"Gloo", "Open MPI" if mpi.name == "openmpi" else "MPICH"}
    assert {p["check"] for p in points} == {"passed"}
