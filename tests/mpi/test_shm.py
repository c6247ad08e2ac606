"""The shared-memory all-reduce under real ranks, every dtype and op, 1-4 ranks."""
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_shm_allreduce(mpi, nranks):
    res = mpi.mpirun(nranks, [mpi.python, HERE / "shm_suite.py"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"shm: {nranks} ranks, 0 failures" in res.stdout
