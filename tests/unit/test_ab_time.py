"""scripts/ab-time: two commands timed in turn, the ratio pair by pair (docs/benchmarks.md's A/B)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ab-time"


def ab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_pairs_are_timed_in_turn_and_the_ratio_follows_the_wall_time():
    res = ab("-n", "2", "--warmup", "0", "sleep 0.3", "sleep 0.1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["pair 1", "pair 2"]
    ratio = float(lines[2].split("A/B ")[1].split()[0])
    assert 1.5 < ratio < 4.5, lines[2]
    assert lines[3].startswith("median CPU:")


def test_a_failing_command_is_said_and_sets_the_exit_status():
    res = ab("-n", "1", "--warmup", "0", "exit 3", "true")
    assert res.returncode == 1 and "(exit 3)" in res.stdout


def test_bad_counts_are_refused():
    res = ab("-n", "0", "true", "true")
    assert res.returncode == 2 and "-n must be 1 or more" in res.stderr
