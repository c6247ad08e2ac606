"""Bad GPU input on a machine without a GPU: one clear line, exit 2 (tests/mpi/test_gpu.py
runs the same commands on a GPU machine)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ddlcomm.errors import UnsupportedError
from ddlcomm.memory.gpu import cuda_available

pytestmark = pytest.mark.skipif(cuda_available()[0], reason="this machine has a GPU")


def ddlcomm(*argv: str, db) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddlcomm", "bench", "--db", str(db), *argv],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, says", [
    (("--backend", "nccl", "--sizes", "4B"),
     "ddlcomm: error: backend nccl needs a CUDA GPU: torch.cuda.is_available() is False"),
    (("--memory", "device", "--sizes", "4B"), "ddlcomm: error: memory kind device needs a GPU"),
    (("--memory", "pinned", "--sizes", "4B"), "ddlcomm: error: memory kind pinned needs a GPU"),
    (("--backend", "gloo", "--memory", "device"), "ddlcomm: error: memory kind device needs a GPU"),
    # issue 15's command: MPI's collectives would go host-staged; here nothing can
    (("--collective", "allreduce", "--memory", "device", "--algorithm", "library,ring,rhd,shm",
      "--backend", "mpi,gloo", "--ranks", "4", "--sizes", "4B:256MiB"),
     "ddlcomm: error: memory kind device needs a GPU"),
    (("--workload", "ps-sync", "--path", "host-staged"),
     "ddlcomm: error: data path host-staged (copy device to host"),
    (("--workload", "ps-sync", "--path", "nccl-chief"),     # the path is named, not a backend never given
     "ddlcomm: error: --path nccl-chief runs NCCL among the workers, and backend nccl needs a CUDA GPU"),
    (("--workload", "allreduce", "--path", "nccl-chief", "--ranks", "1"),
     "ddlcomm: error: --path nccl-chief needs a chief worker (rank 1) beside rank 0"),
    (("--workload", "ps-sync", "--path", "direct"),             # not sent to host-staged, refused here too
     "ddlcomm: error: --path direct needs a CUDA-aware MPI"),
    (("--workload", "ps-sync", "--path", "direct"), "(an MPI built with CUDA, on a GPU machine (this one has none: --path host))"),
    (("--workload", "ps-async", "--path", "host-staged"), "ps-async runs along --path host only"),
    (("--collective", "allreduce", "--path", "host-staged"),
     "ddlcomm: error: data path host-staged (copy device to host"),
    (("--collective", "allreduce", "--path", "nccl-chief"),
     "ddlcomm: error: --path nccl-chief is a parameter-server path"),
    (("--collective", "allreduce", "--path", "host-staged", "--impl", "c"),
     "ddlcomm: error: --impl c runs on host buffers"),
    # a path's object points were left out unsaid: 0 points, 'passed'
    (("--collective", "allreduce", "--path", "host-staged", "--form", "object"),
     "ddlcomm: error: --path host-staged moves buffer-form calls only, not object"),
])
def test_gpu_requests_without_a_gpu(tmp_path, argv, says):
    res = ddlcomm(*argv, db=tmp_path / "x.db")
    assert res.returncode == 2, res.stdout + res.stderr
    assert says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "x.db").exists()


def test_ps_async_is_refused_before_any_rank_on_a_backend_without_any_source_receive():
    """On a GPU machine the backend's own check passes; the workload's refuses NCCL there,
    before ranks start (rather than a server failing at its first receive)."""
    from ddlcomm.bench.plan import BenchPlan
    from ddlcomm.workloads.base import check_request
    plan = BenchPlan(backends=["mpi", "nccl"], collectives=[], sizes=[1024], dtype="float32",
                     op="sum", forms=["buffer"], workloads=["ps-async"], ranks=3)
    with pytest.raises(UnsupportedError, match="which backend nccl cannot"):
        check_request(plan)
    check_request(BenchPlan(**{**plan.__dict__, "backends": ["mpi", "gloo"]}))
