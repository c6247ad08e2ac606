"""``ddlcomm train`` on the GPU: 2 ranks sharing one GPU, replicas identical.

Marked ``gpu``: they skip with the reason where torch sees no CUDA GPU, and
``scripts/gpu-check tests`` runs them on a GPU machine (under each MPI).
Each run must show, per configuration: check passed (every rank's parameters
copied to the host and found identical), the loss finite, every phase stored,
the device and the CUDA sync recorded, both ranks on GPU 0 (two ranks share
the one GPU: NCCL lets them in with one NCCL_HOSTID per rank), and the S-SGD
model's prediction beside the measured iteration time.
"""
from __future__ import annotations

import json
import math

import pytest

from conftest import once, run
from test_gpu import CUDA, WHY

pytestmark = [pytest.mark.gpu, pytest.mark.mpi,
              pytest.mark.skipif(not CUDA, reason=f"needs a GPU: {WHY}")]


def train(env, db, *args, timeout=300):
    # a configuration that hangs ends, named, after 120 s (the default is 900 s)
    res = run([env.ddlcomm, "train", "--db", db, "--no-report", "--ranks", "2", "--timeout", "120",
               *args], env.env(), timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    out = run([env.ddlcomm, "results", "export", "--all", "--db", db], env.env(), 60)
    return [p for p in json.loads(out.stdout) if p["phase"] == "iteration"]


def check_on_gpu(its, backend: str, wire: str):
    assert its
    for p in its:
        what = f"{p['backend']} {p['arch']} overlap={p['overlap']} peer={p['peer']}"
        assert p["check"] == "passed" and p["replicas_identical"] is True, what
        assert math.isfinite(p["loss_last"]), what
        assert p["backend"] == backend and p["device"] == "cuda" and p["sync"] == "cuda", what
        assert p["gpu"] == [0, 0] and p["ranks_per_gpu"] == [2, 2], what
        assert p["t_iter_s"] > 0 and p["images_per_s"] > 0, what
        assert set(p["phases_s"]) >= {"io", "h2d", "forward", "backward", "update"}, what
        if p["peer"] == "ddlcomm":
            assert p["wire"] == wire and p["t_iter_predicted_s"] > 0, what
            assert p["overlap_in_backward"] is p["overlap"], what   # hooks started the calls


def test_small_cnn_over_nccl_overlap_off_and_on_and_ddp(mpi, tmp_path):
    once(mpi)
    its = train(mpi, tmp_path / "s.db", "--backend", "nccl", "--model", "smallcnn", "--batch", "32",
                "--iters", "30", "--arch", "allreduce,ps", "--overlap", "both", "--peer", "ddp")
    check_on_gpu(its, "nccl", "device")
    assert {(p["arch"], p["overlap"], p["peer"]) for p in its} == {
        ("allreduce", False, "ddlcomm"), ("allreduce", True, "ddlcomm"), ("ps", False, "ddlcomm"),
        ("allreduce", False, "ddp")}
    assert {p["library"] for p in its} == {"NCCL"}
    for p in its:
        if p["peer"] == "ddlcomm" and p["arch"] == "allreduce":
            assert p["loss_decreased"], (p["loss"][:3], p["loss"][-3:])


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_resnet50_at_64_pixels_over_nccl(mpi, tmp_path, overlap):
    """The issue's command, shortened: ResNet-50, 64x64 images, 2 ranks, nccl."""
    once(mpi)
    its = train(mpi, tmp_path / "r.db", "--backend", "nccl", "--model", "resnet50",
                "--image-size", "64", "--batch", "8", "--iters", "5", "--warmup", "2",
                "--overlap", overlap)
    check_on_gpu(its, "nccl", "device")
    assert [p["overlap"] for p in its] == [overlap == "on"]
    assert its[0]["buckets"] >= 2            # 25 MiB buckets of ResNet-50's ~98 MiB


def test_gloo_on_cuda_buckets(mpi, tmp_path):
    once(mpi)
    its = train(mpi, tmp_path / "g.db", "--backend", "gloo", "--device", "cuda",
                "--model", "smallcnn", "--batch", "32", "--iters", "10", "--overlap", "both")
    check_on_gpu(its, "gloo", "device")


def test_mpi_is_handed_host_staged_copies(mpi, tmp_path):
    """The pip MPIs are not CUDA-aware: the buckets go through host copies, never a GPU pointer."""
    its = train(mpi, tmp_path / "m.db", "--backend", "mpi", "--device", "cuda",
                "--model", "smallcnn", "--batch", "32", "--iters", "10", "--arch", "allreduce,ps")
    check_on_gpu(its, "mpi", "staged")


@pytest.mark.parametrize("algorithm", ["ring", "shm"])
def test_own_device_allreduce_of_the_buckets(mpi, tmp_path, algorithm):
    """ddlcomm's all-reduce on the CUDA buckets themselves (GPU reduction, CUDA IPC between
    the two ranks on the GPU), MPI carrying only host messages."""
    once(mpi)
    its = train(mpi, tmp_path / "o.db", "--backend", "mpi", "--device", "cuda", "--model", "smallcnn",
                "--batch", "32", "--iters", "10", "--algorithm", algorithm)
    check_on_gpu(its, "mpi", "staged")
    assert {p["algorithm"] for p in its} == {algorithm}


def test_mpi_overlap_on_the_gpu_is_refused(mpi, tmp_path):
    res = run([mpi.ddlcomm, "train", "--db", tmp_path / "x.db", "--backend", "mpi",
               "--device", "cuda", "--overlap"], mpi.env(), 120)
    assert res.returncode == 2 and "--overlap on the GPU" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
