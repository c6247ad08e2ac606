"""Tests of the SQLite results store."""
from __future__ import annotations

import sqlite3
from pathlib import Path
import threading
import time

import numpy as np
import pytest

from ddlcomm.errors import StoreError
from ddlcomm.results import Store, default_db_path
from ddlcomm.results import store as store_mod


def make_point(nbytes: int = 1024, collective: str = "allreduce", **over) -> dict:
    """A complete contract point."""
    p = dict(backend="mpi", library="Open MPI", library_version="5.0.3", collective=collective,
             form="buffer", algorithm="library", dtype="float32", op="sum", bytes=nbytes,
             count=nbytes // 4, ranks=4, root=0, in_place=False, iterations=100, warmup=10,
             t_min_us=1.0, t_avg_us=2.0, t_max_us=3.0, t_p50_us=2.0, t_p99_us=2.9,
             algbw_GBps=0.5, busbw_GBps=0.75, check="passed", error=None, extra={})
    p.update(over)
    return p


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "sub" / "ddlcomm.db"


@pytest.fixture
def store(db_path):
    with Store(db_path) as s:
        yield s


def test_default_db_path(monkeypatch, tmp_path):
    monkeypatch.setenv("DDLCOMM_DB", str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"
    monkeypatch.delenv("DDLCOMM_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "ddlcomm" / "ddlcomm.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_path() == tmp_path / "home" / ".local" / "share" / "ddlcomm" / "ddlcomm.db"


def test_run_round_trip(store, db_path):
    assert db_path.exists()
    rid = store.create_run({"host": "n1", "cores": 8, "command": ["ddlcomm", "run", "a b"],
                            "config": {"sizes": [4, 8], "backend": "mpi"}})
    run = store.run(rid)
    assert run["status"] == "running" and run["started_at"].endswith("+00:00")
    assert run["ended_at"] is None and run["host"] == "n1" and run["cores"] == 8
    assert run["command"] == "ddlcomm run 'a b'"
    assert run["config"] == {"sizes": [4, 8], "backend": "mpi"}
    store.update_run(rid, mpi_library="MPICH", mpi_version="4.2", config={"k": 1})
    store.finish_run(rid, "passed")
    run = store.run(rid)
    assert (run["mpi_library"], run["mpi_version"], run["config"]) == ("MPICH", "4.2", {"k": 1})
    assert run["status"] == "passed" and run["ended_at"] is not None and run["error"] is None
    assert run["n_points"] == 0 and run["collectives"] == ""


def test_point_round_trip_and_order(store):
    rid = store.create_run({})
    sizes = [4096, 4, 1 << 20, 64]
    for n in sizes:
        store.add_point(rid, make_point(n, extra={"phase": "fwd", "memory": {"kind": "host"}}))
    store.add_point(rid, make_point(8, "bcast", op=None, in_place=True, check="skipped",
                                    bytes=np.int64(8), t_avg_us=np.float64(1.5)))
    pts = store.points(rid)
    assert [p["bytes"] for p in pts] == sizes + [8]
    assert pts[0] == {**make_point(4096, extra={"phase": "fwd", "memory": {"kind": "host"}}),
                      "run_id": rid}
    last = pts[-1]
    assert last["in_place"] is True and last["op"] is None and last["extra"] == {}
    assert type(last["bytes"]) is int and last["t_avg_us"] == 1.5
    run = store.run(rid)
    assert (run["n_points"], run["n_passed"], run["n_skipped"], run["n_failed"]) == (5, 4, 1, 0)
    assert run["collectives"] == "allreduce,bcast"
    assert (run["point_ranks"], run["point_backends"]) == ("4", "mpi")
    store.add_point(rid, make_point(16, ranks=12, backend="gloo"))
    store.add_point(rid, make_point(16, ranks=2))
    assert store.run(rid)["point_ranks"] == "2,4,12"              # in numeric order
    assert set(store.run(rid)["point_backends"].split(",")) == {"mpi", "gloo"}


def test_runs_newest_first_and_points_of_all(store):
    r1 = store.create_run({"started_at": "2024-01-01T00:00:00+00:00"})
    r2 = store.create_run({"started_at": "2025-01-01T00:00:00+00:00"})
    r3 = store.create_run({"started_at": "2023-01-01T00:00:00+00:00"})
    store.add_point(r2, make_point(1))
    store.add_point(r1, make_point(2, check="failed", error="mismatch at 3"))
    assert [r["id"] for r in store.runs()] == [r2, r1, r3]
    assert [(p["run_id"], p["bytes"]) for p in store.points()] == [(r1, 2), (r2, 1)]
    assert store.runs()[1]["n_failed"] == 1


def test_persists_across_reopen(db_path):
    with Store(db_path) as s:
        rid = s.create_run({"host": "h"})
        s.add_point(rid, make_point(1, extra={"containers": 2}))
    with Store(db_path) as s:
        assert s.run(rid)["host"] == "h"
        assert s.points(rid)[0]["extra"] == {"containers": 2}


def test_bad_values_refused(store):
    rid = store.create_run({})
    with pytest.raises(StoreError, match="bad point check"):
        store.add_point(rid, make_point(check="ok"))
    with pytest.raises(StoreError, match="bad run status"):
        store.update_run(rid, status="done")
    with pytest.raises(StoreError, match="bad run status"):
        store.create_run({"status": "weird"})
    with pytest.raises(StoreError, match="cannot finish"):
        store.finish_run(rid, "running")
    with pytest.raises(StoreError, match="unknown point field.*phase"):
        store.add_point(rid, make_point(phase="fwd"))
    with pytest.raises(StoreError, match="unknown run field"):
        store.update_run(rid, hostname="x")
    with pytest.raises(StoreError, match="'bytes' must be an integer"):
        store.add_point(rid, make_point(bytes="4KiB"))
    with pytest.raises(StoreError, match="no run 99 in"):
        store.run(99)
    with pytest.raises(StoreError, match="no run 99 in"):
        store.add_point(99, make_point())
    with pytest.raises(StoreError, match="no run 99 in"):
        store.points(99)
    assert store.points(rid) == []


def test_schema_version_stored_and_newer_refused(db_path):
    with Store(db_path) as s:
        assert s.schema_version() == store_mod.SCHEMA_VERSION == 5
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("5",)
    with con:
        con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.close()
    with pytest.raises(StoreError, match=r"written by a newer ddlcomm \(schema 99\)"):
        Store(db_path)


def test_migration_adds_column(db_path, monkeypatch):
    with Store(db_path) as s:
        rid = s.create_run({})
    nxt = ("ALTER TABLE runs ADD COLUMN gpu TEXT",)
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS + [nxt])
    before = Path(db_path).read_bytes()
    with Store(db_path, readonly=True) as s:        # a reading command reads it through a copy
        assert s.schema_version() == len(store_mod.MIGRATIONS)
        assert s.run(rid)["status"] == "running"
    cols = [r[1] for r in sqlite3.connect(db_path).execute("PRAGMA table_info(runs)")]
    # the file as it was: upgraded (and switched to WAL) by a reading command, an older
    # ddlcomm refused it, and one on read-only storage could not be read at all
    assert "gpu" not in cols and Path(db_path).read_bytes() == before
    with Store(db_path) as s:                       # a writing one upgrades it
        assert s.schema_version() == len(store_mod.MIGRATIONS)
    cols = [r[1] for r in sqlite3.connect(db_path).execute("PRAGMA table_info(runs)")]
    assert "gpu" in cols


def test_schema_1_database_gains_machine_facts(db_path, monkeypatch):
    """A database written at version 1 opens, migrates, and its old runs read machine={},
    no owner: a run still 'running' months later reads stale by its silence alone."""
    with monkeypatch.context() as m:
        m.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:1])
        with Store(db_path) as s:
            assert s.schema_version() == 1
    with sqlite3.connect(db_path) as con:            # a run as ddlcomm wrote it then
        old = con.execute("INSERT INTO runs (started_at, status, host) "
                          "VALUES ('2026-01-01T00:00:00+00:00', 'running', 'before')").lastrowid
    with Store(db_path) as s:
        assert s.schema_version() == store_mod.SCHEMA_VERSION
        assert s.run(old)["machine"] == {} and s.run(old)["stale"].startswith("nothing heard from it")
        new = s.create_run({"machine": {"gpus": {"count": 0}, "mpi": {"cuda_aware": False}}})
        assert s.run(new)["machine"]["mpi"]["cuda_aware"] is False


def test_schema_3_database_gains_load(db_path, monkeypatch):
    """A database written at version 3 opens, migrates to 4, and its old runs read
    load={}; a new run stores its load record."""
    with monkeypatch.context() as m:
        m.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:3])
        with Store(db_path) as s:
            assert s.schema_version() == 3
    with sqlite3.connect(db_path) as con:            # a run as ddlcomm wrote it then
        old = con.execute("INSERT INTO runs (started_at, status, host) "
                          "VALUES ('2026-01-01T00:00:00+00:00', 'passed', 'before')").lastrowid
    cols = [r[1] for r in sqlite3.connect(db_path).execute("PRAGMA table_info(runs)")]
    assert "load" not in cols
    with Store(db_path) as s:
        assert s.schema_version() == store_mod.SCHEMA_VERSION
        assert s.run(old)["load"] == {} and s.run(old)["host"] == "before"
        record = {"ranks": 3, "usable_cores": 2, "loadavg_before": [0.5, 0.4, 0.3],
                  "others_cores": None}
        s.update_run(old, load=record)
        assert s.run(old)["load"] == record


def test_not_a_database_refused(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all\n" * 100)
    with pytest.raises(StoreError, match="is not an SQLite database"):
        Store(junk)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    with pytest.raises(StoreError, match="not a ddlcomm one"):
        Store(other)


def test_end_if_running(store):
    rid = store.create_run({})
    assert store.end_if_running(rid, "failed", "rank 3 died") is True
    run = store.run(rid)
    assert run["status"] == "failed" and run["error"] == "rank 3 died" and run["ended_at"]
    assert store.end_if_running(rid, "failed", "again") is False
    done = store.create_run({})
    store.finish_run(done, "passed")
    assert store.end_if_running(done, "failed", "late") is False
    assert store.run(done)["status"] == "passed"


def test_interrupted_and_bad_endings(store):
    rid = store.create_run({})
    assert store.end_if_running(rid, "interrupted", "interrupted during allreduce (buffer, 1MiB)")
    assert store.run(rid)["status"] == "interrupted"
    with pytest.raises(StoreError, match="cannot be ended as 'passed'"):
        store.end_if_running(rid, "passed", "no")


def test_a_run_whose_owner_died_is_stale(store):
    import subprocess
    import sys
    child = subprocess.run([sys.executable, "-c", "from ddlcomm.launch.processes import this_process;"
                            "print(repr(this_process()))"], capture_output=True, text=True, check=True)
    dead = eval(child.stdout)                       # the child has ended: its pid is gone
    live = store.create_run({})
    gone = store.create_run({"owner": dead})
    finished = store.create_run({"owner": dead})
    store.finish_run(finished, "passed")
    elsewhere = store.create_run({"owner": {**dead, "host": "another-host"}})
    stale = {r["id"]: r["stale"] for r in store.runs()}
    assert stale == {live: "", gone: "its owner died", finished: "", elsewhere: ""}
    assert store.run(live)["owner"]["pid"] == __import__("os").getpid()


def test_concurrent_writers(db_path):
    """A launcher's connection and rank 0's connection write the same file."""
    with Store(db_path) as s:
        rid = s.create_run({})
    errors: list[BaseException] = []

    def writer(first: int) -> None:
        try:
            with Store(db_path) as s:
                for i in range(40):
                    s.add_point(rid, make_point(first + i))
                    s.update_run(rid, error=None)
        except BaseException as e:      # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with Store(db_path) as s:
        pts = s.points(rid)
        assert len(pts) == 120
        for k in range(3):   # each writer's points keep their order
            mine = [p["bytes"] for p in pts if k * 1000 <= p["bytes"] < (k + 1) * 1000]
            assert mine == [k * 1000 + i for i in range(40)]


def test_writer_waits_for_lock(db_path):
    """A write blocked by another connection's transaction waits, then succeeds."""
    held = threading.Event()

    def hold() -> None:
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(0.3)
        other.execute("COMMIT")
        other.close()

    with Store(db_path) as s:
        rid = s.create_run({})
        t = threading.Thread(target=hold)
        t.start()
        held.wait(5)
        start = time.monotonic()
        s.add_point(rid, make_point())
        assert time.monotonic() - start >= 0.2
        t.join()
        assert len(s.points(rid)) == 1


def test_a_read_only_store_reads_past_a_writer_and_writes_nothing(tmp_path):
    """Reading commands took the write lock: `results list` waited 30 s and failed while a
    process held it, and could not read a database on a read-only mount at all."""
    path = tmp_path / "r.db"
    with Store(path) as store:
        run = store.create_run({"status": "passed"})
        store.add_point(run, make_point())
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        with Store(path, readonly=True) as store:
            assert len(store.points(run)) == 1
            with pytest.raises(StoreError):
                store.create_run({"status": "running"})
        assert time.monotonic() - t0 < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(StoreError, match="is empty"):
        Store(tmp_path / "empty.db", readonly=True)


def test_a_database_on_a_read_only_mount_reads(tmp_path):
    import subprocess
    import sys
    with Store(tmp_path / "r.db") as store:
        store.add_point(store.create_run({"status": "passed"}), make_point())
    probe = ("import sys; from ddlcomm.results import Store\n"
             "with Store(sys.argv[1] + '/r.db', readonly=True) as s: print('points', len(s.points()))")
    res = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" '
                          '&& exec "$2" -c "$3" "$1"', "_", str(tmp_path), sys.executable, probe],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0 and "points" not in res.stdout and "ddlcomm" not in res.stderr:
        pytest.skip(f"no mount namespace here: {res.stderr.strip()[-200:]}")
    assert res.stdout.strip() == "points 1", res.stdout + res.stderr


def test_a_store_whose_file_was_removed_saves_a_copy(tmp_path):
    from ddlcomm.results.store import rescue_path
    path = tmp_path / "d" / "r.db"
    store = Store(path)
    run = store.create_run({"status": "running"})
    store.add_point(run, make_point())
    assert not store.moved()
    path.unlink()
    assert store.moved()
    store.add_point(run, make_point(2048))           # into the unlinked file
    to = rescue_path(path, run)
    assert to == tmp_path / "d" / f"r.db.run{run}-rescued"
    store.save_copy(to)
    store.close()
    with Store(to, readonly=True) as copy:
        assert len(copy.points(run)) == 2


def test_a_nan_in_extra_is_stored_as_strict_json(tmp_path):
    """A diverged training run stored NaN, which SQLite's json_extract refuses."""
    import numpy as np
    path = tmp_path / "n.db"
    with Store(path) as store:
        run = store.create_run({"status": "passed"})
        store.add_point(run, make_point(extra={"loss": [float("nan"), 1.5], "loss_first": np.nan,
                                               "ranks_seen": {3, 1, 2}}))
        extra = store.points(run)[0]["extra"]
    assert extra == {"loss": [None, 1.5], "loss_first": None, "ranks_seen": [1, 2, 3]}
    with sqlite3.connect(path) as db:
        assert db.execute("select json_extract(extra, '$.loss[1]') from points").fetchone() == (1.5,)


def test_a_runs_command_line_is_stored_as_a_shell_would_take_it(store, monkeypatch):
    """It was joined with spaces: `--tag "a b; rm -rf x"` read back as `--tag a b; rm -rf x`."""
    from ddlcomm.bench import runs
    from ddlcomm.results import sysinfo
    monkeypatch.setattr(sysinfo, "collect", lambda ranks: {})
    argv = ["bench", "--tag", "a b; rm -rf x", "--collective", ""]
    run_id = store.create_run(runs.run_info(argv, {}))
    assert store.run(run_id)["command"] == "ddlcomm bench --tag 'a b; rm -rf x' --collective ''"


def test_a_run_silent_past_its_limit_is_stale_from_any_host(store):
    """A node lost or ranks killed outright leave no word: the owner elsewhere cannot be
    asked, but a run silent for longer than its steps may take cannot be running."""
    from datetime import datetime, timedelta, timezone
    from ddlcomm.results.store import silent_limit, stale_why
    elsewhere = {"host": "another-host", "pid": 1, "start": "1"}
    rid = store.create_run({"owner": elsewhere, "config": {"timeout_s": 120.0}})
    run = store.run(rid)
    assert run["stale"] == "" and silent_limit(run) == 540.0
    seen = datetime.fromisoformat(run["seen_at"])
    assert stale_why(run, seen + timedelta(seconds=539)) == ""
    assert stale_why(run, seen + timedelta(minutes=10)) == \
        "nothing heard from it for 10 min: its owner died or its node was lost"
    store.add_point(rid, make_point(4))                 # a point is a word from it
    assert store.run(rid)["seen_at"] >= run["seen_at"]
    assert silent_limit({"config": {}}) == store_mod.SILENT_S
    old = store.create_run({"owner": elsewhere, "started_at": "2026-01-01T00:00:00+00:00"})
    assert store.run(old)["stale"].startswith("nothing heard from it for")
    assert stale_why(store.run(old), datetime(2026, 1, 1, 0, 30, tzinfo=timezone.utc)) == ""
