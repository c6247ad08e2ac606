"""ddlcomm train end to end: real ranks, every backend x arch, checked replicas, falling loss.

Each run trains the small CNN for 50 timed iterations per configuration and
must show, per configuration: the loss fell (mean of the last iterations
below that of the first), every rank held identical parameters afterwards
(compared element-wise across ranks inside the run: check "passed"), and the
phases stored.  Every subprocess runs under a timeout that kills its group.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import MPIS, once, run
from test_gloo import gloo  # noqa: F401 - fixture

pytestmark = pytest.mark.mpi
COMMON = ("--model", "smallcnn", "--batch", "16", "--iters", "50", "--warmup", "3", "--no-report")


def train(env, db, *args, timeout=150):
    res = run([env.ddlcomm, "train", "--db", db, *COMMON, *args], env.env(), timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    out = run([env.ddlcomm, "results", "export", "--all", "--db", db], env.env(), 60)
    return res, json.loads(out.stdout)


def iterations(points):
    return [p for p in points if p["phase"] == "iteration"]


def check_trained(points, expected: set, heap: str = "steady"):
    its = iterations(points)
    assert {(p["arch"], p["overlap"], p["peer"]) for p in its} == expected
    for p in its:
        what = f"{p['backend']} {p['arch']} overlap={p['overlap']} peer={p['peer']}"
        assert p["check"] == "passed", what
        assert p["replicas_identical"] is True, what
        assert p["loss_decreased"] and p["loss_last"] < p["loss_first"], (what, p["loss"][:5], p["loss"][-5:])
        assert len(p["loss"]) == 53 and p["iterations"] == 50 and p["warmup"] == 3
        assert p["images_per_s"] > 0 and p["t_iter_s"] > 0
        assert p["heap"] == heap, what
    phases = {p["phase"] for p in points}
    assert {"io", "h2d", "forward", "backward", "update", "iteration"} <= phases
    assert {p["check"] for p in points} == {"passed"}


@pytest.mark.long
def test_every_arch_over_mpi(mpi, tmp_path):
    _, points = train(mpi, tmp_path / "t.db", "--backend", "mpi", "--ranks", "2",
                      "--arch", "allreduce,ps", "--overlap", "both", "--wait", "both")
    check_trained(points, {("allreduce", False, "ddlcomm"), ("allreduce", True, "ddlcomm"),
                           ("ps", False, "ddlcomm")})
    assert {(p["arch"], p["overlap"], p["wait"]) for p in iterations(points)} == {
        ("allreduce", False, "spin"), ("allreduce", False, "sleep"), ("allreduce", True, "spin"),
        ("allreduce", True, "sleep"), ("ps", False, "spin")}
    assert {p["library"] for p in points} == {"Open MPI" if mpi.name == "openmpi" else "MPICH"}
    for p in iterations(points):
        assert p["workers"] == (1 if p["arch"] == "ps" else 2)
        assert p["comm_table"] and p["t_comm_alone_s"] > 0
        # the hooks that start MPI calls ran on the main thread; a PS's hooks start none
        assert p.get("hooks_on_main_thread") is (True if p["arch"] == "allreduce" else None)
        assert p["overlap_in_backward"] is p["overlap"]
        # the per-tensor backward times add up to the backward phase the model is fed
        assert np.isclose(sum(t for t, _ in p["layers"]), p["phases_s"]["backward"], rtol=1e-6)
        assert sum(b for _, b in p["layers"]) == p["bytes"]


def test_every_arch_over_gloo_and_ddp(gloo, tmp_path):  # noqa: F811
    once(gloo, "gloo")
    _, points = train(gloo, tmp_path / "t.db", "--backend", "gloo", "--ranks", "2",
                      "--arch", "allreduce,ps", "--overlap", "both", "--peer", "ddp")
    check_trained(points, {("allreduce", False, "ddlcomm"), ("allreduce", True, "ddlcomm"),
                           ("ps", False, "ddlcomm"), ("allreduce", False, "ddp")})
    assert {p["library"] for p in points} == {"Gloo"}
    # the same start, seed and batches: DDP's loss began one batch ahead of ddlcomm's
    first = {(p["arch"], p["overlap"], p["peer"]): p["loss"][0] for p in iterations(points)}
    assert first["allreduce", False, "ddp"] == pytest.approx(first["allreduce", False, "ddlcomm"],
                                                             rel=1e-6)


def test_under_mpirun_with_files_read_ahead(mpi, tmp_path):
    """Started by mpirun directly (rank 0 owns the run), training on .npz files."""
    if mpi.name != MPIS[-1]:
        pytest.skip(f"once is enough: run under .venv/{MPIS[-1]}'s mpirun")
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        np.savez(data / f"part{i}.npz", x=rng.integers(0, 255, (24, 3, 32, 32), dtype=np.uint8),
                 y=rng.integers(0, 10, 24))
    db = tmp_path / "m.db"
    cmd, env = mpi.command(2, [mpi.ddlcomm, "train", "--db", db, "--model", "smallcnn",
                               "--batch", "8", "--iters", "5", "--warmup", "1", "--overlap",
                               "--data", data, "--no-report"])
    res = run(cmd, env, 120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = run([mpi.ddlcomm, "results", "export", "--all", "--db", db], mpi.env(), 60)
    its = iterations(json.loads(out.stdout))
    assert len(its) == 1 and its[0]["check"] == "passed" and its[0]["data"] == "files"
    assert its[0]["overlap"] is True and its[0]["ranks"] == 2


@pytest.mark.long
def test_own_allreduces_aggregate_the_buckets(mpi, tmp_path):
    """ddlcomm's ring, and auto (the pipelined shm here: one node), on the buckets' NumPy
    views at 3 ranks: trained, replicas identical, the algorithm stored."""
    for algorithm, heap in (("ring", "glibc"), ("auto", "steady")):
        _, points = train(mpi, tmp_path / f"{algorithm}.db", "--backend", "mpi", "--ranks", "3",
                          "--algorithm", algorithm, "--fusion", "64KiB", "--heap", heap)
        check_trained(points, {("allreduce", False, "ddlcomm")}, heap)
        assert {p["algorithm"] for p in iterations(points)} == {algorithm}


@pytest.mark.parametrize("nranks", [2, 3])
def test_training_through_host_staged_wires(mpi, nranks):
    """A GPU run's copies around host-only MPI calls, the CPU standing in for the GPU."""
    from pathlib import Path
    suite = Path(__file__).resolve().parent / "train_wire_suite.py"
    res = mpi.mpirun(nranks, [mpi.python, suite], timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"train wires {nranks} ranks, 0 failures" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("how", ["own", "yours"])
def test_a_batch_whose_activations_do_not_fit_is_refused_in_the_ranks(mpi, tmp_path, how):
    """vgg16 at 224x224 keeps 52 MiB of activations an image: a batch whose images, parameters
    and momentum fit but whose activations do not is refused once the ranks meet (it was
    killed by the kernel minutes later), by every rank alike, under either launcher."""
    from ddlcomm.bench.plan import mem_available
    from ddlcomm.train.fits import activation_bytes
    once(mpi, "the memory check")
    batch = mem_available() // activation_bytes("vgg16", 224) + 1   # 2 ranks: twice too many
    args = ["train", "--db", tmp_path / "a.db", "--model", "vgg16", "--image-size", "224",
            "--batch", str(batch), "--iters", "1", "--warmup", "0", "--no-report"]
    if how == "own":
        res = run([mpi.ddlcomm, *args, "--ranks", "2"], mpi.env(), 120)
    else:
        res = mpi.mpirun(2, [mpi.python, "-m", "ddlcomm", *args], timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("ddlcomm: error:")]
    assert len(errors) == 1 and "training needs at least" in errors[0], res.stderr
    assert "2 ranks of vgg16 batch" in errors[0] and "activations" in errors[0], errors
    assert "Traceback" not in res.stderr
    if how == "own":        # the ranks exit 0 and ddlcomm reads their refusal: no launcher's box
        assert res.stderr.strip().splitlines()[-1] == errors[0], res.stderr
