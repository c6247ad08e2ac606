"""The non-blocking all-reduce at 1-4 ranks: mpi under each MPI, gloo as torchrun starts it."""
from __future__ import annotations

from pathlib import Path

import pytest

from test_gloo import _dump, clean_env, gloo, spawn  # noqa: F401 - gloo is a fixture

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_iallreduce_mpi(mpi, nranks):
    res = mpi.mpirun(nranks, [mpi.python, HERE / "iallreduce_suite.py"], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"iallreduce {nranks} ranks, 0 failures" in res.stdout


@pytest.mark.parametrize("nranks", [1, 3])
def test_iallreduce_gloo(gloo, nranks, tmp_path):
    ranks, _ = spawn(nranks, [gloo.python, HERE / "iallreduce_suite.py", "--backend", "gloo"],
                     clean_env(gloo.env()), tmp_path, timeout=120)
    assert [r.code for r in ranks] == [0] * nranks, _dump(ranks)
    assert f"iallreduce {nranks} ranks, 0 failures" in ranks[0].out, _dump(ranks)

