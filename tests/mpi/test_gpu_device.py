"""ddlcomm's own collectives on CUDA device buffers (issue 15, "GPUs II"): ring, rhd and
binomial over the ipc (CUDA IPC) and staged (pinned host) transports, the device shm
all-reduce, GPU reductions, the buffer-kind cache asking the CUDA driver.

Marked ``gpu``: they skip with the reason where torch sees no CUDA GPU, and
``scripts/gpu-check tests`` runs them on a GPU machine under each MPI.  The rank-side
suite is ``device_suite.py --device cuda`` (every dtype and op, counts 0, 1, 7, 13 and
a large one, in place and not, cache on and off; the same cases run on CPU stand-ins
in test_device.py); then ``ddlcomm bench --memory device`` end to end: every point
passes its check and records the kernel that reduced, the transport and the cache.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import once, run
from test_gpu import CUDA, WHY

pytestmark = [pytest.mark.gpu, pytest.mark.mpi,
              pytest.mark.skipif(not CUDA, reason=f"needs a GPU: {WHY}")]
SUITE = Path(__file__).resolve().parent / "device_suite.py"


@pytest.mark.parametrize("nranks", [3, 4, 2, 1])       # most telling first: a cut keeps them
def test_device_algorithms_on_cuda_tensors(mpi, nranks):
    res = mpi.mpirun(nranks, [mpi.python, SUITE, "--device", "cuda"], timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    assert f"{nranks} ranks, 0 failures" in res.stdout, res.stdout


def test_device_min_and_max_keep_a_nan(mpi):
    """CuPy's fused kernel took CUDA's min and max (fminf, fmaxf), which drop a NaN; every
    other kernel keeps it.  Each kernel that runs here, and the one auto picks."""
    once(mpi, "the device kernels' NaN")
    import importlib.util

    import torch

    from ddlcomm.kernels.device import _cupy_unusable, many_reducer
    cupy = importlib.util.find_spec("cupy") is not None
    kernels = ["auto", "torch"] + (["cupy"] if cupy else [])
    nan = float("nan")
    # float16 too: its first preamble did not compile for CuPy's float16 (a + b a float
    # beside a float16), and auto quietly took torch
    for dtype in (torch.float32, torch.float16):
        for op, third in (("min", 2.0), ("max", 3.0)):
            for kernel in kernels:
                a = torch.tensor([1.0, nan, 2.0], device="cuda", dtype=dtype)
                b = torch.tensor([nan, 1.0, 3.0], device="cuda", dtype=dtype)
                out = torch.zeros(3, device="cuda", dtype=dtype)
                reduce = many_reducer(op, dtype, True, kernel)
                reduce([a, b], out)
                got = out.float().cpu()
                what = (dtype, op, kernel, reduce.label, got)
                assert torch.isnan(got[:2]).all() and got[2] == third, what
                if kernel in ("auto", "cupy") and cupy:        # its kernel compiles and keeps a NaN
                    why = _cupy_unusable(op, str(dtype).rpartition(".")[2], torch.cuda.current_device())
                    assert reduce.label == "CuPy", (*what, why)


def test_the_driver_is_asked_and_device_tensors_are_device(mpi):
    once(mpi, "the CUDA driver's pointer query")
    import torch

    from ddlcomm.kernels.kinds import DEVICE, HOST, KindCache, driver, kind_of
    query, name = driver()
    assert query is not None, name
    t = torch.ones(1 << 10, device="cuda")
    pinned = torch.ones(16, pin_memory=True)
    assert kind_of(t) == DEVICE and kind_of(t[100:]) == DEVICE
    assert kind_of(pinned) == HOST and kind_of(torch.ones(16)) == HOST
    cache = KindCache()
    assert [cache(t), cache(t), cache(t)] == [DEVICE] * 3 and (cache.misses, cache.hits) == (1, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_own_allreduces_on_device_memory(mpi, tmp_path, dtype):
    db = tmp_path / "r.db"
    for cache in ("on", "off"):
        res = run([mpi.ddlcomm, "bench", "--db", db, "--no-report", "--backend", "mpi",
                   "--collective", "allreduce", "--memory", "device", "--algorithm", "ring,rhd,shm",
                   "--kind-cache", cache, "--ranks", "4", "--sizes", "4B:16MiBx16",
                   "--dtype", dtype, "--budget", "0.02"], mpi.env(), 240)
        assert res.returncode == 0, res.stdout + res.stderr
    out = run([mpi.ddlcomm, "results", "export", "--all", "--db", db], mpi.env(), 60)
    points = json.loads(out.stdout)
    assert points and all(p["check"] == "passed" for p in points)
    assert {p["kind_cache"] for p in points} == {"on", "off"}
    assert {p["kernel"] for p in points if p["bytes"] >= 1024} <= {"torch-CUDA", "CuPy"}
    assert {p.get("device_transport") for p in points} == {"ipc"}         # four ranks on one GPU
    assert all(p["floor_us"] > 0 for p in points)                 # the GPU-memory floor, same run


def test_host_staged_mpi_beside_own_device_allreduces_in_one_run(mpi, tmp_path):
    """issue 15's comparison: MPI's all-reduce along host-staged and shm on the device
    buffers, interleaved in one run; versus compares them in one table."""
    db = tmp_path / "r.db"
    res = run([mpi.ddlcomm, "bench", "--db", db, "--no-report", "--backend", "mpi",
               "--collective", "allreduce", "--memory", "device", "--algorithm", "library,shm",
               "--path", "host-staged", "--ranks", "2", "--sizes", "4B:1MiBx16",
               "--budget", "0.02"], mpi.env(), 240)
    assert res.returncode == 0, res.stdout + res.stderr
    points = json.loads(run([mpi.ddlcomm, "results", "export", "--all", "--db", db],
                            mpi.env(), 60).stdout)
    assert points and all(p["check"] == "passed" for p in points)
    assert {(p["algorithm"], p.get("path", "host")) for p in points} == \
        {("library", "host-staged"), ("shm", "host")}
    text = run([mpi.ddlcomm, "results", "versus", "--db", db], mpi.env(), 60).stdout
    assert "device memory, the library host-staged" in text, text
