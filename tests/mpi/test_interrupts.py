"""Runs end honestly: SIGINT or SIGTERM under the user's own launcher or to ddlcomm's
owner leaves the run ``interrupted`` with where it stopped, its finished points kept."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

import pytest

pytestmark = pytest.mark.mpi
#: A sweep long enough to be stopped in the middle.
LONG = ["bench", "--sizes", "4B:64MiB", "--no-report", "--budget", "0.05"]


def _points(db) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    except sqlite3.Error:
        return 0


def _stop_after_points(cmd, env, db, sig, points=3, limit=120.0) -> int:
    """Start ``cmd``, send ``sig`` once ``points`` are stored, return its exit code."""
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + limit
        while _points(db) < points:
            assert proc.poll() is None, "the sweep ended before it could be stopped"
            assert time.monotonic() < deadline, "no points stored in time"
            time.sleep(0.2)
        os.kill(proc.pid, sig)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run_row(db) -> tuple:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT status, error FROM runs").fetchone()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_under_the_users_launcher(mpi, tmp_path, sig):
    db = tmp_path / "i.db"
    cmd = mpi.launcher.command(2, [mpi.python, "-m", "ddlcomm", *LONG, "--db", db])
    env = mpi.launcher.environment(mpi.env(), mpi.launcher.oversubscribed(2))
    _stop_after_points(cmd, env, db, sig)
    status, error = _run_row(db)
    assert status == "interrupted", error
    assert error.startswith("interrupted (SIG") and (" during " in error or " after " in error)
    assert _points(db) >= 3                      # the finished points stay


def test_sigterm_to_ddlcomms_own_launch(mpi, tmp_path):
    db = tmp_path / "o.db"
    rc = _stop_after_points([mpi.ddlcomm, *LONG, "--db", db], mpi.env(), db, signal.SIGTERM)
    assert rc == 130
    status, error = _run_row(db)
    assert status == "interrupted" and (" during " in error or " after " in error), error
