"""Multi-rank tests: real launchers, real ranks, under Open MPI and MPICH."""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_every_collective_form_dtype_op(mpi, nranks):
    res = mpi.mpirun(nranks, [mpi.python, HERE / "rank_suite.py"], timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    # the MPI backend runs every collective on every dtype: a skipped case is a lost one
    assert f"{nranks} ranks, 0 failures, 0 cases skipped" in res.stdout, res.stdout


@pytest.mark.parametrize("nranks", [2, 3])
def test_object_form_in_small_chunks(mpi, nranks):
    """The chunking that carries objects above 2 GiB, exercised with 5-byte chunks."""
    res = mpi.mpirun(nranks, [mpi.python, HERE / "rank_suite.py", "--chunk", "5"], timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{nranks} ranks, 0 failures, 0 cases skipped" in res.stdout, res.stdout


@pytest.mark.long
@pytest.mark.big
def test_objects_above_2GiB(mpi):
    res = mpi.mpirun(2, [mpi.python, HERE / "big_objects.py"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ">2GiB objects ok" in res.stdout


def _bench(mpi, args, db, timeout=180, **env):
    from conftest import run
    return run([mpi.ddlcomm, "bench", "--db", db, "--no-report", *args],
               mpi.env(**env), timeout)


def _export(mpi, db, run_id="--all"):
    from conftest import run
    args = ["--all"] if run_id == "--all" else [str(run_id)]
    res = run([mpi.ddlcomm, "results", "export", *args, "--format", "json", "--db", db],
              mpi.env(), 60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _show(mpi, db, run_id=1) -> str:
    from conftest import run
    res = run([mpi.ddlcomm, "results", "show", str(run_id), "--db", db], mpi.env(), 60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_bench_starts_its_own_ranks(mpi, tmp_path):
    db = tmp_path / "a.db"
    res = _bench(mpi, ["--collective", "allreduce,broadcast,gather", "--sizes", "1KiB:64KiB",
                       "--ranks", "2", "--iters", "20"], db)
    assert res.returncode == 0, res.stdout + res.stderr
    points = _export(mpi, db)
    assert len(points) == 3 * 7 * 2
    assert {p["check"] for p in points} == {"passed"}
    assert {p["library"] for p in points} == {"Open MPI" if mpi.name == "openmpi" else "MPICH"}
    assert {p["ranks"] for p in points} == {2}
    assert "# allreduce" in res.stdout and "database:" in res.stdout
    assert "# avg bus bandwidth: " in res.stdout
    # the ranks are the owner's children: others' CPU time is known
    load = next(ln for ln in _show(mpi, db).splitlines() if ln.startswith("load:"))
    assert "load average" in load and " cores (" in load and "2 ranks on" in load


def test_bench_under_users_launcher(mpi, tmp_path):
    db = tmp_path / "b.db"
    res = mpi.mpirun(3, [mpi.python, "-m", "ddlcomm", "bench", "--db", db, "--no-report",
                         "--collective", "allreduce", "--sizes", "4B,1MiB", "--form", "buffer",
                         "--dtype", "float16", "--iters", "5"], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    points = _export(mpi, db)
    assert [p["ranks"] for p in points] == [3, 3]
    assert {p["check"] for p in points} == {"passed"}
    # rank 0 owns the run, but not the ranks' processes: their share is not claimed
    load = next(ln for ln in _show(mpi, db).splitlines() if ln.startswith("load:"))
    assert "the ranks' own share unknown" in load and "? ranks on" in load


@pytest.mark.parametrize("command", ["bench", "train"])
def test_ranks_mismatch_is_refused(mpi, tmp_path, command):
    """Bad input every rank finds alike: said once, by rank 0, and exit 2 (each rank printed
    it, and bench's ranks aborted one another: exit 3 and MPI_ABORT's box)."""
    res = mpi.mpirun(2, [mpi.python, "-m", "ddlcomm", command, "--db", tmp_path / "c.db",
                         "--ranks", "3", *(["--sizes", "4B"] if command == "bench" else ["--iters", "1"])],
                     timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("ddlcomm: error: the launcher started 2 ranks but --ranks 3") == 1, res.stderr
    assert "MPI_ABORT" not in res.stderr


def test_sizes_the_launched_ranks_cannot_cut_are_refused_once(mpi, tmp_path):
    """reduce_scatter of 4 B under `mpirun -n 2` (whole blocks per rank, known once the ranks
    join): each rank said it and aborted the others (exit 3, MPI_ABORT's box)."""
    res = mpi.mpirun(2, [mpi.python, "-m", "ddlcomm", "bench", "--db", tmp_path / "s.db",
                         "--collective", "reduce_scatter", "--sizes", "4B", "--iters", "1"], timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("ddlcomm: error:") == 1 and "reduce_scatter" in res.stderr and \
        "2 ranks" in res.stderr, res.stderr
    assert "MPI_ABORT" not in res.stderr


def test_root_past_the_launched_ranks_is_refused(mpi, tmp_path):
    """--root 2 under `mpirun -n 2`: known wrong once the ranks join, said once, exit 2, no
    run stored (it was a failed run, exit 3, each rank's error and MPI_ABORT's box)."""
    res = mpi.mpirun(2, [mpi.python, "-m", "ddlcomm", "bench", "--db", tmp_path / "r.db", "--root", "2",
                         "--collective", "reduce", "--sizes", "4B", "--iters", "1"], timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("ddlcomm: error: --root 2 is not one of the 2 ranks") == 1, res.stderr
    assert "MPI_ABORT" not in res.stderr and not (tmp_path / "r.db").exists()


@pytest.mark.parametrize("option", [["--containers", "2"], ["--bind", "core"]])
def test_own_launch_options_are_refused_under_your_launcher(mpi, tmp_path, option):
    """--containers and --bind are what ddlcomm's own launch does: under mpirun they were
    accepted, not applied, and stored as if they had been."""
    res = mpi.mpirun(2, [mpi.python, "-m", "ddlcomm", "bench", "--db", tmp_path / "o.db", *option,
                         "--collective", "allreduce", "--sizes", "4B", "--iters", "1"], timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"ddlcomm: error: {option[0]}" in res.stderr and "own launch" in res.stderr, res.stderr
    assert not (tmp_path / "o.db").exists()


@pytest.mark.parametrize("fault", ["raise", "hang", "die"])
def test_failing_rank_ends_the_job(mpi, tmp_path, fault):
    db = tmp_path / "f.db"
    start = time.monotonic()
    res = _bench(mpi, ["--backend", "faulty", "--collective", "allreduce", "--sizes", "4B:64KiB",
                       "--form", "buffer", "--ranks", "2", "--iters", "5", "--timeout", "8"],
                 db, timeout=90, DDLCOMM_PLUGINS="faulty_backend", DDLCOMM_FAULT=fault)
    elapsed = time.monotonic() - start
    assert res.returncode != 0
    assert elapsed < 60
    assert "allreduce (buffer, 16KiB)" in res.stderr, res.stderr
    if fault == "hang":                         # the limit the user set is named as such
        assert "did not finish within 8 s (--timeout: a hang, or raise it " in res.stderr
    assert "once more" not in res.stderr        # the ranks had started: no second launch
    with sqlite3.connect(db) as con:
        status, error = con.execute("select status, error from runs").fetchone()
        sizes = [b for (b,) in con.execute("select bytes from points order by seq")]
    assert status == "failed" and error
    assert sizes == [4 * 2 ** k for k in range(12)]      # 4B .. 8KiB kept


def test_a_failed_check_under_ddlcomms_own_launch_exits_1(mpi, tmp_path):
    """Every rank exited 1 after a failed check; the owner took its launcher's 1 for a rank
    that failed: the run 'failed: ranks ended with exit code 1', exit 3 (README: 1)."""
    db = tmp_path / "c.db"
    res = _bench(mpi, ["--backend", "faulty", "--collective", "allreduce", "--sizes", "4B:32KiB",
                       "--form", "buffer", "--ranks", "2", "--iters", "2"],
                 db, timeout=90, DDLCOMM_PLUGINS="faulty_backend", DDLCOMM_FAULT="wrong")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "ranks ended with exit code" not in res.stderr, res.stderr
    with sqlite3.connect(db) as con:
        status, error = con.execute("select status, error from runs").fetchone()
        checks = [c for (c,) in con.execute('select "check" from points order by seq')]
    assert status == "failed" and "exit code" not in (error or ""), error
    assert checks.count("failed") == 2 and checks.count("passed") == 12, checks


def test_where_a_run_ended_is_read_from_its_points_as_stored(mpi, tmp_path):
    """Where no rank said where the run ended (every rank killed outright), the owner names
    the first point of the plan not stored. A barrier (stored with 0 bytes) and a
    block-cutting collective at 3 ranks (stored in whole blocks, 4 and 8 B not run) made it
    name a point that had run: 'during barrier' whatever point the ranks were in."""
    from ddlcomm.bench.session import _where_it_ended
    from ddlcomm.cli import build_parser
    from ddlcomm.cli.bench import bench_plan
    from ddlcomm.results import Store
    args = ["--collective", "barrier,reduce_scatter,allreduce", "--sizes", "4B:64B", "--ranks", "3",
            "--algorithm", "library,auto", "--iters", "2", "--form", "buffer"]
    db = tmp_path / "w.db"
    res = _bench(mpi, args, db)
    assert res.returncode == 0, res.stdout + res.stderr
    plan = bench_plan(build_parser().parse_args(["bench", *args]), default_ranks=2)
    with Store(db) as store:
        points = store.points(1)
    assert len(points) == 18 and _where_it_ended(plan, points) == ""
    for k, point in enumerate(points):
        said = _where_it_ended(plan, points[:k])
        assert said.startswith(f" during {point['collective']} ("), (k, said)
        assert ("auto, " in said) == (point["algorithm"] == "auto"), (k, said)


def test_auto_follows_a_tuning_table(mpi, tmp_path):
    """--algorithm auto --tuning FILE: the table's choice where it has this library,
    collective and rank count (recorded as auto_by), the rules elsewhere."""
    from ddlcomm.comm import tuning
    library = "Open MPI" if mpi.name == "openmpi" else "MPICH"
    table = tmp_path / "tune.json"
    table.write_text(json.dumps({"format": tuning.FORMAT, "version": tuning.VERSION, "tables": [
        {"library": library, "collective": "allreduce", "ranks": 2,
         "bands": [[0, "ring"], [65536, "rhd"]]}]}))
    db = tmp_path / "t.db"
    res = _bench(mpi, ["--collective", "allreduce,broadcast", "--algorithm", "auto",
                       "--tuning", str(table), "--sizes", "1KiB,1MiB", "--ranks", "2",
                       "--iters", "5", "--form", "buffer"], db)
    assert res.returncode == 0, res.stdout + res.stderr
    got = {(p["collective"], p["bytes"]): (p["algorithm_run"], p.get("auto_by"))
           for p in _export(mpi, db)}
    by_table = f"tuning {table}"
    assert got == {("allreduce", 1024): ("ring", by_table), ("allreduce", 1 << 20): ("rhd", by_table),
                   ("broadcast", 1024): ("library", "rules"),
                   ("broadcast", 1 << 20): ("library", "rules")}


@pytest.mark.long
def test_a_job_past_its_timeout_leaves_no_rank_behind(mpi, tmp_path):
    """The harness' own promise: a hung job fails its test within the timeout and leaves no
    rank running (Open MPI puts each rank in a process group of its own, out of reach of a
    SIGKILL to mpirun's group)."""
    marker = tmp_path / "alive"
    hang = ("import os, sys, time\nfrom mpi4py import MPI\n"
            "if MPI.COMM_WORLD.rank == 0:\n    MPI.COMM_WORLD.Barrier()\n"
            f"else:\n    open({str(marker)!r} + str(os.getpid()), 'w').close()\n    time.sleep(600)\n")
    # 15 s: time for both ranks to start on two busy cores (5 s was not always)
    with pytest.raises(pytest.fail.Exception, match="did not end within 15 s"):
        mpi.mpirun(2, [mpi.python, "-c", hang], timeout=15)
    pids = [int(p.name[len("alive"):]) for p in tmp_path.glob("alive*")]
    assert pids, "the hanging rank never started"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", f"rank {pid} left running"
