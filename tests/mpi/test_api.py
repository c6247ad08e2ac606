"""The library API as a user's script meets it, at 3 ranks under each MPI (gloo once):
CPU tensors through every public buffer call; a rank whose call is refused or fails
leaves no other rank waiting; MPI under torchrun refused."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_cpu_tensors_through_the_public_calls(mpi, backend):
    """Under each MPI's launcher (gloo meets through it): 3 ranks, every buffer call."""
    if backend == "gloo" and mpi.name != "openmpi":
        pytest.skip("gloo does not use the MPI beside it: once is enough")
    res = mpi.mpirun(3, [mpi.python, HERE / "tensor_suite.py", "--backend", backend], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{backend}: tensors 3 ranks, 0 failures" in res.stdout


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_rank_refused_or_failing_leaves_no_rank_waiting(mpi, backend):
    """Refusals only the root can make, objects that cannot be pickled or folded, a second
    gloo communicator: every rank goes on (3 ranks)."""
    if backend == "gloo" and mpi.name != "openmpi":
        pytest.skip("gloo does not use the MPI beside it: once is enough")
    res = mpi.mpirun(3, [mpi.python, HERE / "api_suite.py", "--backend", backend], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{backend}: api 3 ranks, 0 failures" in res.stdout


def test_mpi_under_torchrun_is_refused(mpi, tmp_path):
    """torchrun starts MPI alone in each process: every one was rank 0 of 1, silently."""
    env = dict(mpi.env(), RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29999", TORCHELASTIC_RUN_ID="t")
    res = subprocess.run([mpi.python, "-c", "import ddlcomm; ddlcomm.init('mpi')"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode != 0
    assert "torchrun started 2 processes, but backend mpi sees 1" in res.stderr, res.stderr
    # bench and train join the backend the same way (each process ran a 1-rank job of its own)
    for command in (["bench", "--sizes", "4KiB", "--iters", "3"], ["train", "--iters", "1"]):
        res = subprocess.run([mpi.python, "-m", "ddlcomm", *command, "--backend", "mpi", "--db",
                              str(tmp_path / "t.db")], env=env, capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "ddlcomm: error: torchrun started 2 processes, but backend mpi sees 1" in res.stderr
