"""Signals an owner passes on to its launcher or ranks (ddlcomm.launch.processes)."""
from __future__ import annotations

import signal

from ddlcomm.launch.processes import forwarded


def test_the_owner_passes_on_its_own_signal():
    assert forwarded(KeyboardInterrupt()) == signal.SIGINT
    assert forwarded(SystemExit(128 + signal.SIGTERM)) == signal.SIGTERM
    assert forwarded(SystemExit(128 + signal.SIGHUP)) == signal.SIGHUP
    assert forwarded(SystemExit(0)) == signal.SIGINT and forwarded(SystemExit("x")) == signal.SIGINT
