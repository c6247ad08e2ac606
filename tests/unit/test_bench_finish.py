"""The end of a bench run: its summary line and its report, in-process."""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from ddlcomm.bench.session import finish
from ddlcomm.results import Store
from test_store import make_point


def stored(tmp_path, checks):
    db = tmp_path / "d.db"
    with Store(db) as store:
        run = store.create_run({"status": "running"})
        for i, check in enumerate(checks):
            store.add_point(run, make_point(4 << i, check=check))
    return db, run


def test_points_not_checked_are_not_counted_passed(tmp_path, capsys):
    db, run = stored(tmp_path, ["skipped", "skipped", "passed"])
    assert finish(db, run, 0, None) == 0
    assert f"run {run}: 3 points, 1 passed, 2 not checked; status passed" in capsys.readouterr().out


def test_a_report_folder_that_cannot_be_written_warns_and_keeps_the_exit_code(tmp_path, capsys):
    """Root passes the up-front access check of any path: the report failed at the end with
    a traceback and exit 1, the points stored."""
    db, run = stored(tmp_path, ["passed"])
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert finish(db, run, 0, blocker / "reports") == 0
    out, err = capsys.readouterr()
    assert "report:" not in out and err.startswith("warning: report not written to ")
    assert f"`ddlcomm report {run} --out DIR`" in err and len(err.strip().splitlines()) == 1


def test_the_owners_exit_code_keeps_to_the_readme_table():
    """A launcher's 1 (ranks killed by a SIGINT that missed the owner) read as 'a point
    failed its check' with every point passed."""
    from ddlcomm.bench.runs import exit_code
    ended = {"status": "passed"}
    assert [exit_code(rc, 0, ended) for rc in (0, 1, 2, 3, 130, 137, 255)] == [0, 3, 2, 3, 130, 3, 3]
    assert exit_code(0, 2, ended) == 1 and exit_code(1, 2, ended) == 3


def test_a_run_whose_end_was_not_stored_exits_3():
    """The database turned read-only as the run ended: every point passed, but the record
    reads 'running', and the command exited 0."""
    from ddlcomm.bench.runs import exit_code
    assert exit_code(0, 0, {"status": "running"}) == 3
    assert exit_code(0, 1, {"status": "running"}) == 3


def test_the_owner_reads_a_refusal_its_ranks_ended_the_run_with(tmp_path):
    """Under ddlcomm's launch, ranks that all refuse alike record why and exit 0 (a non-zero
    exit added Open MPI's box after rank 0's line): the run they ended is the owner's
    sign, read as bad input."""
    from ddlcomm.bench.runs import RUN_ID_ENV, _record, ranks_ended_it
    from ddlcomm.results.store import DB_ENV
    db, run = stored(tmp_path, [])
    env = {DB_ENV: str(db), RUN_ID_ENV: str(run)}
    assert not ranks_ended_it(env)
    assert _record(db, run, "failed", "training needs at least 49.6GiB on vm")
    assert ranks_ended_it(env)
    assert _record(db, run, "failed", "a second rank's word") is True   # ended, the first stands
    assert not ranks_ended_it({}) and not ranks_ended_it({DB_ENV: str(db), RUN_ID_ENV: "99"})
    gone = tmp_path / "gone.db"                 # a database removed meanwhile is not made anew
    assert not ranks_ended_it({DB_ENV: str(gone), RUN_ID_ENV: str(run)}) and not gone.exists()
    assert not _record(tmp_path / "gone.db", run, "failed", "x") and not _record(db, None, "failed", "x")


def test_the_owner_says_what_a_rank_recorded_not_a_guess(tmp_path, capsys):
    """A rank that failed in its pre-flight recorded why; the owner's last line guessed
    'during broadcast (buffer, 4B)' from the first point not stored."""
    from ddlcomm.bench.runs import settle
    db, run = stored(tmp_path, [])
    with Store(db) as store:
        store.end_if_running(run, "failed", "rank 1: pre-flight on mpi did not finish within 1 s")
        settle(store, run, 3, lambda points: " during broadcast (buffer, 4B)")
        assert store.run(run)["error"] == "rank 1: pre-flight on mpi did not finish within 1 s"
    assert capsys.readouterr().err == ("ddlcomm: error: ranks ended with exit code 3: "
                                       "rank 1: pre-flight on mpi did not finish within 1 s\n")
    db, run = stored(tmp_path / "b", [])                 # no rank said: the guess, stored too
    with Store(db) as store:
        settle(store, run, 3, lambda points: " during broadcast (buffer, 4B)")
        assert store.run(run)["error"] == "ranks ended with exit code 3 during broadcast (buffer, 4B)"
    assert capsys.readouterr().err.endswith("error: ranks ended with exit code 3 during broadcast (buffer, 4B)\n")


def test_bad_input_a_rank_said_is_not_said_again(tmp_path, capsys):
    """Exit code 2 with the rank's refusal recorded (training's memory check, once the ranks
    met): rank 0 printed it; the owner's 'ranks ended with exit code 2: ...' said it twice."""
    from ddlcomm.bench.runs import settle
    db, run = stored(tmp_path, [])
    with Store(db) as store:
        store.end_if_running(run, "failed", "training needs at least 47GiB on vm")
        settle(store, run, 2, lambda points: "")
        assert store.run(run)["error"] == "training needs at least 47GiB on vm"
    assert capsys.readouterr().err == ""
    db, run = stored(tmp_path / "b", [])                 # no rank said it: the owner does
    with Store(db) as store:
        settle(store, run, 2, lambda points: "")
    assert capsys.readouterr().err == "ddlcomm: error: ranks ended with exit code 2\n"


def test_a_rank_killed_outright_is_said_once(tmp_path, capsys):
    """A rank killed (the others interrupted by the launcher): the owner's line doubled its
    prefix, 'ranks ended with exit code 137: ranks ended with exit code 137 during ...'."""
    from ddlcomm.bench.runs import settle
    db, run = stored(tmp_path, [])
    with Store(db) as store:
        store.end_if_running(run, "interrupted", "interrupted (SIGTERM) during gather (buffer, 4B)")
        settle(store, run, 137, lambda points: " during gather (buffer, 4B)")
    err = capsys.readouterr().err
    assert err.count("ranks ended with exit code 137") == 1 and "the launcher then stopped" in err


def test_a_full_disk_at_the_end_still_says_the_run_and_exits_3(tmp_path, capsys):
    """The disk filled as the run ended: the owner exited 2 with no summary, the run stuck
    at 'running' with no word why."""
    from ddlcomm.bench.runs import exit_code, settle
    from ddlcomm.errors import StoreError
    db, run = stored(tmp_path, ["passed", "passed"])

    class Full(Store):
        def end_if_running(self, *args, **kwargs):
            raise StoreError(f"cannot write database {db}: database or disk is full")

    with Full(db) as store:
        points, failed, row = settle(store, run, 3, lambda points: " during gather (buffer, 4B)")
    err = capsys.readouterr().err
    assert len(points) == 2 and row["status"] == "running" and exit_code(3, failed, row) == 3
    assert f"warning: run {run}'s end was not stored: cannot write database" in err
    assert "ddlcomm: error: ranks ended with exit code 3 during gather (buffer, 4B)" in err


def test_signals_are_named_not_left_as_exit_codes():
    from ddlcomm.bench.runs import ended_with
    assert ended_with(-9) == "the launcher was killed by SIGKILL"
    assert ended_with(137) .startswith("ranks ended with exit code 137 (SIGKILL: killed outright")
    assert ended_with(3) == "ranks ended with exit code 3" and ended_with(200) == "ranks ended with exit code 200"


def test_the_run_names_the_signal_the_owner_was_sent(tmp_path):
    """Open MPI's prterun ends its ranks with SIGTERM on Ctrl-C: the run said SIGTERM."""
    from ddlcomm.bench.runs import _name_owners_signal
    db, run = stored(tmp_path, [])
    for error, want in (("interrupted (SIGTERM) during training (3 of 20)",
                         "interrupted (SIGINT) during training (3 of 20)"),
                        ("ranks ended with exit code 3", "ranks ended with exit code 3"),
                        ("interrupted (SIGINT) after 2 points", "interrupted (SIGINT) after 2 points")):
        with Store(db) as store:
            store.update_run(run, error=error)
            _name_owners_signal(store, run, "SIGINT")
            assert store.run(run)["error"] == want


def test_a_ranks_error_is_one_line_without_a_libraries_source_location():
    """torch's Gloo errors came whole into the run's error: a C++ source path first, a
    backtrace after."""
    from ddlcomm.bench.runs import fail_message
    from ddlcomm.errors import UsageError
    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
                        "Read error [127.0.0.1]:41234: Connection reset by peer\n"
                        "Exception raised from recv at ../gloo/pair.cc:537 (most recent call first):\n"
                        "frame #0: c10::Error::Error(...)")
    assert fail_message(1, "allreduce (buffer, 4B)", gloo) == \
        "rank 1 during allreduce (buffer, 4B): RuntimeError: Read error [127.0.0.1]:41234: Connection reset by peer"
    assert fail_message(0, None, UsageError("bad", "hint")) == "rank 0: bad (hint)"
    assert fail_message(0, None, ValueError("[x] not a path")) == "rank 0: ValueError: [x] not a path"


def test_a_lost_peer_in_torch_distributed_is_a_rank_failure():
    """Gloo's errors about a peer gone or silent become RankFailure (exit 3), in one line
    without torch's source path and advice; any other error stays the backend's."""
    from ddlcomm.comm.torchdist import peer_failure
    from ddlcomm.errors import RankFailure
    closed = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                          "Connection closed by peer [127.0.0.1]:9101. This is typically caused by "
                          "a remote worker crashing. Check the logs ... GLHF! \U0001f3d6\ufe0f\nframe #0: ...")
    failure = peer_failure("gloo", closed)
    assert isinstance(failure, RankFailure) and failure.exit_code == 3
    assert str(failure) == ("backend gloo: another rank closed its connection (it died or ended): "
                            "Connection closed by peer [127.0.0.1]:9101 "
                            "(that rank's own output says why)")
    silent = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 2000ms "
                          "for recv operation to complete")
    assert "another rank did not answer within the timeout: Timed out waiting 2000ms for recv " \
        "operation to complete (" in str(peer_failure("gloo", silent))
    assert peer_failure("gloo", RuntimeError("Tensors must be contiguous")) is None
    # the words on a later line (a backtrace's) are not the error's
    assert peer_failure("gloo", RuntimeError("Invalid scalar type\nframe #3: Timed out")) is None


def test_a_run_whose_ranks_were_not_started_is_failed_with_why(tmp_path):
    """An environment with mpi4py but no mpirun (nor mpiexec on PATH): the run was left
    'running', read as stale once its owner had exited, with no word of why."""
    import ddlcomm
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    if not cfg.exists():
        pytest.skip("needs the tests to run in a venv (make test's), to make one without mpirun")
    bare = tmp_path / "env"
    (bare / "bin").mkdir(parents=True)
    shutil.copy(cfg, bare)
    (bare / "bin" / "python").symlink_to(sys.executable)
    path = [str(Path(ddlcomm.__file__).parents[1]), *site.getsitepackages()]
    db = tmp_path / "d.db"
    proc = subprocess.run([str(bare / "bin" / "python"), "-m", "ddlcomm", "bench", "--sizes", "4B",
                           "--no-report", "--db", str(db)], capture_output=True, text=True,
                          timeout=120, env={"PATH": str(bare / "bin"), "HOME": str(tmp_path),
                                            "PYTHONPATH": os.pathsep.join(path)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("ddlcomm: error: no MPI launcher"), proc.stderr
    with Store(db) as store:
        run = store.run(1)
    assert run["status"] == "failed"
    assert run["error"].startswith("starting the ranks failed: no MPI launcher")
