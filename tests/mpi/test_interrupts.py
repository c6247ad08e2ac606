"""Runs end honestly: SIGINT or SIGTERM under the user's own launcher or to ddlcomm's
owner leaves the run ``interrupted`` with where it stopped, its finished points kept;
an owner killed outright takes its launcher and ranks with it."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

import pytest

from ddlcomm.launch import shmclean
from ddlcomm.launch.mpirun import not_started
from conftest import alive, descendants
from ddlcomm.launch.processes import proc_stat

pytestmark = pytest.mark.mpi
#: A sweep long enough to be stopped in the middle.
LONG = ["bench", "--sizes", "4B:64MiB", "--no-report", "--budget", "0.05"]


def _points(db) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    except sqlite3.Error:
        return 0


def _sigint_as_in_a_terminal() -> None:
    """SIGINT at its default, as a terminal's foreground job has it: a test session run in
    the background (``make test &``) hands its children SIGINT ignored, which ddlcomm
    keeps ignoring, as a user's background job wants."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(cmd, env, stderr) -> subprocess.Popen:
    return subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.DEVNULL,
                            stderr=stderr, start_new_session=True,
                            preexec_fn=_sigint_as_in_a_terminal)


def _stop_after_points(cmd, env, db, sig, points=3, limit=120.0, before=None, group=False) -> int:
    """Start ``cmd``, send ``sig`` once ``points`` are stored (calling ``before(proc)`` just
    before; ``group``: to its whole process group, as a terminal's Ctrl-C), return its exit
    code.  A launcher that failed before any rank ran
    (``mpirun.not_started``: Open MPI's transient, once in two thousand launches here) is
    started once more, as ddlcomm's own launches and the tests' ``mpirun`` are."""
    errors = db.with_name(db.name + ".stderr")
    with open(errors, "w+") as stderr:
        proc = _start(cmd, env, stderr)
    retried = False
    try:
        deadline = time.monotonic() + limit
        while _points(db) < points:
            if not retried and proc.poll() is not None and \
                    not_started(proc.returncode, errors.read_text()):
                retried = True
                with open(errors, "w+") as stderr:
                    proc = _start(cmd, env, stderr)
            assert proc.poll() is None, "the sweep ended before it could be stopped:\n" + \
                errors.read_text()[-2000:]
            assert time.monotonic() < deadline, "no points stored in time"
            time.sleep(0.2)
        if before:
            before(proc)
        (os.killpg if group else os.kill)(proc.pid, sig)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run_row(db) -> tuple:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT status, error FROM runs").fetchone()


@pytest.mark.alone
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_under_the_users_launcher(mpi, tmp_path, sig):
    db = tmp_path / "i.db"
    cmd, env = mpi.command(2, [mpi.python, "-m", "ddlcomm", *LONG, "--db", db])
    segments = shmclean.names()
    _stop_after_points(cmd, env, db, sig)
    status, error = _run_row(db)
    assert status == "interrupted", error
    # what the ranks got from the launcher: Open MPI's passes a SIGINT on as SIGTERM
    got = "SIGTERM" if mpi.name == "openmpi" else sig.name
    assert error.startswith(f"interrupted ({got}") and (" during " in error or " after " in error), error
    assert _points(db) >= 3                      # the finished points stay
    # no owner cleans up after your own launcher: the ranks remove what they mapped (MPICH
    # left its 2 MiB mpich_shm_* segment each time)
    assert not [n for n in shmclean.names() - segments if n.startswith(("mpich_shm", "sm_segment"))]


@pytest.mark.alone
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_sigterm_or_sighup_to_ddlcomms_own_launch(mpi, tmp_path, sig):
    """SIGHUP (the terminal or ssh session closed) left an MPICH run 'running' for ever; the
    ranks of a SIGTERM were told SIGINT; Open MPI's of a Ctrl-C, SIGTERM (prterun's)."""
    db, segments = tmp_path / "o.db", shmclean.names()
    rc = _stop_after_points([mpi.ddlcomm, *LONG, "--db", db], mpi.env(), db, sig)
    assert rc == 130
    status, error = _run_row(db)
    assert status == "interrupted" and (" during " in error or " after " in error), error
    assert error.startswith(f"interrupted ({sig.name})"), error
    # MPICH's ranks, ended before MPI_Finalize, left a 2 MiB mpich_shm_* segment each run
    assert not [n for n in shmclean.names() - segments if n.startswith(("mpich_shm", "sm_segment"))]


@pytest.mark.alone
def test_ctrl_c_in_a_terminal_to_ddlcomms_own_launch(mpi, tmp_path):
    """A terminal's Ctrl-C goes to the whole foreground group: Open MPI's launcher shared the
    owner's, got it from the terminal and again from the owner, and took the second as
    'forcibly terminate': the ranks died before they could mark where the run stopped."""
    db = tmp_path / "g.db"
    rc = _stop_after_points([mpi.ddlcomm, *LONG, "--db", db], mpi.env(), db, signal.SIGINT, group=True)
    assert rc == 130
    status, error = _run_row(db)
    assert status == "interrupted" and error.startswith("interrupted (SIGINT)"), error
    assert " during " in error or " after " in error, error
    said = db.with_name(db.name + ".stderr").read_text()
    assert "forcibly terminate" not in said, said[-2000:]     # Open MPI's on a second Ctrl-C


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_sigkill_to_ddlcomms_own_launch(mpi, tmp_path, backend):
    """kill -9 of the owner: the launcher (or each spawned rank) gets SIGTERM from the kernel
    (PR_SET_PDEATHSIG), so nothing is left running and the ranks mark the run interrupted.
    Before, the ranks ran the rest of the plan under a run already listed as stale."""
    if backend == "gloo" and mpi.name != "openmpi":
        pytest.skip("Gloo does not use the MPI beside it: run in one venv")
    db, below = tmp_path / "k.db", set()
    rc = _stop_after_points([mpi.ddlcomm, *LONG, "--backend", backend, "--db", db], mpi.env(), db,
                            signal.SIGKILL, before=lambda proc: below.update(descendants(proc.pid)))
    assert rc == -signal.SIGKILL and below, "the owner had started no launcher or ranks"
    deadline = time.monotonic() + 30
    while alive(below) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(below), f"left running after the owner was killed: {sorted(alive(below))}"
    status, error = _run_row(db)
    assert status == "interrupted" and error.startswith("interrupted (SIGTERM)"), error


def test_sigkill_to_the_launcher_ends_its_orphaned_ranks(mpi, tmp_path):
    """kill -9 of mpirun: the owner settled the run at once while the orphaned ranks went on
    measuring into it.  The owner adopts them (PR_SET_CHILD_SUBREAPER) and ends them first."""
    db, below = tmp_path / "l.db", set()

    def kill_launcher(proc):
        below.update(descendants(proc.pid))
        launcher = [pid for pid in below if _parent(pid) == proc.pid]
        assert launcher, "no launcher under the owner"
        for pid in launcher:
            os.kill(pid, signal.SIGKILL)

    rc = _stop_after_points([mpi.ddlcomm, *LONG, "--db", db], mpi.env(), db, signal.SIGCONT,
                            before=kill_launcher)
    assert rc == 3
    assert not alive(below), f"left running: {sorted(alive(below))}"
    stored = _points(db)
    time.sleep(1.0)
    assert _points(db) == stored                     # nothing writes into the ended run
    status, error = _run_row(db)
    assert status == "failed" and error.startswith("the launcher was killed by SIGKILL"), error


def _parent(pid: "int | str") -> int:
    """``pid``'s parent, -1 where it is gone."""
    fields = proc_stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else -1


@pytest.mark.parametrize("launch", ["own", "yours"])
def test_a_database_removed_during_the_run_is_saved_not_replaced(mpi, tmp_path, launch):
    """rm -rf of the database's folder mid-run: rank 0 wrote on into the unlinked file, and
    the owner made a new, empty database in its place and said 'no run 1' (exit 2).  Under a
    launcher of yours rank 0, the owner, did the same (its load record, then 'no run 1' and
    MPI_Abort)."""
    import shutil
    folder = tmp_path / "gone"
    folder.mkdir()
    db = folder / "x.db"
    bench = ["bench", "--sizes", "4B:4MiB", "--budget", "0.02", "--no-report", "--db", str(db)]
    if launch == "own":
        cmd, env = [str(mpi.ddlcomm), *bench], mpi.env()
    else:
        cmd, env = mpi.command(2, [str(mpi.python), "-m", "ddlcomm", *bench])
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _points(db) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "no points stored in time"
            time.sleep(0.2)
        shutil.rmtree(folder)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    saved = tmp_path / "x.db.run1-rescued"
    assert proc.returncode == 3 or launch == "yours" and proc.returncode != 0, err
    assert f"rank 0 saved the database it wrote to {saved}" in err and "no run 1" not in err, err
    assert not folder.exists() and _points(saved) >= 3
    from ddlcomm.results import Store
    with Store(saved, readonly=True) as copy:              # ended in the copy, not stale
        run = copy.run(1)
    assert run["status"] == "passed" and "was removed or replaced" in run["error"], run
    assert not run["stale"] and run["ended_at"]
