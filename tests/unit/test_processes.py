"""Signals an owner passes on to its launcher or ranks (ddlcomm.launch.processes)."""
from __future__ import annotations

import os
import signal
import time

from ddlcomm.launch.processes import adopt_orphans, end_orphans, forwarded, reap_ended


def test_the_owner_passes_on_its_own_signal():
    assert forwarded(KeyboardInterrupt()) == signal.SIGINT
    assert forwarded(SystemExit(128 + signal.SIGTERM)) == signal.SIGTERM
    assert forwarded(SystemExit(128 + signal.SIGHUP)) == signal.SIGHUP
    assert forwarded(SystemExit(0)) == signal.SIGINT and forwarded(SystemExit("x")) == signal.SIGINT


def test_children_that_ended_are_reaped_and_their_cpu_time_counted():
    """An orphan a launcher left (Open MPI's ssh stand-ins in --containers) is this process's
    child once it ends; reaped, its CPU time joins os.times()'s children (the run's own)."""
    pid = os.fork()
    if pid == 0:                                        # burn 0.3 s of CPU, then end
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        os._exit(0)
    while not open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
        time.sleep(0.01)
    before = os.times()
    assert reap_ended() >= 1 and reap_ended() == 0     # (>=: any other test's, too)
    assert not os.path.exists(f"/proc/{pid}")            # reaped: gone from the table
    after = os.times()
    assert (after.children_user + after.children_system
            - before.children_user - before.children_system) >= 0.25


def test_the_callers_own_children_are_neither_ended_nor_reaped():
    """end_orphans and reap_ended took every child: a caller's unrelated process was killed,
    and one that had exited 7 was reaped, so its Popen's wait() said 0."""
    import subprocess
    mine = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["sh", "-c", "exit 7"])
    while open(f"/proc/{done.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    had = adopt_orphans()
    try:
        assert {mine.pid, done.pid} <= had
        assert end_orphans(grace_s=1, keep=had) == 0 and reap_ended(had) == 0
        assert mine.poll() is None and done.wait() == 7
    finally:
        adopt_orphans(False)
        mine.kill()
        mine.wait()


def test_terminate_gives_up_on_a_process_past_sigkill():
    """A process that SIGKILL does not end (uninterruptible sleep) is returned, not waited
    for: spawn's ending of its ranks waited on it for ever before it used terminate."""
    from ddlcomm.launch.processes import terminate
    sent = []
    begun = time.monotonic()
    left = terminate([4242, 4243], lambda pid: pid == 4243, 0.2,
                     first=signal.SIGINT, kill=lambda pid, sig: sent.append((pid, sig)))
    assert left == [4242] and time.monotonic() - begun < 1.0
    assert sent == [(4242, signal.SIGINT), (4243, signal.SIGINT), (4242, signal.SIGKILL)]
