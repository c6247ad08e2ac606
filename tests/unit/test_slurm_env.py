"""Pure parts of ddlcomm under Slurm: host lists, the gloo rendezvous of an srun step,
the local cluster's slurm.conf, and the placement recorded across hosts."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ddlcomm.bench.runner import placement_fields
from ddlcomm.comm import torchdist
from ddlcomm.launch import placement
from ddlcomm.launch.env import LaunchInfo, SLURM_PORT_BASE, SLURM_PORT_SPAN, first_host, slurm_rendezvous
from ddlcomm.launch.slurm_cluster import slurm_conf

STEP = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "ddlc-9-0-c[0-1]",
        "SLURM_PROCID": "1", "SLURM_NTASKS": "4"}


@pytest.mark.parametrize("nodelist, want", [
    ("node07", "node07"),
    ("node[07-09,12],gpu3", "node07"),
    ("gpu3,node[1-2]", "gpu3"),
    ("rack[2-3]-n[001-004]", "rack2-n001"),
    ("ddlc-4135-0-c[0-1]", "ddlc-4135-0-c0"),
    ("a[5,1-3]", "a5"),
])
def test_first_host(nodelist, want):
    assert first_host(nodelist) == want


def test_slurm_rendezvous():
    host, port = slurm_rendezvous(STEP)
    assert host == "ddlc-9-0-c0"
    assert SLURM_PORT_BASE <= port < SLURM_PORT_BASE + SLURM_PORT_SPAN
    assert port == slurm_rendezvous(dict(STEP))[1]                    # every rank agrees
    assert port != slurm_rendezvous({**STEP, "SLURM_STEP_ID": "4"})[1]  # the next step moves
    # the allocation's node list when the step's is missing
    no_step_list = {k: v for k, v in STEP.items() if k != "SLURM_STEP_NODELIST"}
    assert slurm_rendezvous({**no_step_list, "SLURM_NODELIST": "n[3-4]"})[0] == "n3"
    assert slurm_rendezvous({k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}) is None
    assert slurm_rendezvous(no_step_list) is None
    assert slurm_rendezvous({}) is None


@pytest.mark.parametrize("info, env, want", [
    (LaunchInfo("slurm", 1, 4, 1), STEP, True),
    (LaunchInfo("hydra", 1, 4, 1), STEP, True),           # srun --mpi=pmi2 sets PMI_RANK too
    (LaunchInfo("openmpi", 1, 4, 1), STEP, False),        # mpirun's ranks in its daemons' step
    (LaunchInfo("hydra", 1, 8, 1), STEP, False),          # ranks are not the step's tasks
    (LaunchInfo("torchrun", 1, 4, 1), {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"},
     False),
])
def test_srun_tasks(monkeypatch, info, env, want):
    for key in STEP:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert torchdist._srun_tasks(info) is want


def test_slurm_conf():
    conf = slurm_conf(Path("/run/x"), "vm", "10.231.5.1", 6999, Path("/run/x/munge/sock"),
                      [("ddlc-1-0-c0", "10.231.5.2"), ("ddlc-1-0-c1", "10.231.5.3")], 2, 1024)
    lines = conf.splitlines()
    for want in ("SlurmctldHost=vm(10.231.5.1)", "SlurmctldPort=6999",
                 "AuthInfo=socket=/run/x/munge/sock", "ProctrackType=proctrack/linuxproc",
                 "TaskPlugin=task/none", "MpiDefault=pmi2", "SlurmdSpoolDir=/run/x/spool-%n",
                 "KillOnBadExit=1",
                 "NodeName=ddlc-1-0-c1 NodeAddr=10.231.5.3 CPUs=2 RealMemory=1024 State=UNKNOWN"):
        assert want in lines, want
    assert sum(line.startswith("PartitionName=ddlc ") for line in lines) == 1


def test_placement_across_hosts():
    plan = SimpleNamespace(containers=0, memory=None, bind="none")    # what placement reads
    hosts = ["n0", "n0", "n1", "n1"]
    fields = placement_fields(plan, 4, ["0", "1", "0", "1"], hosts)
    assert fields["hosts"] == hosts
    assert fields["transport"]["0-1"] == "shared memory"
    assert fields["transport"]["1-2"] == fields["transport"]["0-3"] == "network"
    one_host = placement_fields(plan, 2, None, ["n0", "n0"])
    assert one_host["transport"] == {"0-1": "shared memory"} and "cpus" not in one_host
    assert placement.transport(0, 1, "network") == "network"
