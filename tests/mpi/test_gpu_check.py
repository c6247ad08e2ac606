"""scripts/gpu-check's own mechanics, on any machine (its GPU parts need a GPU; these do not).

The device tool stops a command at 10 minutes and brings back only what lies
under $OUT, so the script must record every command's exit code, pack
everything into one file there after every command, and start nothing past
GPU_CHECK_MINUTES.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu-check"
pytestmark = pytest.mark.mpi


def _gpu_check(tmp_path: Path, minutes: float, *parts: str, **env: str):
    """Run the script; (its output, the folder its one packed file was unpacked into)."""
    out = tmp_path / "out"
    res = subprocess.run([str(SCRIPT), *parts], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUT": str(out), "GPU_CHECK_MINUTES": str(minutes),
                              **env})
    assert res.returncode == 0, res.stdout + res.stderr
    name = "gpu-check-" + re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts)) + ".tar.gz"
    assert sorted(p.name for p in out.iterdir()) == [name], "one packed file, nothing half written"
    with tarfile.open(out / name) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    return res, tmp_path / "unpacked"


def test_nothing_starts_past_the_deadline(tmp_path):
    # 30 s, less the 40 s kept for the end: no command may start.
    res, got = _gpu_check(tmp_path, 0.5, "info")
    summary = (got / "summary.txt").read_text()
    assert "skipped (deadline) info.log: nvidia-smi" in summary, summary
    assert "rc=" not in summary, summary


@pytest.mark.long
def test_info_and_a_small_sweep_come_back_packed(tmp_path):
    res, got = _gpu_check(tmp_path, 5, "info", "manycores:openmpi,mpich",
                          MANYCORES_RANKS="2", MANYCORES_OWN_RANKS="2", MANYCORES_REPS="1",
                          MANYCORES_SIZES="4B:64Bx4", MANYCORES_OWN_SIZES="1KiB:4KiBx4")
    summary = (got / "summary.txt").read_text()
    lines = [line for line in summary.splitlines() if " rc=" in line]
    # nvidia-smi fails here (no GPU): recorded, and the script goes on
    assert any("info.log: nvidia-smi" in line for line in lines), summary
    for line in lines:
        if "ddlcomm" in line:
            assert " rc=0 " in line, line
    for mpi in ("openmpi", "mpich"):
        assert "mpi" in json.loads((got / f"info-{mpi}.json").read_text())
    for lib in ("openmpi", "mpich"):
        with sqlite3.connect(got / f"manycores-{lib}.db") as db:
            tags = {(json.loads(config).get("extra") or {}).get("tag")
                    for (config,) in db.execute("SELECT config FROM runs")}
        assert {f"manycores:{lib}:rep1", f"manycores:{lib}:own:rep1"} <= tags, tags
    # the libraries take turns: both sweeps before either's own-algorithm runs
    order = [line.split("--tag ")[1].split()[0] for line in lines if "--tag manycores" in line]
    assert order == ["manycores:openmpi:rep1", "manycores:mpich:rep1",
                    "manycores:openmpi:own:rep1", "manycores:mpich:own:rep1"], order
    assert "by_copiers" in json.loads((got / "manycores-openmpi-info.json").read_text())["memory"]["copy_bandwidth"]
    # the library against the own algorithms, read off the sweeps there
    assert "Open MPI, 2 ranks" in (got / "manycores-openmpi-versus.txt").read_text()
    # what came back becomes a measured machine's test data
    dest = tmp_path / "machines" / "here"
    packed = next((tmp_path / "out").iterdir())
    again = tmp_path / f"again-{packed.name}"         # a second call's pack: its runs merged,
    shutil.copy(packed, again)                        # none of them twice
    imported = subprocess.run([str(ROOT / "scripts" / "import-machine"), str(dest), str(packed),
                               str(again)], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["info.json", "manycores-mpich.db.gz",
                                                      "manycores-openmpi.db.gz"]
    with sqlite3.connect(got / "manycores-openmpi.db") as db:
        runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    assert f"0 runs (0 points) merged, {runs} already here" in imported.stdout, imported.stdout
    merged = tmp_path / "merged.db"
    merged.write_bytes(gzip.decompress((dest / "manycores-openmpi.db.gz").read_bytes()))
    with sqlite3.connect(merged) as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == runs
    assert json.loads((dest / "info.json").read_text())["memory"]["copy_bandwidth"]["by_copiers"]
    # a later session's pack adds to what is committed (here: nothing new), the info kept
    (dest / "info.json").write_text('{"kept": true}')
    later = subprocess.run([str(ROOT / "scripts" / "import-machine"), str(dest), str(again)],
                           capture_output=True, text=True, timeout=120)
    assert later.returncode == 0 and f"0 runs (0 points) merged, {runs} already here" in later.stdout, \
        later.stdout + later.stderr
    merged.write_bytes(gzip.decompress((dest / "manycores-openmpi.db.gz").read_bytes()))
    with sqlite3.connect(merged) as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == runs
    assert json.loads((dest / "info.json").read_text()) == {"kept": True}
    # facts of a probe newer than the committed ones are added; the committed ones stay
    (dest / "info.json").write_text('{"cpus": {"model": "kept"}, "features": {"slurm": {"kept": true}}}')
    newer = subprocess.run([str(ROOT / "scripts" / "import-machine"), str(dest), str(again)],
                           capture_output=True, text=True, timeout=120)
    assert newer.returncode == 0 and "added from" in newer.stdout and "features.cma" in newer.stdout, \
        newer.stdout + newer.stderr
    info = json.loads((dest / "info.json").read_text())
    assert info["cpus"]["model"] == "kept" and info["features"]["slurm"] == {"kept": True}
    assert info["features"]["cma"]["available"] in (True, False), info["features"]


def test_own_runs_alone_add_to_a_machine_measured_before(tmp_path):
    # MANYCORES_RANKS set but empty: no sweeps, and no second probe of the machine's facts
    # (its info.json is committed); the own runs' pack merges into what the machine has.
    res, got = _gpu_check(tmp_path, 3, "manycores:openmpi", MANYCORES_RANKS="", MANYCORES_REPS="1",
                          MANYCORES_OWN_RANKS="2", MANYCORES_OWN_SIZES="1KiB:4KiBx4")
    assert not (got / "manycores-openmpi-info.json").exists()
    with sqlite3.connect(got / "manycores-openmpi.db") as db:
        tags = {(json.loads(config).get("extra") or {}).get("tag")
                for (config,) in db.execute("SELECT config FROM runs")}
    assert tags == {"manycores:openmpi:own:rep1"}, tags
    dest = tmp_path / "machine"
    dest.mkdir()
    (dest / "info.json").write_text('{"committed": true}')
    packed = next((tmp_path / "out").iterdir())
    imported = subprocess.run([str(ROOT / "scripts" / "import-machine"), str(dest), str(packed)],
                              capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0 and "no info.json" not in imported.stderr, imported.stderr
    assert json.loads((dest / "info.json").read_text()) == {"committed": True}


@pytest.mark.long
def test_the_node_probe_answers_each_question(tmp_path):
    """scripts/node-probe (gpu-check's part probe): the facts the cost model inferred."""
    res = subprocess.run([str(ROOT / "scripts" / "node-probe"), str(tmp_path / "p")], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "NODE_PROBE_RANKS": "3"})
    assert res.returncode == 0, res.stdout + res.stderr
    text = (tmp_path / "p" / "node-probe.txt").read_text()
    for n in range(1, 10):
        assert f"== {n}. " in text, text
    assert "cpu0 index0: L1" in text
    assert re.search(r"no-cma +3 ranks +16384 KiB: slowest rank", text), text
    assert re.search(r"cpus 0,1 +2 ranks", text) and "256 MiB:" in text, text
    assert re.search(r"  32 MiB: +[0-9.]+ ms, [0-9.]+ ns/B", text), text
    assert re.search(r"Open MPI +1024 KiB: clean +[0-9.]+ us \| dirty", text), text
    assert re.search(r"  2 copies: +[0-9.]+ GB/s together", text) and "cma: {" in text, text
    assert json.loads((tmp_path / "p" / "node-info.json").read_text())["features"]["cma"]


def test_one_mpis_gpu_tests_run_alone(tmp_path):
    # Here every GPU test skips with its reason; the part still runs and records its exit code.
    res, got = _gpu_check(tmp_path, 3, "tests:mpich")
    summary = (got / "summary.txt").read_text()
    assert "rc=0" in summary and "tests-mpich.log" in summary, summary
    assert not (got / "tests-openmpi.log").exists()
    log = (got / "tests-mpich.log").read_text()
    assert "DDLCOMM_TEST_MPIS=mpich" in log and "needs a GPU" in log, log


def test_mps_measures_nothing_where_its_daemon_does_not_start(tmp_path):
    # Here there is no nvidia-cuda-mps-control: said, recorded, nothing run as if under MPS.
    res, got = _gpu_check(tmp_path, 2, "mps")
    summary = (got / "summary.txt").read_text()
    assert "mps: the daemon did not start: nothing measured under it" in summary, summary
    assert "accept:nccl:2:mps" not in summary and not (got / "accept.db").exists()
    # too little time left: not tried, and not said to have failed
    res, got = _gpu_check(tmp_path / "late", 1.5, "mps")
    summary = (got / "summary.txt").read_text()
    assert "mps: skipped (deadline): not tried" in summary and "did not start" not in summary


def test_a_pack_past_the_largest_file_comes_back_in_parts(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run([str(SCRIPT), "info"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUT": str(out), "GPU_CHECK_MINUTES": "3",
                              "GPU_CHECK_PART_BYTES": "1024"})
    assert res.returncode == 0, res.stdout + res.stderr
    parts = sorted(p.name for p in out.iterdir())
    assert len(parts) > 1 and parts == [f"gpu-check-info.tar.gz.{i}" for i in range(len(parts))]
    joined = tmp_path / "joined.tar.gz"
    joined.write_bytes(b"".join((out / name).read_bytes() for name in parts))
    with tarfile.open(joined) as tar:
        assert "./summary.txt" in tar.getnames()


def test_every_gpu_test_is_in_gpu_checks_list():
    """gpu-check runs the GPU tests in its own order (GPU_TESTS): none may be left out."""
    text = SCRIPT.read_text()
    listed = re.search(r"^GPU_TESTS=\((.*?)^\)", text, re.S | re.M).group(1).split()
    found = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                            "tests"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    collected = {line.split("[")[0] for line in found.stdout.splitlines() if "::" in line}
    assert collected, found.stdout + found.stderr
    left_out = {t for t in collected if t not in listed and t.split("::")[0] not in listed}
    assert not left_out, f"GPU tests gpu-check does not run: {sorted(left_out)}"
    assert all(any(t == e or t.startswith(e + "::") for t in collected) for e in listed), listed


def test_a_recipe_is_not_started_without_the_time_for_its_report(tmp_path):
    """Under 90 s left a recipe's own deadline (left less 75 s for its report) would be below
    15 s or negative, which the recipe refuses: not started, and said so."""
    res, got = _gpu_check(tmp_path, 2, "recipes:choi2021")
    summary = (got / "summary.txt").read_text()
    assert "skipped (deadline) recipe choi2021: under 90 s left" in summary, summary
    assert "reproduce" not in summary
