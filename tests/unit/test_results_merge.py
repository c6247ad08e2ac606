"""``ddlcomm results merge``: runs of several databases into one, once each, and a
dataset of one machine kept to one machine."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from ddlcomm.cli import main
from ddlcomm.errors import UsageError
from ddlcomm.results import Store, merge

from test_store import make_point


def fill(path, runs, cpu="EPYC", cores=16):
    """A database of ``runs`` runs of 3 points each; their ids."""
    with Store(path) as store:
        ids = []
        for k in range(runs):
            rid = store.create_run({"started_at": f"2026-11-2{k}T00:00:00+00:00", "host": str(path),
                                    "cpu_model": cpu, "cores": cores, "command": ["ddlcomm", "bench"],
                                    "status": "passed", "config": {"k": k}})
            for n in (4, 8, 16):
                store.add_point(rid, make_point(n * (k + 1), extra={"rep": k}))
            ids.append(rid)
        return ids


def test_every_run_comes_over_with_its_points_once(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    fill(a, 2)
    fill(b, 3)
    with Store(tmp_path / "all.db") as dest:
        done = merge.merge(dest, [a, b])
        assert [(d.runs, d.points, d.already) for d in done] == [(2, 6, 0), (3, 9, 0)]
        again = merge.merge(dest, [b, a])
        assert [(d.runs, d.already) for d in again] == [(0, 3), (0, 2)]
        runs = dest.runs()
        assert len(runs) == 5 and len(dest.points()) == 15
        with Store(a) as src:
            first = src.runs()[-1]
            want = [{k: v for k, v in p.items() if k != "run_id"} for p in src.points(first["id"])]
        same = [r for r in runs if r["host"] == str(a) and r["config"] == first["config"]]
        assert len(same) == 1 and same[0]["started_at"] == first["started_at"]
        got = [{k: v for k, v in p.items() if k != "run_id"} for p in dest.points(same[0]["id"])]
        assert got == want


def test_points_left_in_the_write_ahead_log_come_over(tmp_path):
    """A run killed mid-way leaves its last points in X.db-wal beside X.db."""
    src = tmp_path / "src.db"
    fill(src, 1)
    held = sqlite3.connect(src)                 # a reader keeps the log from being folded in
    held.execute("BEGIN")
    held.execute("SELECT COUNT(*) FROM points").fetchone()
    with Store(src) as store:
        store.add_point(store.runs()[0]["id"], make_point(999))
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in tmp_path.glob("src.db*"):
        shutil.copy(f, copy / f.name)
    held.close()
    assert (copy / "src.db-wal").stat().st_size > 0
    with Store(tmp_path / "dest.db") as dest:
        assert merge.merge(dest, [copy / "src.db"])[0].points == 4


def test_one_machine_refuses_a_second_machine_writing_nothing(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    fill(a, 1)
    fill(b, 1, cpu="Xeon")
    with Store(tmp_path / "d.db") as dest:
        with pytest.raises(UsageError, match="2 machines"):
            merge.merge(dest, [a, b], one_machine=True)
        assert dest.runs() == []
        merge.merge(dest, [a], one_machine=True)
        with pytest.raises(UsageError, match="Xeon"):
            merge.merge(dest, [b], one_machine=True)


def test_the_command(tmp_path, capsys):
    a, dest = tmp_path / "a.db", tmp_path / "out" / "m.db"
    fill(a, 2)
    assert main(["results", "merge", str(a), "--db", str(dest)]) == 0
    assert capsys.readouterr().out.strip() == f"{a}: 2 runs (6 points) merged"
    assert main(["results", "merge", str(a), "--db", str(dest)]) == 0
    assert capsys.readouterr().out.strip() == f"{a}: 0 runs (0 points) merged, 2 already here"
    for argv, message in (([str(tmp_path / "none.db")], "no database at"),
                          ([str(dest)], "is the database merged into")):
        assert main(["results", "merge", *argv, "--db", str(dest)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("ddlcomm: error:") and message in err and "\n" not in err


def test_a_source_of_a_newer_ddlcomm_says_to_upgrade(tmp_path, capsys):
    """Its hint said "merge from databases that ddlcomm wrote": a newer ddlcomm did."""
    a, dest = tmp_path / "a.db", tmp_path / "m.db"
    fill(a, 1)
    with sqlite3.connect(a) as con:
        con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    assert main(["results", "merge", str(a), "--db", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "written by a newer ddlcomm (schema 99)" in err and "upgrade ddlcomm to merge it" in err


def test_a_refused_one_machine_merge_makes_no_database(tmp_path, capsys):
    a, b, dest = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "new.db"
    fill(a, 1)
    fill(b, 1, cpu="Xeon", cores=64)
    assert main(["results", "merge", "--one-machine", str(a), str(b), "--db", str(dest)]) == 2
    assert "2 machines" in capsys.readouterr().err and not dest.exists()


def test_a_run_merged_while_it_ran_is_brought_up_to_date(tmp_path, capsys):
    """Merged mid-run, a run was 'already here' at every later merge: the points it stored
    since were never copied and it stayed 'running' in the destination."""
    src, dest = tmp_path / "src.db", tmp_path / "m.db"
    with Store(src) as store:
        rid = store.create_run({"started_at": "2026-11-20T00:00:00+00:00", "host": "h",
                                "command": ["ddlcomm", "bench"], "status": "running"})
        store.add_point(rid, make_point(4))
    assert main(["results", "merge", str(src), "--db", str(dest)]) == 0
    with Store(src) as store:
        store.add_point(rid, make_point(8))
        store.add_point(rid, make_point(16))
        store.finish_run(rid, "passed")
    assert main(["results", "merge", str(src), "--db", str(dest)]) == 0
    assert "1 brought up to date" in capsys.readouterr().out
    with Store(dest) as merged:
        (run,) = merged.runs()
        assert run["status"] == "passed" and [p["bytes"] for p in merged.points(run["id"])] == [4, 8, 16]
    assert main(["results", "merge", str(src), "--db", str(dest)]) == 0
    assert "1 already here" in capsys.readouterr().out


def test_a_merge_stopped_midway_has_said_how_far_it_got(tmp_path, capsys, monkeypatch):
    a, b, dest = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "m.db"
    fill(a, 1)
    fill(b, 1, cpu="Xeon")
    real = Store.import_run

    def stop_in_b(self, run, points):
        if run["host"] == str(b):
            raise KeyboardInterrupt
        return real(self, run, points)
    monkeypatch.setattr(Store, "import_run", stop_in_b)
    assert main(["results", "merge", str(a), str(b), "--db", str(dest)]) == 130
    out, err = capsys.readouterr()
    assert out.strip() == f"{a}: 1 run (3 points) merged"
    assert "the runs merged so far are whole and stay" in err and "ddlcomm: interrupted" in err


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare, to mount a folder read-only")
def test_a_source_on_a_read_only_mount_is_merged(tmp_path):
    """Sources were opened to be written (their schema, WAL mode): a database on a read-only
    mount, which `results list` reads, was refused as 'cannot open database ... (merge from
    databases that ddlcomm wrote)'."""
    src, ro, dest = tmp_path / "src", tmp_path / "ro", tmp_path / "m.db"
    src.mkdir()
    ro.mkdir()
    fill(src / "a.db", 2)
    script = (f"mount --bind {src} {ro} && mount -o remount,bind,ro {ro} && "
              f"{sys.executable} -m ddlcomm results merge {ro / 'a.db'} --db {dest}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{ro / 'a.db'}: 2 runs (6 points) merged"
