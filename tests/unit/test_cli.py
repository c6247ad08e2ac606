"""The real ``ddlcomm`` command on bad input: exit 2 and one line on stderr, no traceback.

Every case fails before any rank starts, so no MPI job is launched.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

import pytest

from ddlcomm.cli import build_parser
from ddlcomm.results import Store

LAUNCHER_VARS = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCALRANKID", "TORCHELASTIC_")
TORCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"}


@pytest.fixture
def db(tmp_path):
    return tmp_path / "data" / "ddlcomm.db"


@pytest.fixture
def empty_db(db):
    Store(db).close()
    return db


def ddlcomm(*args: str, db, **extra_env: str) -> subprocess.CompletedProcess:
    """Run ``python -m ddlcomm ARGS`` outside any launcher, with DDLCOMM_DB=db."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_VARS) and k not in TORCH_VARS and k != "DDLCOMM_PLUGINS"}
    env.update(extra_env, DDLCOMM_DB=str(db))
    return subprocess.run([sys.executable, "-m", "ddlcomm", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ddlcomm: error:")
    for word in words:
        assert word in lines[0]
    return lines[0]


def cases(*pairs):
    """Parametrize (command line, words its error must contain), each test named by its line."""
    return pytest.mark.parametrize("cmd, words", [pytest.param(c, w, id=c) for c, w in pairs])


@cases(
    ("--sizes 12XB", ["'12XB'"]),
    ("--sizes 64MiB:4B", ["ends below its start"]),
    ("--collective nope", ["'nope'", "allreduce"]),
    ("--collective ' , '", ["--collective is empty"]),
    ("--backend nope", ["unknown backend 'nope'", "mpi"]),
    ("--dtype float8", ["'float8'", "float16"]),
    ("--op xor", ["'xor'", "avg"]),
    ("--dtype int32 --op avg --collective allreduce", ["avg", "int32"]),
    ("--ranks 0", ["--ranks must be at least 1"]),
    ("--ranks two", ["--ranks", "'two'"]),
    ("--iters 0", ["--iters"]),
    ("--warmup -1", ["--warmup"]),
    ("--budget soon", ["--budget"]),
    ("--timeout 0", ["--timeout"]),
    ("--budget 3 --timeout 1", ["--timeout 1 s is not more than a point takes at --budget 3 s"]),
    # a point takes up to about 1.5 budgets: every large one timed out, called a hang
    ("--budget 0.9 --timeout 1", ["--timeout 1 s is not more than a point takes at --budget 0.9 s"]),
    ("--root 2", ["--root 2", "2 ranks"]),
    ("--form nope", ["--form", "nope"]),
    ("--in-place --collective gather", ["--in-place", "gather"]),
    ("--sizes 64GiB:64GiB --collective gather --ranks 4", ["gather", "64GiB", "4 ranks", "--sizes"]),
    ("--frobnicate", ["--frobnicate", "see ddlcomm bench --help"]),
    ("--workload allreduce --model resnet50 --fusion -1MiB", ["cannot parse size '-1MiB'"]),
    ("--sizes 4B:1KiBx1.5", ["growth factor", "whole number"]),
    ("--impl c --backend gloo", ["--impl c needs --backend mpi"]),
    ("--impl c --dtype float16", ["--impl c times sum reductions"]),
    ("--impl c --collective reduce", ["--impl c has no reduce", "broadcast, gather and allreduce"]),
    ("--sizes 3B", ["--sizes 3B", "float32", "4 bytes"]),
    ("--sizes 4B:64KiB --dtype float64", ["--sizes 4B", "float64", "multiples of 8 B"]),
    ("--sizes 6B,8B --dtype int32", ["--sizes 6B", "int32"]),
    ("--ranks 100000 --sizes 1KiB", ["--ranks 100000", "ranks per CPU", "--oversubscribe"]),
    ("--ranks 100000 --oversubscribe --sizes 1KiB", ["100000 ranks", "memory", "fewer --ranks"]),
)
def test_bench_bad_input(db, cmd, words):
    assert_one_line_error(ddlcomm("bench", *shlex.split(cmd), db=db), *words)
    assert not db.exists()                      # refused before anything was written


@pytest.mark.parametrize("cmd", ["train --foo", "model calibrate --foo", "results list --foo", "info --foo"])
def test_an_unknown_option_points_at_its_commands_help(db, cmd):
    """The top-level parser used to answer for every command: "(see ddlcomm --help)"."""
    words = cmd.split()[:-1]
    assert_one_line_error(ddlcomm(*cmd.split(), db=db), "--foo", f"see ddlcomm {' '.join(words)} --help")


def test_default_sweep_starts_at_one_element(db):
    from ddlcomm.bench.plan import BenchOptions, resolve
    opts = dict.fromkeys((f.name for f in __import__("dataclasses").fields(BenchOptions)))
    opts.update(backend="mpi", path="host", dtype="float64", op="sum", algorithm="library",
                bind="none", in_place=False, check=True, budget="0.2", timeout="120", root="0")
    assert resolve(BenchOptions(**opts), 2).sizes[0] == 8


@pytest.mark.parametrize("flag", ["--report-dir", "--db"])
def test_bench_output_paths_checked_before_the_run(tmp_path, db, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "sub" / ("x.db" if flag == "--db" else "reports")
    proc = ddlcomm("bench", "--sizes", "4B", flag, str(target), db=db)
    assert_one_line_error(proc, flag, "is a file, not a folder")
    assert not db.exists()


def test_report_dir_that_is_a_file(tmp_path, db):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = ddlcomm("bench", "--sizes", "4B", "--report-dir", str(blocker), db=db)
    assert_one_line_error(proc, "--report-dir", "is a file, not a folder")


def test_export_output_checked_before_reading(tmp_path, empty_db):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = ddlcomm("results", "export", "--all", "-o", str(blocker / "x.csv"), db=empty_db)
    assert_one_line_error(proc, "-o", "is a file, not a folder")
    proc = ddlcomm("results", "export", "--all", "-o", str(tmp_path), db=empty_db)
    assert_one_line_error(proc, "-o", "is a folder, not a file")
    proc = ddlcomm("results", "export", "--all", "-o", str(tmp_path / "new" / "x.csv"), db=empty_db)
    assert proc.returncode == 0, proc.stderr          # its folder made (FileNotFoundError before)
    assert (tmp_path / "new" / "x.csv").exists()


def test_missing_plugin_is_one_line(db):
    proc = ddlcomm("bench", "--sizes", "4B", db=db, DDLCOMM_PLUGINS="ddlcomm_no_such_plugin")
    assert_one_line_error(proc, "'ddlcomm_no_such_plugin'", "DDLCOMM_PLUGINS")


@cases(
    ("results show 99", ["no run 99"]),
    ("results show x", ["run id", "'x'"]),
    ("results export", ["run id or --all"]),
    ("results export 1 --all", ["run id or --all"]),
    ("results export 99", ["no run 99"]),
    ("results compare 1 2", ["no run 1"]),
    ("results", ["list, show, export, compare, versus or merge"]),
    ("results versus --from 3x", ["3x"]),
    ("results frob", ["frob"]),
    ("report 99", ["no run 99"]),
)
def test_results_bad_input(empty_db, cmd, words):
    assert_one_line_error(ddlcomm(*shlex.split(cmd), db=empty_db), *words)


def test_missing_run_hint_names_a_real_command(empty_db):
    line = assert_one_line_error(ddlcomm("results", "show", "99", db=empty_db))
    # BUG (src/ddlcomm/results/store.py, Store._no_run): the hint says
    # "`ddlcomm runs` lists the stored runs" but there is no `runs` command.
    assert "ddlcomm runs`" not in line
    assert "ddlcomm results list" in line


def test_results_on_a_missing_database(db):
    assert_one_line_error(ddlcomm("results", "list", db=db), "no results database", str(db))
    assert not db.exists()


def test_results_list_on_a_fresh_database(empty_db):
    proc = ddlcomm("results", "list", db=empty_db)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("path", [(), ("bench",), ("results",), ("results", "export"), ("results", "versus"), ("report",),
                                  ("info",)],
                         ids=lambda path: " ".join(path) or "ddlcomm")
def test_help_mentions_every_option(db, path):
    proc = ddlcomm(*path, "--help", db=db)
    assert proc.returncode == 0 and proc.stderr == ""
    parser = _subparser(build_parser(), *path)
    for action in parser._actions:
        for option in action.option_strings:
            assert option in proc.stdout, option
        if isinstance(action, argparse._SubParsersAction):
            assert all(name in proc.stdout for name in action.choices)


def test_bench_help_lists_the_collectives_and_defaults(db):
    out = ddlcomm("bench", "--help", db=db).stdout
    for word in ("broadcast", "reduce_scatter", "alltoall", "barrier", "4B:64MiB", "float16", "avg"):
        assert word in out


def test_every_command_and_action_is_in_a_table():
    """Sub-commands and results actions are looked up by name, one handler each."""
    from ddlcomm import cli
    from ddlcomm.cli import results
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == list(cli.COMMANDS)
    assert all(callable(m.run) and callable(m.add_parser) for m in cli.COMMANDS.values())
    actions = next(a for a in _subparser(parser, "results")._actions
                   if isinstance(a, argparse._SubParsersAction))
    assert set(actions.choices) == set(results.ACTIONS)


def test_console_script_entry_is_the_package_main(db):
    """pyproject's ``ddlcomm = "ddlcomm.cli:main"`` resolves to the package's main."""
    from ddlcomm import cli
    assert cli.__file__.endswith(os.path.join("cli", "__init__.py")) and callable(cli.main)
    proc = ddlcomm("--version", db=db)                 # python -m ddlcomm
    assert proc.returncode == 0 and proc.stdout.startswith("ddlcomm ")


def test_importing_the_cli_loads_no_optional_library():
    code = ("import sys, ddlcomm.cli; "
            "print([m for m in ('torch', 'mpi4py', 'matplotlib') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_a_file_error_past_the_checks_is_one_line(monkeypatch, capsys):
    """Root passes every access check: `report --out /proc/x` ended in a traceback."""
    from ddlcomm import cli
    from ddlcomm.cli import report

    def fail(args, argv):
        raise FileNotFoundError(2, "No such file or directory", "/proc/x")
    monkeypatch.setattr(report, "run", fail)
    assert cli.main(["report", "1"]) == 2
    assert capsys.readouterr().err == "ddlcomm: error: /proc/x: No such file or directory\n"


@pytest.mark.parametrize("extra", [["--full"], ["--timeout", "60"]])
def test_report_only_refuses_what_applies_to_runs(empty_db, extra):
    """--report-only --full was taken and ignored."""
    assert_one_line_error(ddlcomm("reproduce", "woo2020", "--report-only", "woo2020:x", *extra, db=empty_db),
                          "--report-only runs nothing")
