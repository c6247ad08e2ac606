"""The copy-bandwidth probe (``ddlcomm info --memory-bandwidth``): its pure pieces, and a
small real run with worker processes (no MPI)."""
import json

import pytest

from ddlcomm.cli import main
from ddlcomm.machine import membw


def test_copier_counts_follow_powers_of_two_and_their_halves_up_to_the_cpus():
    assert membw.copier_counts(1) == [1]
    assert membw.copier_counts(2) == [1, 2]
    assert membw.copier_counts(16) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert membw.copier_counts(10) == [1, 2, 3, 4, 6, 8, 10]


def test_buffers_outgrow_the_cache_within_a_share_of_the_memory():
    assert membw.buffer_bytes(2, 32 << 20, 24 << 30) == 64 << 20
    assert membw.buffer_bytes(16, 105 << 20, 128 << 30) == 210 << 20
    # 16 workers x 2 buffers within a quarter of 1 GiB
    assert membw.buffer_bytes(16, 32 << 20, 1 << 30) == (1 << 30) // 4 // 32 // 4096 * 4096
    assert membw.buffer_bytes(1, None, None) == membw.MIN_BYTES


def test_aggregate_counts_every_copy_over_the_whole_span():
    # two workers of 2 copies of 100 bytes, from 1.0 to 3.0 s: 400 bytes in 2 s
    assert membw.aggregate([(1.0, 2.5), (1.5, 3.0)], 100, 2) == pytest.approx(200.0)


def test_a_real_run_with_workers_bound_to_cpus():
    bw = membw.copy_bandwidth(counts=[1, 2], nbytes=1 << 20, reps=2, rounds=1, cpus=[0, 0])
    assert set(bw["by_copiers"]) == {"1", "2"} and all(v > 0 for v in bw["by_copiers"].values())
    assert bw["bytes_per_copier"] == 1 << 20 and bw["cpus"] == [0, 0]


def test_copier_counts_beyond_the_cpus_are_refused():
    with pytest.raises(ValueError, match="copier counts must lie in 1..1"):
        membw.copy_bandwidth(counts=[1, 2], cpus=[0])


def test_info_measures_it_when_asked(capsys, monkeypatch):
    monkeypatch.setattr(membw, "MIN_BYTES", 1 << 20)
    monkeypatch.setattr(membw, "last_level_cache", lambda: None)     # else twice the L3: 520 MiB here
    assert main(["info", "--json", "--memory-bandwidth"]) == 0
    found = json.loads(capsys.readouterr().out)["memory"]["copy_bandwidth"]
    assert found["by_copiers"]["1"] > 0 and found["bytes_per_copier"] >= 1 << 20
