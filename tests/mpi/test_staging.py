"""The host-staged data path's plumbing under real ranks, CPU tensors standing in for the GPU.

Not a GPU test (see staging_suite.py): it checks which ranks copy, the data
arriving intact through the staging buffers and the separately timed and
stored d2h / collective / h2d phases, over Open MPI, MPICH and Gloo.  The
same path on a GPU is tests/gpu/test_gpu.py's.
"""
from pathlib import Path

import pytest

from test_gloo import gloo, gloo_suite     # noqa: F401 (gloo: a fixture); tests/mpi is on sys.path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "staging_suite.py"
pytest.importorskip("torch")


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_host_staged_plumbing(mpi, nranks):
    res = mpi.mpirun(nranks, [mpi.python, SUITE], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    assert f"staging: {nranks} ranks, 0 failures" in res.stdout


@pytest.mark.mpi
def test_host_staged_plumbing_over_gloo(gloo, tmp_path):
    out = gloo_suite(gloo, 3, SUITE, tmp_path, 300, mpich_ranks=())
    assert "staging: 3 ranks, 0 failures" in out
