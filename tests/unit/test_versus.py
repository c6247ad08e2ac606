"""``ddlcomm results versus``: the library against ddlcomm's own algorithms (pure; no MPI)."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from ddlcomm.report.tables import render_versus
from ddlcomm.results.export import point_record
from ddlcomm.results.store import Store
from ddlcomm.results.versus import targets, versus

MIB = 1 << 20
GOALS = {"speedup_from": MIB, "floor_from": 16 * MIB, "auto_below": MIB}


def point(run, algorithm, nbytes, p50, ranks=8, ran=None, add=None, **extra):
    return {"run_id": run, "collective": "allreduce", "check": "passed", "form": "buffer",
            "library": "Open MPI", "memory": "numpy", "dtype": "float32", "ranks": ranks, "bytes": nbytes,
            "algorithm": algorithm, "t_p50_us": p50, "algorithm_run": ran, "add_us": add, **extra}


def two_runs():
    """Two runs at 64 KiB and 16 MiB: the library, ring and shm, auto running shm."""
    pts = []
    for run, slow in ((1, 1.0), (2, 1.2)):
        pts += [point(run, "library", 64 << 10, 30 * slow), point(run, "ring", 64 << 10, 40),
                point(run, "shm", 64 << 10, 15), point(run, "auto", 64 << 10, 16, ran="shm"),
                point(run, "library", 16 * MIB, 6000 * slow, add=1000),
                point(run, "ring", 16 * MIB, 3000, add=1000),
                point(run, "shm", 16 * MIB, 2000, add=1000),
                point(run, "auto", 16 * MIB, 2100, ran="shm", add=1000)]
    return pts


def test_ratios_are_taken_within_each_run_then_summarised():
    (table,) = versus(two_runs())
    assert (table.library, table.ranks, table.runs, table.floor) == ("Open MPI", 8, 2, "add_us")
    assert table.algorithms == ["library", "ring", "shm", "auto"]
    small, large = table.rows
    assert small.best == "shm" and large.best == "shm"
    assert small.times["library"].median == pytest.approx(33) and small.times["library"].n == 2
    assert (large.speedup.low, large.speedup.high) == pytest.approx((3.0, 3.6))
    assert large.speedup.median == pytest.approx(3.3)
    assert large.x_floor.median == pytest.approx(2.0) and large.auto_ran == ("shm",)
    assert small.auto.high == pytest.approx(16 / 30) and small.x_floor is None


def test_the_targets_read_off_a_table():
    (table,) = versus(two_runs())
    got = targets(table, **GOALS)
    assert got.min_speedup == (pytest.approx(3.3), 16 * MIB)
    assert got.max_x_floor == (pytest.approx(2.0), 16 * MIB)
    assert got.max_auto == (pytest.approx((16 / 30 + 16 / 36) / 2), 64 << 10)


def test_only_runs_with_the_library_beside_an_own_algorithm_count():
    pts = two_runs() + [point(3, "library", 16 * MIB, 1.0), point(4, "ring", 16 * MIB, 1.0),
                        point(1, "ring", 16 * MIB, 1.0, ranks=4),          # no library at 4 ranks
                        {**point(1, "shm", 4 * MIB, 1.0), "check": "failed"},
                        {**point(1, "shm", 4 * MIB, 1.0), "collective": "broadcast"}]
    (table,) = versus(pts)
    assert table.runs == 2 and [r.nbytes for r in table.rows] == [64 << 10, 16 * MIB]
    assert versus(pts, from_bytes=MIB)[0].rows[0].nbytes == 16 * MIB
    assert versus([point(1, "auto", 4, 1.0), point(2, "library", 4, 1.0)]) == []


def test_a_run_of_the_library_and_auto_alone_gives_autos_ratio():
    """`--algorithm library,auto` compares something: auto against the library (it printed
    "no run measured ... beside an own algorithm"); no best-own columns where none ran."""
    (table,) = versus([point(1, "library", 4, 2.0), point(1, "auto", 4, 1.0, ran="shm")])
    assert table.rows[0].auto.median == pytest.approx(0.5) and table.rows[0].best is None
    text = render_versus([table], GOALS)
    assert "0.50x [shm]" in text and "auto / lib below 1MiB: highest 0.50x at 4B" in text
    assert "best own" not in text and "lib / best" not in text


def test_each_dtype_has_its_own_table():
    pts = two_runs() + [{**p, "dtype": "bfloat16", "run_id": 9} for p in two_runs()]
    assert [(t.dtype, t.runs) for t in versus(pts)] == [("bfloat16", 1), ("float32", 2)]


def test_device_points_use_the_device_copy_floor():
    pts = [point(1, "library", 16 * MIB, 900, memory="device", floor_us=100),
           point(1, "shm", 16 * MIB, 300, memory="device", floor_us=100)]
    (table,) = versus(pts)
    assert table.memory == "device" and table.floor == "floor_us"
    assert table.rows[0].x_floor.median == pytest.approx(3.0)
    assert "x_floor (best)" in render_versus([table], GOALS)


def test_the_rendering_names_every_algorithm_and_the_goals():
    text = render_versus(versus(two_runs()), GOALS)
    assert "Open MPI, 8 ranks, float32, host (NumPy's allocator) memory (2 runs)" in text
    assert "3.30x (3.00-3.60)" in text and "[shm]" in text
    assert "lib / best from 1MiB: lowest 3.30x at 16MiB" in text
    md = render_versus(versus(two_runs()), GOALS, markdown=True)
    assert "| size | library | ring | shm | auto | best own |" in md
    # no auto measured: no auto line (it said "highest - (no size measured there)")
    without = render_versus(versus([p for p in two_runs() if p["algorithm"] != "auto"]), GOALS)
    assert "auto / lib below" not in without and "lib / best from 1MiB" in without


def test_the_cli_says_what_it_did_not_find(tmp_path, capsys):
    """An unknown collective (now refused), or a --from past every size, printed "no run
    measured the library beside an own algorithm" though such runs were there."""
    from ddlcomm.cli import main
    db = tmp_path / "m.db"
    with gzip.open(Path(__file__).resolve().parent.parent / "data" / "machines" / "epyc-2core" /
                   "manycores-openmpi.db.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert main(["results", "versus", "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["results", "versus", "--db", str(db), "--collective", "foo"]) == 2
    assert "foo" in capsys.readouterr().err
    assert main(["results", "versus", "--db", str(db), "--from", "1GiB"]) == 0    # a query, not bad input
    assert "no run measured allreduce's library beside an own algorithm or auto at 1GiB or more" \
        in capsys.readouterr().out
    # the command it suggests is one bench takes: gather's own algorithms, not ring and rhd
    assert main(["results", "versus", "--db", str(db), "--collective", "gather"]) == 0
    assert "--algorithm library,linear,binomial,auto)" in capsys.readouterr().out
    assert main(["results", "versus", "--db", str(db), "--collective", "barrier"]) == 0
    assert "ddlcomm has none for barrier" in capsys.readouterr().out


def test_the_committed_2core_runs(tmp_path):
    packed = Path(__file__).resolve().parent.parent / "data" / "machines" / "epyc-2core" / \
        "manycores-openmpi.db.gz"
    db = tmp_path / "m.db"
    with gzip.open(packed, "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with Store(db) as store:
        tables = versus(map(point_record, store.points()), from_bytes=64 << 10)
    (table,) = tables
    assert table.library == "Open MPI" and table.ranks == 2 and table.runs == 4
    assert table.algorithms == ["library", "rhd", "ring", "shm", "auto"]
    assert all(r.speedup and r.x_floor and r.auto_ran for r in table.rows)


def test_device_runs_of_own_algorithms_alone_give_their_floor_ratio():
    """A host-only MPI runs no collective on device buffers: ring/rhd/shm alone still
    get x_floor; cache-off runs get a table of their own; a staged point's parts never count."""
    pts = [point(1, "ring", 16 * MIB, 300, memory="device", floor_us=100),
           point(1, "shm", 16 * MIB, 200, memory="device", floor_us=100),
           point(2, "shm", 16 * MIB, 250, memory="device", floor_us=100, kind_cache="off"),
           point(3, "library", 16 * MIB, 10, memory="device", phase="allreduce.d2h"),
           point(3, "shm", 16 * MIB, 20, memory="device", phase="allreduce.h2d")]
    tables = versus(pts)
    assert [t.memory for t in tables] == ["device", "device, kind cache off"]
    assert tables[0].rows[0].best == "shm" and tables[0].rows[0].x_floor.median == pytest.approx(2.0)
    assert tables[0].rows[0].speedup is None and tables[1].rows[0].x_floor.median == pytest.approx(2.5)


def test_a_library_along_host_staging_beside_own_device_algorithms():
    """``--path host-staged --algorithm library,shm`` on device buffers: the library's whole
    staged call (not its parts) against shm on the buffers themselves, in a table that says
    the library was staged; the rendered title reads "device memory, the library ..."."""
    pts = [point(1, "library", 16 * MIB, 1000, memory="device", path="host-staged", phase="allreduce"),
           point(1, "library", 16 * MIB, 300, memory="device", path="host-staged", phase="allreduce.d2h"),
           point(1, "shm", 16 * MIB, 250, memory="device", path="host", floor_us=100)]
    (table,) = versus(pts)
    assert table.memory == "device, the library host-staged"
    assert table.rows[0].speedup.median == pytest.approx(4.0)
    assert "Open MPI, 8 ranks, float32, device memory, the library host-staged (1 run)" in \
        render_versus([table], GOALS)


def test_one_run_stages_one_librarys_collective_and_not_anothers():
    """issue 15's command with --path left out: MPI's all-reduce host-staged, Gloo's on the
    device buffers, shm beside each in the same run; only MPI's table says staged."""
    dev = dict(memory="device", floor_us=100)
    pts = [point(1, "library", 16 * MIB, 1000, path="host-staged", phase="allreduce", **dev),
           point(1, "shm", 16 * MIB, 250, path="host", **dev),
           point(1, "library", 16 * MIB, 2000, library="Gloo", path="host", **dev),
           point(1, "shm", 16 * MIB, 260, library="Gloo", path="host", **dev)]
    tables = {t.library: t for t in versus(pts)}
    assert tables["Open MPI"].memory == "device, the library host-staged"
    assert tables["Gloo"].memory == "device"
    assert tables["Gloo"].rows[0].speedup.median == pytest.approx(2000 / 260)


def test_a_collective_without_a_floor_gets_no_floor_column():
    """A broadcast on host buffers times no reduction pass: its x_add column was all '-'."""
    pts = [{**p, "collective": "broadcast", "add_us": None} for p in two_runs() if p["algorithm"] != "auto"]
    text = render_versus(versus(pts, "broadcast"), GOALS)
    assert "(best)" not in text and "lib / best" in text
    assert "x_add (best)" in render_versus(versus(two_runs()), GOALS)


def test_runs_of_another_op_make_a_table_apart():
    """A max run's ratios are not pooled with a sum run's under one header."""
    pts = [point(1, "library", MIB, 100, op="sum"), point(1, "ring", MIB, 50, op="sum"),
           point(2, "library", MIB, 100, op="max"), point(2, "ring", MIB, 200, op="max")]
    tables = versus(pts)
    assert [t.memory for t in tables] == ["numpy", "numpy, op max"]
    assert [t.rows[0].speedup.median for t in tables] == [2.0, 0.5]


def test_columns_without_a_figure_are_left_out():
    """Own algorithms alone on device buffers (no library there): 'lib / best' was '-' on
    every row and its summary said no size was measured; 'auto / lib' showed without auto."""
    pts = [point(1, "ring", 16 * MIB, 300, memory="device", floor_us=100),
           point(1, "shm", 16 * MIB, 200, memory="device", floor_us=100)]
    text = render_versus(versus(pts), GOALS)
    assert "best own" in text and "lib / best" not in text and "auto / lib" not in text
    assert "no size measured there" not in text
