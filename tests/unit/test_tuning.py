"""The measured table of ``--algorithm auto``: built from points, read back, chosen from,
refused when malformed; ``model tune`` on a committed machine's runs (no MPI needed)."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ddlcomm.cli import main
from ddlcomm.comm import tuning
from ddlcomm.comm.algorithms import decide
from ddlcomm.errors import UsageError

KiB, MiB = 1 << 10, 1 << 20
MACHINE = Path(__file__).resolve().parent.parent / "data" / "machines" / "epyc-2core"


def point(alg, nbytes, us, ranks=2, library="Open MPI", **more):
    return {"library": library, "backend": "mpi", "collective": "allreduce", "form": "buffer",
            "algorithm": alg, "bytes": nbytes, "ranks": ranks, "t_p50_us": us,
            "check": "passed", **more}


POINTS = [
    point("library", 1 * KiB, 2.0), point("shm", 1 * KiB, 3.0),
    point("library", 4 * KiB, 5.0), point("shm", 4 * KiB, 4.0), point("shm", 4 * KiB, 3.5),
    point("library", 1 * MiB, 200.0), point("shm", 1 * MiB, 150.0), point("ring", 1 * MiB, 120.0),
    point("library", 16 * MiB, 4000.0), point("ring", 16 * MiB, 2100.0),
    point("shm", 16 * MiB, 2000.0),
    point("auto", 16 * MiB, 1.0),                                  # auto is what is tuned
    point("shm-map", 16 * MiB, 2.0), point("shm-map@64KiB", 64 * MiB, 2.0),   # asked for by name only
    point("ring", 64 * MiB, 1.0, check="failed"),                  # a wrong result never wins
    point("library", 64 * MiB, 9000.0), point("shm", 64 * MiB, 8000.0),
    point("library", 256 * MiB, 30000.0),                          # measured alone: no choice
    point("library", 1 * MiB, 300.0, ranks=4), point("rhd", 1 * MiB, 250.0, ranks=4),
]


def test_build_takes_the_fastest_at_each_size_and_merges_bands():
    table = tuning.build(POINTS)
    assert table["format"] == tuning.FORMAT and table["version"] == tuning.VERSION
    two, four = table["tables"]
    assert (two["ranks"], four["ranks"]) == (2, 4)
    assert two["bands"] == [[0, "library"], [4 * KiB, "shm"], [1 * MiB, "ring"], [16 * MiB, "shm"]]
    assert four["bands"] == [[0, "rhd"]]
    assert [s["bytes"] for s in two["sizes"]] == [KiB, 4 * KiB, MiB, 16 * MiB, 64 * MiB]
    assert two["sizes"][1]["us"] == {"library": 5.0, "shm": 3.5}   # each by its fastest run
    assert "auto" not in two["sizes"][3]["us"] and "ring" not in two["sizes"][4]["us"]
    assert not any(alg.startswith("shm-map") for size in two["sizes"] for alg in size["us"])


def test_only_runs_that_measured_several_algorithms_compare():
    """A run of the library alone (an interrupted one, say) is no comparison: its fast
    figure does not beat the algorithms another run measured side by side."""
    points = [point("library", KiB, 8000.0, run_id=1), point("rhd", KiB, 14.0, run_id=1),
              point("library", KiB, 1.2, run_id=2),
              point("library", MiB, 90.0, run_id=3, op="max"), point("ring", MiB, 50.0, run_id=4)]
    with pytest.raises(UsageError, match="side by side"):
        tuning.build(points[2:])
    (table,) = tuning.build(points)["tables"]
    assert table["bands"] == [[0, "rhd"]] and table["sizes"][0]["us"] == {"library": 8000.0, "rhd": 14.0}


def test_build_ranks_by_the_metric_asked():
    """By default the median call decides: one slow call in a run does not (p50 against avg)."""
    points = [point("library", MiB, 100.0, t_avg_us=100.0), point("ring", MiB, 90.0, t_avg_us=140.0)]
    assert tuning.build(points)["tables"][0]["bands"] == [[0, "ring"]]
    by_avg = tuning.build(points, metric="t_avg_us")
    assert by_avg["metric"] == "t_avg_us" and by_avg["tables"][0]["bands"] == [[0, "library"]]


def test_choose_follows_the_bands():
    t = tuning.parse(tuning.build(POINTS), "t.json")
    pick = [t.choose("open mpi", "allreduce", 2, n) for n in
            (4, 4 * KiB - 1, 4 * KiB, 100 * KiB, MiB, 16 * MiB - 1, 16 * MiB, 1 << 30)]
    assert pick == ["library", "library", "shm", "shm", "ring", "ring", "shm", "shm"]
    assert t.choose("OPEN MPI", "allreduce", 4, 4) == "rhd"        # below the smallest: first band
    assert t.choose("Open MPI", "allreduce", 3, MiB) is None       # no such rank count
    assert t.choose("MPICH", "allreduce", 2, MiB) is None          # nor library
    assert t.choose("Open MPI", "broadcast", 2, MiB) is None


def test_nothing_side_by_side_is_refused():
    with pytest.raises(UsageError, match="two or more algorithms side by side"):
        tuning.build([point("library", MiB, 1.0), point("ring", 4 * MiB, 1.0)])


@pytest.mark.parametrize("data, message", [
    ([], "is not a tuning table"),
    ({"format": "other"}, "is not a tuning table"),
    ({"format": tuning.FORMAT, "version": 99}, "version 99"),
    ({"format": tuning.FORMAT, "version": 1}, "malformed"),
    ({"format": tuning.FORMAT, "version": 1, "tables": [{"library": "x", "collective": "allreduce",
                                                         "ranks": 2, "bands": []}]}, "malformed"),
    ({"format": tuning.FORMAT, "version": 1, "tables": [
        {"library": "x", "collective": "allreduce", "ranks": 2,
         "bands": [[100, "shm"], [0, "library"]]}]}, "ascending"),
])
def test_a_bad_table_is_refused_in_one_line(data, message):
    with pytest.raises(UsageError, match=message):
        tuning.parse(data, "t.json")


def test_load_reads_once_and_refuses_unreadable_files(tmp_path):
    with pytest.raises(UsageError, match="cannot read the tuning table"):
        tuning.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="is not JSON"):
        tuning.load(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(tuning.build(POINTS)))
    assert tuning.load(str(good)) is tuning.load(str(good))


def test_auto_takes_the_table_where_it_has_the_case():
    t = tuning.parse(tuning.build(POINTS), "t.json")
    assert decide("allreduce", "auto", MiB, 2, tuning=t, library="Open MPI") == ("ring", "tuning")
    assert decide("allreduce", "auto+numpy", MiB, 2, tuning=t, library="Open MPI") == \
        ("ring+numpy", "tuning")
    # the library's own collective takes no kernel suffix
    assert decide("allreduce", "auto+numpy", KiB, 2, tuning=t, library="Open MPI") == \
        ("library", "tuning")
    # elsewhere: the rules
    assert decide("allreduce", "auto", 64 * MiB, 4, tuning=t, library="MPICH") == ("rhd", "rules")
    assert decide("allreduce", "ring", MiB, 2, tuning=t, library="Open MPI") == ("ring", "asked")
    assert decide("allreduce", "auto", MiB, 4, tuning=t, library="Open MPI")[0] == "rhd"


def test_the_rules_give_the_library_without_a_kernel_suffix():
    assert decide("allreduce", "auto+numpy", 4)[0] == "library"


def test_model_tune_on_a_committed_machine(tmp_path, capsys):
    """Every band's algorithm is the fastest measured at its sizes (no figure written here)."""
    db = tmp_path / "openmpi.db"
    with gzip.open(MACHINE / "manycores-openmpi.db.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    out = tmp_path / "new" / "tune.json"            # its folder made (it raised FileNotFoundError)
    assert main(["model", "tune", "--db", str(db), "--collective", "allreduce",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "Open MPI allreduce, 2 ranks:" in printed.out and "tuning table:" in printed.err
    assert "p50 us" in printed.out
    table = json.loads(out.read_text())
    assert table["metric"] == "t_p50_us"
    t = tuning.load(str(out))
    for entry in table["tables"]:
        for size in entry["sizes"]:
            assert min(size["us"], key=size["us"].get) == size["best"] == \
                t.choose(entry["library"], "allreduce", entry["ranks"], size["bytes"])


def test_bench_refuses_a_bad_tuning_table_before_starting(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text("[]")
    assert main(["bench", "--collective", "allreduce", "--algorithm", "auto",
                 "--tuning", str(bad), "--db", str(tmp_path / "x.db")]) == 2
    assert "is not a tuning table" in capsys.readouterr().err


def test_bench_refuses_a_table_naming_an_algorithm_it_lacks_or_no_auto(tmp_path, capsys):
    """A band naming 'rnig' passed the plan and ended every rank at the first auto point;
    --tuning without auto was accepted and stored, changing nothing."""
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"format": tuning.FORMAT, "version": tuning.VERSION, "tables": [
        {"library": "Open MPI", "collective": "allreduce", "ranks": 2, "bands": [[0, "rnig"]]}]}))
    args = ["bench", "--collective", "allreduce", "--tuning", str(bad), "--db", str(tmp_path / "x.db")]
    assert main([*args, "--algorithm", "library,auto"]) == 2
    assert "no algorithm rnig for allreduce" in capsys.readouterr().err
    assert main([*args, "--algorithm", "library,ring"]) == 2
    assert "no auto is asked" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()


def test_a_table_choice_that_cannot_run_here_gives_way_to_the_rules():
    """A table measured on host buffers on one node named shm and ring+c: handed to a run on
    device buffers, or across nodes, they were refused at bind or mid-call."""
    t = tuning.parse(tuning.build(POINTS + [point("ring+c", 256 * MiB, 1.0),
                                            point("ring", 256 * MiB, 2.0)]), "t.json")
    assert decide("allreduce", "auto", 16 * MiB, 2, one_node=True, tuning=t, library="Open MPI") == \
        ("shm", "tuning")
    assert decide("allreduce", "auto", 16 * MiB, 2, one_node=False, tuning=t, library="Open MPI") == \
        ("ring", "rules")
    assert decide("allreduce", "auto", 256 * MiB, 2, one_node=True, tuning=t, library="Open MPI") == \
        ("ring+c", "tuning")
    assert decide("allreduce", "auto", 256 * MiB, 2, one_node=True, tuning=t, library="Open MPI",
                  on_device=True) == ("ring", "rules")
    assert decide("allreduce", "auto", MiB, 2, one_node=True, tuning=t, library="Open MPI",
                  on_device=True, one_device=True) == ("ring", "tuning")
