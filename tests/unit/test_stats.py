"""Tests of the per-point statistics (ddlcomm.measure.stats)."""
from __future__ import annotations

import numpy as np
import pytest

from ddlcomm.measure.stats import bandwidth, choose_iterations, choose_warmup, summarize


def test_summarize_hand_computed():
    times_s = np.array([[1.0, 2.0, 3.0, 4.0],     # rank 0: mean 2.5 µs
                        [3.0, 1.0, 5.0, 7.0]]) * 1e-6   # rank 1: mean 4.0 µs
    s = summarize(times_s)
    # per-iteration slowest rank: [3, 2, 5, 7] -> sorted [2, 3, 5, 7]
    want = {"t_min_us": 2.5, "t_avg_us": 3.25, "t_max_us": 4.0,
            "t_p50_us": 4.0,                       # (3 + 5) / 2
            "t_p99_us": 5.0 + 0.97 * 2.0}          # linear, at position 0.99 * 3 = 2.97
    assert s == pytest.approx(want)
    assert all(type(v) is float for v in s.values())


def test_summarize_one_rank_and_one_value():
    assert summarize([1e-6, 3e-6])["t_avg_us"] == pytest.approx(2.0)   # 1-D: one rank
    s = summarize([[5e-6]])
    assert list(s.values()) == pytest.approx([5.0] * 5)


def test_summarize_refuses_empty():
    with pytest.raises(ValueError):
        summarize(np.empty((2, 0)))


@pytest.mark.parametrize("nbytes, t_us, factor, algbw, busbw", [
    (10**9, 1e6, 1.0, 1.0, 1.0),          # 1e9 B in 1 s is 1 GB/s (not GiB/s)
    (10**6, 1.0, 1.5, 1000.0, 1500.0),
    (1 << 30, 1e6, 0.5, 1.073741824, 0.536870912),
    (0, 1.0, 1.0, 0.0, 0.0),
    (1024, 0.0, 1.0, 0.0, 0.0),
    (1024, -1.0, 1.0, 0.0, 0.0),
])
def test_bandwidth(nbytes, t_us, factor, algbw, busbw):
    assert bandwidth(nbytes, t_us, factor) == pytest.approx((algbw, busbw))


@pytest.mark.parametrize("t_call_s, want", [
    (0.0, 2000), (-1.0, 2000), (float("nan"), 2000), (1e-9, 2000), (1e-4, 2000), (1e-3, 200), (0.02, 10),
    (0.1, 5), (10.0, 5),
])
def test_choose_iterations(t_call_s, want):
    assert choose_iterations(t_call_s, 0.2) == want


def test_choose_iterations_bounds_and_monotonic():
    times = np.logspace(-9, 2, 200)
    its = [choose_iterations(t, 0.2, lo=3, hi=500) for t in times]
    assert all(3 <= n <= 500 for n in its)
    assert all(a >= b for a, b in zip(its, its[1:]))       # slower calls, fewer iterations
    assert its[0] == 500 and its[-1] == 3


@pytest.mark.parametrize("iterations, warmup", [
    (0, 2), (5, 2), (20, 2), (30, 3), (100, 10), (2000, 200), (10**6, 200),
])
def test_choose_warmup(iterations, warmup):
    assert choose_warmup(iterations) == warmup


class _OneRank:
    def allreduce(self, send, recv, op):
        recv[...] = send


def _timed(first: float, each: float, made: list):
    def timed(n, warm):
        t = np.full(n, each)
        if not made:
            t[0] = first                     # the very first call was descheduled
        made.append((n, warm))
        return t
    return timed


def test_one_slow_probe_call_does_not_decide_the_iterations():
    """Of 2 probe calls, one descheduled 4 ms call made a 2 µs point run 100 iterations
    (5 to 25 were seen on a busy machine); the probe goes on while it is short."""
    from ddlcomm.measure import timing
    made: list = []
    _, iterations, warmup = timing.calibrate(_OneRank(), _timed(4e-3, 2e-6, made), 0.2)
    assert made == [(2, 0), (4, 0), (8, 0), (16, 0), (32, 0), (2000, 200 - 62)]
    assert (iterations, warmup) == (2000, 200)
    made = []                                # a call of 50 ms: 2 probe calls are a tenth already
    _, iterations, warmup = timing.calibrate(_OneRank(), _timed(0.05, 0.05, made), 0.2)
    assert made == [(2, 0), (5, 0)] and (iterations, warmup) == (5, 2)
    made = []                                # a stall of a tenth of the budget among the first 2
    _, iterations, warmup = timing.calibrate(_OneRank(), _timed(0.02, 2e-6, made), 0.2)
    assert made[:2] == [(2, 0), (4, 0)] and iterations == 2000   # it stopped at 2: 10 iterations
    made = []                                # iterations given: the probe is 2 warm-up calls
    _, iterations, warmup = timing.calibrate(_OneRank(), _timed(0.05, 2e-6, made), 0.2, 7, 0)
    assert made == [(2, 0), (7, 0)] and (iterations, warmup) == (7, 2)


def test_a_record_of_no_transfer_has_no_bandwidth():
    """A training phase is a time, not a transfer: stored without a bandwidth (not 0 GB/s)."""
    from types import SimpleNamespace
    from ddlcomm.measure.records import make_record
    comm = SimpleNamespace(name="mpi", library="Open MPI", library_version="5", size=2)
    common = dict(collective="train", form="buffer", dtype="float32", op="avg", nbytes=64, count=16,
                  root=0, in_place=True, iterations=2, warmup=0, times=np.full((2, 2), 1e-3),
                  busbw_factor=1.0, check="passed")
    rec = make_record(comm, algbw_bytes=None, **common)
    assert rec["algbw_GBps"] is None and rec["busbw_GBps"] is None
    assert make_record(comm, algbw_bytes=64, **common)["algbw_GBps"] == pytest.approx(64e-6)


def test_a_copy_phase_is_as_fast_as_its_slowest_copier():
    """A broadcast's d2h copies on the root alone: the others record about 0 s, and over the
    ranks' mean time 64 MiB in 10 ms read 26.8 GB/s on 4 ranks, 4x the copy's 6.7 GB/s."""
    from types import SimpleNamespace
    from ddlcomm.measure.records import make_record
    from ddlcomm.workloads.base import phase_bytes
    comm = SimpleNamespace(name="mpi", library="Open MPI", library_version="5", size=4)
    times = np.full((4, 3), 1e-6)
    times[0] = 10e-3
    nbytes, factor, extra = phase_bytes("broadcast.d2h", None, 64 << 20, 4, {"broadcast.d2h": 64 << 20}, {})
    rec = make_record(comm, collective="broadcast", form="buffer", dtype="float32", op=None,
                      nbytes=64 << 20, count=16 << 20, root=0, in_place=False, iterations=3, warmup=0,
                      times=times, algbw_bytes=nbytes, busbw_factor=factor, check="passed", extra=extra)
    assert rec["algbw_GBps"] == pytest.approx((64 << 20) / 10e-3 / 1e9)
    assert extra["bandwidth_time"] == "t_max_us"
    assert "bandwidth_time" not in phase_bytes("broadcast", None, 64, 4, {}, {})[2]
