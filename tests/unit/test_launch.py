"""Tests of launcher detection and the mpirun command line (pure parts of ddlcomm.launch)."""
from __future__ import annotations

import pytest

from ddlcomm.launch import mpirun
from ddlcomm.launch.env import LaunchInfo, detect
from ddlcomm.launch.mpirun import MPILauncher, family_of


@pytest.mark.parametrize("env, want", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     LaunchInfo("openmpi", 3, 8, 1)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2"}, LaunchInfo("hydra", 2, 4, 2)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "0"}, LaunchInfo("hydra", 2, 4, 0)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, LaunchInfo("hydra", 1, 2, 0)),     # local rank 0 by default
    ({"PMIX_RANK": "5", "PMIX_SIZE": "6", "PMIX_LOCAL_RANK": "1"}, LaunchInfo("pmix", 5, 6, 1)),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3", "SLURM_STEP_ID": "0"},
     LaunchInfo("slurm", 7, 16, 3)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"},
     LaunchInfo("torchrun", 1, 2, 1)),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "node0"}, LaunchInfo("torchrun", 1, 2, 0)),
    # Open MPI wins over the Slurm variables of the allocation it runs in
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "0",
      "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}, LaunchInfo("openmpi", 0, 2, 0)),
])
def test_detect(env, want):
    assert detect(env) == want


@pytest.mark.parametrize("env", [
    {},
    {"RANK": "0"},                                           # a stray RANK
    {"RANK": "0", "WORLD_SIZE": "4"},                        # ... even with WORLD_SIZE
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"},              # batch script, not a job step
    {"PMI_RANK": "0"},                                       # size missing
    {"OMPI_COMM_WORLD_RANK": "one", "OMPI_COMM_WORLD_SIZE": "2"},
    {"PMI_RANK": "0", "PMI_SIZE": ""},
])
def test_detect_none(env):
    assert detect(env) is None


def test_detect_skips_a_launcher_with_non_integer_values():
    env = {"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2",
           "PMI_RANK": "1", "PMI_SIZE": "2"}
    assert detect(env) == LaunchInfo("hydra", 1, 2, 0)


def test_detect_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("PMIX_RANK", "0")
    monkeypatch.setenv("PMIX_SIZE", "3")
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert detect() == LaunchInfo("pmix", 0, 3, 0)


@pytest.mark.parametrize("text, family", [
    ("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/", "openmpi"),
    ("mpirun (OpenRTE) 4.1.6", "openmpi"),
    ("prterun (PMIx Reference RunTime Environment (PRRTE)) 3.0.6", "openmpi"),
    ("HYDRA build details:\n    Version:                                 5.0.2\n"
     "    Release Date:                            Mon Feb 10 2025", "hydra"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n"
     "Copyright 2003-2023, Intel Corporation.\nHYDRA build details:", "hydra"),
    ("", "unknown"),
    ("srun: command not found", "unknown"),
])
def test_family_of(text, family):
    assert family_of(text) == family


@pytest.mark.parametrize("family", ["openmpi", "hydra", "unknown"])
@pytest.mark.parametrize("ranks, cores", [(2, 4), (4, 4), (5, 4), (64, 1)])
def test_command(family, ranks, cores):
    cmd = MPILauncher("/env/bin/mpirun", family).command(ranks, ["python", "-m", "x"], cores=cores)
    assert cmd[:3] == ["/env/bin/mpirun", "-n", str(ranks)]
    assert cmd[-3:] == ["python", "-m", "x"]
    assert ("--oversubscribe" in cmd) == (family == "openmpi" and ranks > cores)
    if "--oversubscribe" in cmd:
        assert cmd[3:-3] == ["--oversubscribe", "--bind-to", "none"]
    else:
        assert len(cmd) == 6


@pytest.mark.parametrize("euid", [0, 1000])
@pytest.mark.parametrize("family", ["openmpi", "hydra", "unknown"])
def test_environment(monkeypatch, family, euid):
    monkeypatch.setattr(mpirun.os, "geteuid", lambda: euid, raising=False)
    base = {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "0"}
    env = MPILauncher("mpirun", family).environment(base)
    root_openmpi = family == "openmpi" and euid == 0
    assert env["PATH"] == "/bin"
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "0"                  # the caller's choice is kept
    assert ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM" in env) == root_openmpi
    assert base == {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "0"}   # not modified


def test_environment_adds_both_root_variables(monkeypatch):
    monkeypatch.setattr(mpirun.os, "geteuid", lambda: 0, raising=False)
    env = MPILauncher("mpirun", "openmpi").environment({})
    assert env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert MPILauncher("mpirun", "hydra").environment({}) == {}


def test_oversubscribed_mpich_throttles_progress():
    hydra, ompi = MPILauncher("mpiexec", "hydra"), MPILauncher("mpirun", "openmpi")
    assert hydra.oversubscribed(3, cores=2) and not hydra.oversubscribed(2, cores=2)
    assert hydra.environment({}, oversubscribed=True) == mpirun.HYDRA_OVERSUBSCRIBED
    mine = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}
    assert hydra.environment(mine, oversubscribed=True)["MPIR_CVAR_CH4_PROGRESS_THROTTLE"] == "0"
    assert "MPIR_CVAR_CH4_PROGRESS_THROTTLE" not in ompi.environment({}, oversubscribed=True)
