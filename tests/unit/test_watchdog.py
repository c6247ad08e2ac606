"""Tests of the per-rank watchdog (ddlcomm.bench.watchdog), with short limits."""
from __future__ import annotations

import threading
import time

import pytest

from ddlcomm.bench.watchdog import Watchdog

LIMIT_S = 0.2
SLACK_S = 0.5


class Recorder:
    """An on_expire callback that records its call instead of ending the process."""

    def __init__(self) -> None:
        self.fired = threading.Event()
        self.calls: list[tuple[str, float, float]] = []

    def __call__(self, what: str, limit: float) -> None:
        self.calls.append((what, limit, time.monotonic()))
        self.fired.set()


@pytest.fixture
def rec():
    return Recorder()


def test_guard_that_finishes_in_time_does_not_fire(rec):
    wd = Watchdog(LIMIT_S, rec)
    with wd.guard("allreduce 4B"):
        time.sleep(LIMIT_S / 4)
    assert not rec.fired.wait(LIMIT_S + SLACK_S)
    assert rec.calls == []


def test_many_short_guards_rearm_the_deadline(rec):
    wd = Watchdog(LIMIT_S, rec)
    start = time.monotonic()
    while time.monotonic() - start < 3 * LIMIT_S:      # together far longer than the limit
        with wd.guard("barrier"):
            time.sleep(LIMIT_S / 10)
    assert not rec.fired.wait(LIMIT_S + SLACK_S)


@pytest.mark.parametrize("default_s, guard_s", [(LIMIT_S, None), (60.0, LIMIT_S)])
def test_overrunning_guard_fires_once_with_step_and_limit(rec, default_s, guard_s):
    wd = Watchdog(default_s, rec)
    start = time.monotonic()
    with wd.guard("gather 64MiB", guard_s):
        assert rec.fired.wait(LIMIT_S + SLACK_S), "watchdog did not fire"
    assert len(rec.calls) == 1
    what, limit, when = rec.calls[0]
    assert (what, limit) == ("gather 64MiB", LIMIT_S)
    assert LIMIT_S <= when - start <= LIMIT_S + SLACK_S


def test_current_names_the_running_step(rec):
    wd = Watchdog(60.0, rec)
    assert wd.current is None
    with wd.guard("broadcast 1KiB"):
        assert wd.current == "broadcast 1KiB"
    assert wd.current is None
    with wd.guard("reduce 8B"):
        assert wd.current == "reduce 8B"
    assert wd.current is None


def test_current_still_names_a_step_that_raised(rec):
    # session.rank_main reads watchdog.current after the exception to say where it failed.
    wd = Watchdog(LIMIT_S, rec)
    with pytest.raises(RuntimeError):
        with wd.guard("alltoall 4KiB"):
            raise RuntimeError("boom")
    assert wd.current == "alltoall 4KiB"
    assert not rec.fired.wait(LIMIT_S + SLACK_S)      # but the deadline was disarmed
