"""Bad input, generated (hypothesis): every command and the Python API refuse it cleanly.

A CLI case runs the real ``python -m ddlcomm`` in a session of its own and must
end with exit 2, exactly one line on stderr starting ``ddlcomm: error:``, no
traceback, no process of its session left, and the database folder (a stored
database's bytes and mtime included) as it was.  An API case runs in-process on
a 1-rank loopback communicator and in a worker holding a real 1-rank MPI
communicator (``ddlcomm.init("mpi")``), and must raise a ``DdlcommError``
(``UsageError``/``UnsupportedError``) with a one-line message.  Examples are
derandomized (tests/unit/conftest.py), so every run checks the same cases.
"""
from __future__ import annotations

import os
import pickle
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import api_cases
from ddlcomm.bench.plan import MAX_RANKS_PER_CPU
from ddlcomm.collectives import COLLECTIVES
from ddlcomm.comm import registry
from ddlcomm.comm.native import ALGORITHMS
from ddlcomm.dtypes import DTYPES, OPS
from ddlcomm.errors import UsageError
from ddlcomm.launch.processes import proc_stat
from ddlcomm.memory import KINDS
from ddlcomm.recipes import RECIPES
from ddlcomm.results import Store
from ddlcomm.train.nets import NETS
from ddlcomm.units import MAX_ITERS, MAX_SEED
from ddlcomm.workloads import WORKLOADS
from ddlcomm.workloads.models import MODELS
from test_cli import LAUNCHER_VARS, TORCH_VARS

KNOWN = {*COLLECTIVES, *registry.BACKENDS, *DTYPES, *OPS, *KINDS, *RECIPES, *NETS, *WORKLOADS,
         *MODELS, *(a for _, a in ALGORITHMS), "library", "auto", "host", "allreduce", "ps",
         "buffer", "object", "both", "c", "numpy", "list", "show", "export", "compare"}
CASES = {"cli": 0, "api": 0}


# ------------------------------------------------------------------ running a command
@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder with a stored (empty) database, a plain file and a folder to misuse."""
    root = tmp_path_factory.mktemp("bad-input")
    Store(root / "data" / "ddlcomm.db").close()
    (root / "a-file").write_text("")
    (root / "a-folder").mkdir()
    return root


def _snapshot(folder: Path) -> dict:
    """Every file of ``folder``: size, time, bytes.  SQLite's ``-shm`` (the WAL's shared-memory
    index) is left out: any reader marks its read there, the read-only ones too."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns,
                                         p.read_bytes() if p.is_file() else b"")
            for p in sorted(folder.rglob("*")) if not p.name.endswith("-shm")}


def _session_left(sid: int) -> list[str]:
    """The processes still in session ``sid`` (from /proc/PID/stat: pgrp, then session)."""
    stats = {stat.parent.name: proc_stat(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat")}
    return [pid for pid, fields in stats.items() if fields and int(fields[3]) == sid]


def refused(place: Path, *argv: str) -> str:
    """Run ``ddlcomm ARGV`` on the stored database; assert it was refused cleanly."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_VARS) and k not in TORCH_VARS and k != "DDLCOMM_PLUGINS"}
    env["DDLCOMM_DB"] = str(place / "data" / "ddlcomm.db")
    before = _snapshot(place / "data")
    proc = subprocess.Popen([sys.executable, "-m", "ddlcomm", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    left = _session_left(proc.pid)
    CASES["cli"] += 1
    shown = f"ddlcomm {' '.join(argv)}\n{err}"
    assert proc.returncode == 2, shown
    assert "Traceback" not in err, shown
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlcomm: error:"), shown
    assert not left, f"{shown}\nleft behind: {left}"
    assert _snapshot(place / "data") == before, f"{shown}\nthe database folder changed"
    return lines[0]


def opt(flag: str, value: str) -> str:
    """``--flag=value``: a value may start with '-' without argparse taking it for an option."""
    return f"{flag}={value}"


# ------------------------------------------------------------------ bad values
#: What no number option takes (nan and inf: no finite value is above 0 and below them).
NOT_A_NUMBER = st.sampled_from(["two", "0x4", "nan", "inf", "4 4", "∞", "1/2", "--", "1,5"])
#: Not whole numbers: what a count or a run id cannot be.
BAD_WHOLE = st.one_of(NOT_A_NUMBER, st.sampled_from(["1.5", "1e3"]),
                      st.text(string.ascii_letters + "!?%&", min_size=1, max_size=6))
UNIT_TYPOS = st.sampled_from(["XB", "KIBB", "Mi B", "GB2", "bytes", "kilo", "iB", "MiB!", "b4", "B/s"])
BAD_SIZE = st.one_of(
    st.sampled_from(["abc", "12XB", "1.5KiB", "-4", "0x10", "4KiBB", "MiB", "4 4", "1e3", "4B4"]),
    st.builds(lambda n, u: f"{n}{u}", st.integers(0, 4096), UNIT_TYPOS),
    st.text("xyz!?%&*()_=", min_size=1, max_size=6))
NAME = st.text(string.ascii_lowercase + "_-0123456789", min_size=1, max_size=9).filter(
    lambda s: s not in KNOWN and s.strip("-_") == s)


def counts(minimum: int) -> st.SearchStrategy[str]:
    """Counts below ``minimum``, or not whole numbers."""
    return st.one_of(st.integers(-10 ** 6, minimum - 1).map(str), BAD_WHOLE)


def ragged(itemsize: int) -> st.SearchStrategy[str]:
    """Sizes that are not a whole number of elements of ``itemsize`` bytes."""
    return st.integers(1, 1 << 20).filter(lambda n: n % itemsize).map(lambda n: f"{n}B")


REVERSED = st.builds(lambda a, b: f"{4 * (a + b)}B:{4 * a}B", st.integers(1, 10 ** 4),
                     st.integers(1, 10 ** 4))
TOO_MANY_RANKS = st.integers(10 ** 5, 10 ** 9).map(str)


# ------------------------------------------------------------------ bench
#: Options that conflict, each with the words its refusal must say (not another refusal's).
BENCH_CONFLICTS = {
    "--collective=allreduce --workload=ps-sync": "give --collective or --workload",
    "--workload=ps-sync --sizes=4B --model=alexnet": "give --sizes or --model",
    "--form=buffer --impl=c": "give --form or --impl", "--fusion=1KiB": "--fusion applies to",
    "--steps=3": "--steps applies to", "--model=alexnet": "--model applies to",
    "--in-place --collective=gather": "--in-place does not apply to gather",
    "--hbw-fallback=dram": "--hbw-fallback applies to", "--impl=c --backend=gloo": "--impl c needs --backend mpi",
    "--dtype=int32 --op=avg --collective=allreduce": "op avg needs a floating-point dtype",
    "--containers=4 --ranks=2": "--containers 4 needs at least", "--root=3 --ranks=2": "--root 3 is not one of",
    "--workload=allreduce --algorithm=ring": "--algorithm applies to collectives", "--impl=c,c": "bad --impl",
    "--impl=c --collective=alltoall": "--impl c has no alltoall", "--backend=mpi,mpi": "--backend names something twice",
    "--collective=gather,gather": "--collective names something twice",
    "--sizes=4B --oversubscribe --ranks=100000": "100000 ranks need about",
    "--workload=ps-async --warmup=2": "--warmup: ps-async times every push",
}

BENCH = st.one_of(
    st.tuples(st.just("--sizes"), st.one_of(BAD_SIZE, ragged(4), REVERSED)),
    st.tuples(st.just("--sizes"), st.builds(lambda s, f: f"4B:64KiBx{f}", st.none(), st.integers(0, 1))),
    st.tuples(st.sampled_from(["--collective", "--backend", "--dtype", "--op", "--workload",
                               "--algorithm", "--memory", "--path", "--impl"]), NAME),
    st.tuples(st.sampled_from(["--ranks", "--iters", "--containers", "--steps"]), counts(1)),
    st.tuples(st.sampled_from(["--warmup", "--root"]), counts(0)),
    st.tuples(st.sampled_from(["--iters", "--warmup"]),
              st.integers(MAX_ITERS + 1, 10 ** 30).map(str)),
    st.tuples(st.sampled_from(["--budget", "--timeout"]),
              st.one_of(NOT_A_NUMBER, st.sampled_from(["0", "-1", "1e9"]))),
    st.tuples(st.just("--ranks"), TOO_MANY_RANKS),
    st.tuples(st.sampled_from(["--form", "--bind", "--hbw-fallback"]), NAME),
).map(lambda fv: [opt(*fv)]) | st.sampled_from(sorted(BENCH_CONFLICTS)).map(str.split) | (
    st.tuples(st.sampled_from([d for d in DTYPES if DTYPES[d].itemsize > 1]), st.integers(1, 1 << 16))
    .filter(lambda t: t[1] % DTYPES[t[0]].itemsize)
    .map(lambda t: [opt("--dtype", t[0]), opt("--sizes", f"{t[1]}B")]))


@settings(max_examples=60)
@given(argv=BENCH)
def test_bench(place, argv):
    says_why(refused(place, "bench", *argv), argv, BENCH_CONFLICTS)


def says_why(line: str, argv: list[str], conflicts: dict[str, str]) -> None:
    """A conflict's refusal says its own words; a generated one names one of its options."""
    words = conflicts.get(" ".join(argv))
    if words is not None:
        assert words in line, f"{argv}: {line}"
    else:
        flags = [a.split("=")[0].lstrip("-") for a in argv]
        assert any(flag in line for flag in flags), f"{argv}: {line}"


# ------------------------------------------------------------------ train
TRAIN_CONFLICTS = {
    "--batch=4 --batch-sweep=4,8": "give --batch or --batch-sweep",
    "--batch-sweep=4,8 --ranks=2": "--batch-sweep trains on one worker",
    "--arch=ps --overlap": "--overlap applies to --arch allreduce", "--arch=ps --wait=sleep": "--wait applies to",
    "--arch=ps --ranks=1": "--arch ps needs a server", "--arch=allreduce,allreduce": "--arch names something twice",
    "--ranks=1,1": "--ranks names something twice", "--batch=100000000 --image-size=4096": "a batch of 100000000 images",
}
TRAIN = st.one_of(
    st.tuples(st.sampled_from(["--model", "--backend", "--arch"]), NAME),
    st.tuples(st.sampled_from(["--ranks", "--batch", "--iters", "--threads", "--prefetch",
                               "--comm-reps", "--image-size", "--batch-sweep"]), counts(1)),
    st.tuples(st.sampled_from(["--warmup", "--seed"]), counts(0)),
    st.tuples(st.just("--seed"), st.integers(MAX_SEED + 1, 10 ** 30).map(str)),
    st.tuples(st.just("--threads"), st.integers(10 ** 6, 10 ** 9).map(str)),
    st.tuples(st.just("--image-size"), st.integers(1, 7).map(str)),
    st.tuples(st.sampled_from(["--iters", "--warmup", "--comm-reps"]),
              st.integers(MAX_ITERS + 1, 10 ** 30).map(str)),
    st.tuples(st.just("--lr"), st.one_of(NOT_A_NUMBER, st.sampled_from(["0", "-0.1", "10", "1e9"]))),
    st.tuples(st.just("--timeout"), st.one_of(NOT_A_NUMBER, st.sampled_from(["0", "-5"]))),
    st.tuples(st.just("--fusion"), BAD_SIZE),
    st.tuples(st.just("--ranks"), TOO_MANY_RANKS),
    st.tuples(st.just("--data"), st.sampled_from(["/nonexistent/npz", "/proc/self/status"])),
    st.tuples(st.sampled_from(["--overlap", "--wait", "--peer"]), NAME),
).map(lambda fv: [opt(*fv)]) | st.sampled_from(sorted(TRAIN_CONFLICTS)).map(str.split)


@settings(max_examples=35)
@given(argv=TRAIN)
def test_train(place, argv):
    says_why(refused(place, "train", *argv), argv, TRAIN_CONFLICTS)


def test_train_ranks_are_checked_like_bench(place):
    limit_hint = "--oversubscribe"
    assert limit_hint in refused(place, "train", "--ranks=100000")
    assert "memory" in refused(place, "train", "--ranks=100000", "--oversubscribe")
    assert str(MAX_RANKS_PER_CPU) in refused(place, "bench", "--ranks=100000")


# ------------------------------------------------------------------ results, report, model, ...
RUN_ID = st.one_of(counts(1), st.integers(1, 10 ** 6).map(str))    # the database has no runs
RESULTS = st.one_of(
    st.builds(lambda r: ["show", r], RUN_ID),
    st.builds(lambda r: ["export", r], RUN_ID),
    st.builds(lambda a, b: ["compare", a, b], RUN_ID, RUN_ID),
    st.builds(lambda f: ["export", "--all", opt("--format", f)], NAME),
    st.sampled_from([["export"], ["export", "1", "--all"], [], ["frob"], ["list", "extra"],
                     ["merge"], ["merge", "/etc"], ["merge", "/etc/hostname"]]),
    st.builds(lambda f: ["merge", f], NAME),
    st.builds(lambda a: [a], NAME),
)


@settings(max_examples=20)
@given(argv=RESULTS)
def test_results(place, argv):
    refused(place, "results", *argv)


@settings(max_examples=8)
@given(run=RUN_ID)
def test_report(place, run):
    refused(place, "report", run)


T_PHASES = ["--t-io=0", "--t-h2d=0", "--t-f=0.1", "--t-b=0.2", "--t-u=0"]
MODEL = st.one_of(
    st.builds(lambda r: ["predict", opt("--ranks", r), "--bytes=1KiB", "--alpha=1e-6", "--beta=1e-9"],
              st.one_of(counts(1), st.builds(lambda a, b: f"{a + b}:{a}", st.integers(1, 99),
                                             st.integers(1, 99)),
                        st.integers(2 ** 40 + 1, 10 ** 20).map(str))),
    st.builds(lambda b: ["predict", "--ranks=4", opt("--bytes", b), "--alpha=1e-6", "--beta=1e-9"],
              st.one_of(BAD_SIZE, REVERSED)),
    st.builds(lambda f, v: ["predict", "--ranks=4", "--bytes=1KiB", "--alpha=1e-6", "--beta=1e-9",
                            opt(f, v)], st.sampled_from(["--alpha", "--beta", "--gamma"]),
              st.one_of(NOT_A_NUMBER, st.sampled_from(["-1", "-1e-9"]))),
    st.builds(lambda c: ["predict", "--ranks=4", "--bytes=1KiB", "--alpha=1", "--beta=1",
                         opt("--collective", c)], NAME),
    st.builds(lambda w: ["ssgd", *T_PHASES, "--t-c=0.1", opt("--workers", w)], counts(1)),
    st.builds(lambda m: ["ssgd", *T_PHASES, "--t-c=0.1", "--workers=4", opt("--model", m)], NAME),
    st.builds(lambda s: ["report", "--fit=/nonexistent/fit.json", "--out=/tmp", opt("--max-ranks", s)],
              counts(2)),
    st.sampled_from([["predict", "--ranks=4", "--bytes=1KiB"], ["predict", "--ranks=4", "--bytes=1KiB",
                     "--alpha=1"], ["ssgd", *T_PHASES, "--workers=4"], ["calibrate"],
                     ["calibrate", "--db=/nonexistent/x.db"], ["report", "--fit=/nonexistent/f.json",
                     "--out=/tmp"], [], ["frob"], ["ssgd", *T_PHASES, "--workers=4", "--t-c=1",
                     "--model=alexnet", "--layers=/nonexistent"]]),
)


@settings(max_examples=25)
@given(argv=MODEL)
def test_model(place, argv):
    refused(place, "model", *argv)


@settings(max_examples=8)
@given(argv=st.one_of(st.builds(lambda n: [n], NAME),
                      st.builds(lambda r, t: [r, opt("--report-only", t)], st.sampled_from(list(RECIPES)),
                                NAME),
                      st.builds(lambda r, t: [r, opt("--timeout", t)], st.sampled_from(list(RECIPES)),
                                st.one_of(NOT_A_NUMBER, st.sampled_from(["0", "-5", "1e9"])))))
def test_reproduce(place, argv):
    refused(place, "reproduce", *argv)


KERNELS = st.one_of(
    st.tuples(st.just("--size"), st.one_of(BAD_SIZE, ragged(2), st.just("0"))),
    st.tuples(st.just("--size"), st.integers(1 << 44, 1 << 50).map(lambda n: f"{n // 4 * 4}B")),
    st.tuples(st.sampled_from(["--dtype", "--op"]), NAME),
    st.tuples(st.just("--op"), st.just("avg")),
    st.tuples(st.just("--rounds"), counts(1)),
).map(lambda fv: [opt(*fv)])


@settings(max_examples=15)
@given(argv=KERNELS)
def test_kernels(place, argv):
    refused(place, "kernels", *argv)


@settings(max_examples=6)
@given(ranks=counts(1))
def test_info(place, ranks):
    refused(place, "info", opt("--ranks", ranks))


# ------------------------------------------------------------------ output paths
#: (command line before the path, the path's flag, whether it names a file)
OUTPUTS = [(["bench"], "--db", True), (["bench"], "--report-dir", False), (["train"], "--db", True),
           (["train"], "--report-dir", False), (["results", "export", "--all"], "-o", True),
           (["report", "1"], "--out", False), (["reproduce", "woo2020"], "--out", False),
           (["reproduce", "woo2020"], "--db", True), (["model", "calibrate"], "--out", True),
           (["model", "report", "--fit=/nonexistent/f.json"], "--out", False)]


@settings(max_examples=16)
@given(which=st.sampled_from(OUTPUTS), misuse=st.sampled_from(["inside a file", "the wrong kind"]),
       leaf=NAME)
def test_output_paths(place, which, misuse, leaf):
    """A path inside a file, a folder given for a file, a file given for a folder: refused
    up front, naming the option."""
    head, flag, is_file = which
    if misuse == "inside a file":
        target = place / "a-file" / leaf
    else:
        target = place / ("a-folder" if is_file else "a-file")
    line = refused(place, *head, opt(flag, str(target)))
    assert flag in line and ("not a folder" in line or "not a file" in line), line


# ------------------------------------------------------------------ the Python API
def buf(dtype="float32", shape=(4,), mode="plain"):
    return ("buf", dtype, shape, mode)


NOT_BUFFERS = st.sampled_from([[1.0, 2.0], (1, 2), 3, None, "abc", b"xy", {"a": 1}, 1.5])
BAD_DTYPES = st.sampled_from(["complex64", "bool", "object", "U3", "int16", "uint32", "S2",
                              "datetime64[s]"])
BAD_ROOTS = st.one_of(st.integers(1, 10 ** 6), st.integers(-10 ** 6, -1),
                      st.sampled_from(["0", 0.0, 0.5, None, True, [0], "root"]))
BAD_OPS = st.one_of(NAME, st.sampled_from([1, None, ["sum"], {"op": 1}, 2.5]))
#: Tags MPI and Gloo answered with their own errors (MPI_ERR_TAG, OverflowError, ...).
BAD_TAGS = st.one_of(st.integers(-10 ** 6, -1), st.sampled_from([1 << 40, "1", 1.5, None, True]))
ROOTED = ["broadcast", "gather", "reduce"]
WITH_RECV = ["gather", "allgather", "reduce", "allreduce", "reduce_scatter", "alltoall"]
ALL_BUFFER = ROOTED + ["allgather", "allreduce", "iallreduce", "reduce_scatter", "alltoall"]


def _recv_misuse(call: str, mode: str):
    count = 4
    bad = {"readonly": buf(mode="readonly"), "dtype": buf("float64"), "short": buf(shape=(3,)),
           "noncontig": buf(mode="noncontig"), "list": [0.0] * count}[mode]
    return (call, [buf()], {"recvbuf": bad})


API = st.one_of(
    st.builds(lambda c, b: (c, [b], {}), st.sampled_from(ALL_BUFFER), NOT_BUFFERS),
    st.builds(lambda c, d: (c, [buf(d)], {}), st.sampled_from(ALL_BUFFER), BAD_DTYPES),
    st.builds(lambda c: (c, [buf(mode="noncontig")], {}), st.sampled_from(ALL_BUFFER)),
    st.builds(lambda c, r: (c, [buf()], {"root": r}), st.sampled_from(ROOTED), BAD_ROOTS),
    st.builds(lambda c, r: (c, [buf(), r], {}), st.sampled_from(["send", "isend", "irecv"]), BAD_ROOTS),
    st.builds(lambda c, t: (c, [buf(), 0], {"tag": t}),
              st.sampled_from(["send", "recv", "isend", "irecv"]), BAD_TAGS),
    st.builds(lambda c, o: (c, [buf()], {"op": o}),
              st.sampled_from(["reduce", "allreduce", "iallreduce", "reduce_scatter"]), BAD_OPS),
    st.builds(lambda c, d: (c, [buf(d)], {"op": "avg"}),
              st.sampled_from(["reduce", "allreduce", "iallreduce", "reduce_scatter"]),
              st.sampled_from(["int32", "int64", "uint8"])),
    st.builds(_recv_misuse, st.sampled_from(WITH_RECV),
              st.sampled_from(["readonly", "dtype", "short", "noncontig", "list"])),
    # (a read-only broadcast buffer is taken at the root, which only reads it: on these
    # 1-rank communicators every rank is the root; tests/mpi/api_suite.py refuses it elsewhere)
    st.builds(lambda n: ("bind", [n, buf()], {}), NAME),
    st.builds(lambda r: ("bind", ["broadcast", buf()], {"root": r}), BAD_ROOTS),
    st.builds(lambda c, r: (c, [{"x": 1}], {"root": r}),
              st.sampled_from(["broadcast_object", "gather_object", "reduce_object"]), BAD_ROOTS),
    st.builds(lambda c, n: (c, [list(range(n))], {}),
              st.sampled_from(["reduce_scatter_object", "alltoall_object"]),
              st.integers(0, 5).filter(lambda n: n != 1)),
    st.builds(lambda o: ("allreduce_object", [1], {"op": o}), BAD_OPS),
    st.builds(lambda m: ("Group", [m], {}),
              st.sampled_from([[1], [0, 0], [-1, 0], ["a"], "0", None, 5, [0.5], [True]])),
    st.builds(lambda n: ("init", [n], {}), st.one_of(NAME, st.sampled_from([3, None, ["mpi"]]))),
    st.builds(lambda k: ("init", ["mpi"], {k: 1}), NAME.filter(lambda k: k.isidentifier())),
)


@pytest.fixture(scope="module")
def mpi_worker():
    """A process holding a 1-rank MPI communicator, running cases sent on its stdin."""
    pytest.importorskip("mpi4py")
    here = Path(__file__).resolve().parent
    code = ("import pickle, sys, api_cases, ddlcomm\n"
            "comm = ddlcomm.init('mpi')\n"
            "while True:\n"
            "    try:\n"
            "        case = pickle.load(sys.stdin.buffer)\n"
            "    except EOFError:\n"
            "        break\n"
            "    pickle.dump(api_cases.run(comm, case), sys.stdout.buffer); sys.stdout.flush()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), *sys.path]))
    for key in list(env):
        if key.startswith(LAUNCHER_VARS) or key in TORCH_VARS:
            del env[key]
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, start_new_session=True)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def _on_mpi(worker, case):
    pickle.dump(case, worker.stdin)
    worker.stdin.flush()
    return pickle.load(worker.stdout)


def _assert_refused(where: str, case, outcome) -> None:
    status, text = outcome
    assert status == "refused", f"{where}: {case}: {status}\n{text}"
    # (EveryRankError: a UsageError every rank raises alike, as bind's agreed checks do)
    assert "\n" not in text and text.split(":")[0] in ("UsageError", "UnsupportedError", "EveryRankError"), text


@settings(max_examples=150)
@given(case=API)
def test_python_api(mpi_worker, case):
    CASES["api"] += 1
    if case[0] != "init":                     # the loopback is not a registered backend
        _assert_refused("loopback", case, api_cases.run(api_cases.Loopback(), case))
    _assert_refused("mpi", case, _on_mpi(mpi_worker, case))


@pytest.fixture(autouse=True)
def _ran(request):
    """The tests of this file that ran in this process (pytest-xdist may share them out)."""
    RAN.add(request.node.originalname)


RAN: set[str] = set()


def test_counted_at_least_200_cases():
    """Runs last in this file: the examples above add up to the suite's promise.  Where
    pytest-xdist shared the file out (make test), the examples asked for must add up."""
    counted = {name: test for name, test in globals().items()        # the @given tests
               if name.startswith("test_") and hasattr(test, "hypothesis")}
    if not counted.keys() <= RAN:
        asked = sum(test._hypothesis_internal_use_settings.max_examples for test in counted.values())
        assert asked >= 200, asked
        return
    assert CASES["cli"] + CASES["api"] >= 200, CASES


def test_a_result_ddlcomm_allocates_keeps_the_send_buffers_shape():
    """allreduce(np.ones((2, 3))) returned shape (6,): results of as many elements as the send
    buffer take its shape; gathered ones (p times as many) are flat."""
    comm = api_cases.Loopback()
    x = np.ones((2, 3), np.float32)
    assert comm.allreduce(x).shape == comm.reduce(x).shape == comm.iallreduce(x).wait().shape == (2, 3)
    assert comm.alltoall(x).shape == (2, 3) and comm.allgather(x).shape == (6,)


def test_only_the_collectives_that_run_in_place_take_their_send_buffer_as_receive_buffer():
    """alltoall(x, x), and at one rank allgather, gather and reduce_scatter, were handed to the
    library with aliased buffers (MPICH: an MPI error; Open MPI and Gloo ran them)."""
    comm = api_cases.Loopback()
    x = np.ones(4, np.float32)
    for name, call in (("alltoall", comm.alltoall), ("allgather", comm.allgather),
                       ("gather", comm.gather), ("reduce_scatter", comm.reduce_scatter)):
        with pytest.raises(UsageError, match=f"{name}'s receive buffer is its send buffer: only "
                                             "reduce and allreduce run in place"):
            call(x, x)
    assert comm.allreduce(x, x) is x and comm.reduce(x, x) is x


def test_a_backend_whose_close_calls_its_bases_is_closed_once():
    """NCCL's close calls the torch backends' close: the communicator became a
    ClosedClosedNCCLCommunicator, closed twice over."""
    released = []

    class Base(api_cases.Loopback):
        def close(self):
            released.append("base")

    class Derived(Base):
        def close(self):
            super().close()
            released.append("derived")

    comm = Derived()
    comm.close()
    comm.close()
    assert released == ["base", "derived"] and type(comm).__name__ == "ClosedDerived"
    with pytest.raises(UsageError, match="this loopback communicator is closed"):
        comm.allreduce(np.ones(2))
