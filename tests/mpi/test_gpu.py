"""GPU runs end to end: NCCL, Gloo on CUDA tensors, the GPU data paths.

Marked ``gpu``: they skip with the reason where torch sees no CUDA GPU, and
``scripts/gpu-check tests`` runs them on a GPU machine (under each MPI).
Every point must pass its check (the results are verified against the
expected values on host copies) and record the device and its sharing.
"""
from __future__ import annotations

import json

import pytest

from conftest import once, run
from ddlcomm.memory.gpu import cuda_available


CUDA, WHY = cuda_available()
pytestmark = [pytest.mark.gpu, pytest.mark.mpi,
              pytest.mark.skipif(not CUDA, reason=f"needs a GPU: {WHY}")]
ALL_NCCL = "allreduce,broadcast,allgather,gather,reduce,reduce_scatter,alltoall"


def bench(mpi, db, *args, timeout=240):
    # a short budget per point: the GPU tests get a few minutes of a device call
    res = run([mpi.ddlcomm, "bench", "--db", db, "--no-report", "--budget", "0.05", *args],
              mpi.env(), timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    out = run([mpi.ddlcomm, "results", "export", "--all", "--db", db], mpi.env(), 60)
    return res, json.loads(out.stdout)


@pytest.mark.parametrize("ranks", [1, 2])
def test_nccl_collectives_on_device_memory(mpi, tmp_path, ranks):
    once(mpi, "nccl")
    _, points = bench(mpi, tmp_path / "n.db", "--backend", "nccl", "--collective", ALL_NCCL,
                      "--memory", "device", "--ranks", str(ranks), "--sizes", "4B:1MiBx16")
    assert {p["check"] for p in points} == {"passed"}
    assert {p["collective"] for p in points} == set(ALL_NCCL.split(","))
    assert {p["library"] for p in points} == {"NCCL"} and {p["form"] for p in points} == {"buffer"}
    for p in points:
        assert p["memory"] == "device" and p["gpu"] == [0] * ranks
        assert p["ranks_per_gpu"] == [ranks] * ranks and p["sync"].startswith("cuda stream")
        if ranks > 1:                 # every point names the transport NCCL chose, from its log
            assert isinstance(p["nccl_transport"], dict) and p["nccl_transports"], p
        else:
            assert p["nccl_transports"] == ["none (one rank: NCCL connects nothing)"], p


def test_gloo_on_cuda_tensors(mpi, tmp_path):
    once(mpi, "gloo")
    _, points = bench(mpi, tmp_path / "g.db", "--backend", "gloo", "--memory", "device",
                      "--collective", "allreduce,broadcast,allgather", "--ranks", "2",
                      "--sizes", "4B:1MiBx16")
    assert {p["check"] for p in points} == {"passed"} and {p["library"] for p in points} == {"Gloo"}
    assert {p["memory"] for p in points} == {"device"}


#: One rank of Gloo in a child: a CUDA tensor in a point-to-point call is refused at once
#: (Gloo's send/recv would read its device pointer as host memory), collectives take it.
GLOO_P2P = """
import socket, torch, torch.distributed as dist
from ddlcomm.comm.torchdist import GlooCommunicator
from ddlcomm.errors import UnsupportedError
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
comm = GlooCommunicator()
t = torch.ones(8, device="cuda")
for call in (lambda: comm.send(t, 0), lambda: comm.recv(t, 0), lambda: comm.isend(t, 0),
             lambda: comm.irecv(t, 0), lambda: comm.sendrecv(t, 0, t.clone(), 0)):
    try:
        call()
        raise SystemExit("a CUDA tensor went to Gloo's point-to-point")
    except UnsupportedError as exc:
        assert "point-to-point" in str(exc), exc
comm.allreduce(t, t)
assert float(t.sum()) == 8.0
dist.destroy_process_group()
print("ok", flush=True)
import os
os._exit(0)                 # as ddlcomm's ranks end: torch's teardown with Gloo can abort
"""


def test_gloo_point_to_point_refuses_cuda_tensors(mpi):
    once(mpi, "Gloo's point-to-point refusal")
    res = run([mpi.python, "-c", GLOO_P2P], mpi.env(), 120)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr


def test_mpi_host_staged_and_nccl_chief(mpi, tmp_path):
    _, points = bench(mpi, tmp_path / "w.db", "--workload", "ps-sync,allreduce", "--backend", "mpi",
                      "--path", "host-staged,nccl-chief", "--memory", "device", "--ranks", "3",
                      "--sizes", "1MiB", "--steps", "3")
    assert {p["check"] for p in points} == {"passed"}
    phases = {(p["collective"], p["path"], p["phase"]) for p in points}
    for part in ("d2h", "broadcast", "h2d"):
        assert ("ps-sync", "host-staged", f"broadcast.{part}") in phases
    for part in ("mpi", "h2d", "nccl"):
        assert ("ps-sync", "nccl-chief", f"broadcast.{part}") in phases
    # each copy phase is held to pinned copies of its own bytes, alone and all ranks at once
    staged = [p for p in points if p["path"] == "host-staged" and p["phase"].endswith((".d2h", ".h2d"))]
    assert staged and all(p[f"copy_{how}_GBps"] > 0 for p in staged for how in ("alone", "at_once")), staged
    # the bytes each copy phase moves (3 ranks, 1 MiB): the gather's root copies the table back
    mib = 1 << 20
    copies = {(p["collective"], p["path"], p["phase"]): p["copy_bytes"] for p in points
              if p["phase"].endswith((".d2h", ".h2d"))}
    assert copies[("ps-sync", "host-staged", "gather.h2d")] == 3 * mib, copies
    assert copies[("ps-sync", "nccl-chief", "gather.d2h")] == 2 * mib, copies
    assert copies[("ps-sync", "nccl-chief", "broadcast.h2d")] == mib, copies
    chief = [p for p in points if p["path"] == "nccl-chief"]
    assert all(p["gpu_sharing"] and p["nccl_transports"] for p in chief), chief[0]


def test_direct_path_is_refused_with_the_evidence(mpi, tmp_path):
    """The pip MPIs are not CUDA-aware: one line, exit 2, the evidence in it."""
    res = run([mpi.ddlcomm, "bench", "--db", tmp_path / "d.db", "--workload", "ps-sync",
               "--path", "direct", "--memory", "device", "--ranks", "2"], mpi.env(), 120)
    if res.returncode == 0:
        pytest.skip("this MPI is CUDA-aware: the direct path ran")
    assert res.returncode == 2 and "needs a CUDA-aware MPI" in res.stderr, res.stderr
    assert "MPIX_Query_cuda_support" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_mpi_refuses_device_buffers_on_the_host_path(mpi, tmp_path):
    res = run([mpi.ddlcomm, "bench", "--db", tmp_path / "r.db", "--backend", "mpi", "--path", "host",
               "--memory", "device", "--ranks", "2", "--sizes", "4B"], mpi.env(), 120)
    assert res.returncode == 2 and "CUDA-aware MPI" in res.stderr, res.stderr


def test_issue15s_command_runs_mpi_host_staged_and_gloo_on_the_device(mpi, tmp_path):
    """--path left out: MPI's all-reduce goes host-staged (said once, on stderr), Gloo's on
    the CUDA tensors, ddlcomm's own algorithms on the device buffers over both."""
    res, points = bench(mpi, tmp_path / "i.db", "--collective", "allreduce", "--memory", "device",
                        "--algorithm", "library,ring,rhd,shm", "--backend", "mpi,gloo",
                        "--ranks", "4", "--sizes", "4B:1MiBx16")
    assert res.stderr.count("note: backend mpi: the library's collectives") == 1, res.stderr
    assert {p["check"] for p in points} == {"passed"}
    paths = {(p["backend"], p["algorithm"], p.get("path") or "host") for p in points
             if not p.get("phase") or p["phase"] == "allreduce"}
    assert paths == {("mpi", "library", "host-staged"), ("gloo", "library", "host")} | \
        {(b, a, "host") for b in ("mpi", "gloo") for a in ("ring", "rhd", "shm")}, paths
