"""ddlcomm's own collectives on device buffers (ddlcomm.comm.device), WITHOUT a GPU.

The rank-side suite ``device_suite.py`` runs every device algorithm (allreduce ring,
rhd, shm; broadcast and reduce binomial) over both transports on CPU tensors that
stand in for GPU memory: the ``ipc`` transport and the shm all-reduce map peers'
buffers from /dev/shm files, torch's CPU kernels reduce, and the messages go over a
real MPI (both) and Gloo (MPICH and Gloo ``--thin``: every dtype with sum, every op
with float32, since the backend carries bytes and signals while torch's kernels reduce;
the full product runs under Open MPI).  These test the algorithms' plumbing (the ready/done
protocol, handles sent once per buffer, blocks, in place, avg's finish, the facts of a
point), not CUDA: tests/mpi/test_gpu_device.py runs the same suite on CUDA tensors.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from test_gloo import gloo, gloo_suite     # noqa: F401 (gloo: a fixture); tests/mpi is on sys.path

SUITE = Path(__file__).resolve().parent / "device_suite.py"


@pytest.mark.long
@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_device_algorithms_on_cpu_stand_ins_under_mpi(mpi, nranks):
    thin = ["--thin"] if mpi.name == "mpich" else []
    res = mpi.mpirun(nranks, [mpi.python, SUITE, *thin], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    assert f"{nranks} ranks, 0 failures" in res.stdout, res.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [2, 3])
def test_device_algorithms_on_cpu_stand_ins_over_gloo(gloo, nranks, tmp_path):
    out = gloo_suite(gloo, nranks, SUITE, tmp_path, 300, mpich_ranks=(), args=("--thin",))
    assert f"{nranks} ranks, 0 failures" in out and out.startswith("Gloo torch "), out
