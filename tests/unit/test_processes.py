"""Signals an owner passes on to its launcher or ranks (ddlcomm.launch.processes)."""
from __future__ import annotations

import os
import signal
import time

from ddlcomm.launch.processes import forwarded, reap_ended


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
