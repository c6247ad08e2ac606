"""Rank-side check of training through host-staged wires, the CPU standing in for a GPU.

Run under a launcher (``mpirun -n N python train_wire_suite.py``), N >= 2.
The buckets are CPU tensors, but handed to the backend as a GPU run hands
them to a host-only MPI (:class:`ddlcomm.train.wire.StagedWire`: a host copy
pushed before each call and pulled after it), through the real training
loop: all-reduce with overlap off and on, and the parameter server.  This
tests the staging plumbing with a real MPI, not a GPU.  Exit 0 when every
configuration passed its checks (rank 0 prints "N ranks, 0 failures").
"""
from __future__ import annotations

import sys

import torch

import ddlcomm
from ddlcomm.train.config import TrainConfig
from ddlcomm.train.device import placed
from ddlcomm.train.loop import run_config
from ddlcomm.train.wire import StagedWire

from suite_kit import conclude, guarded

CONFIGS = [TrainConfig("smallcnn", batch=8, iters=6, warmup=1, comm_reps=2, fusion=16 << 10),
           TrainConfig("smallcnn", overlap=True, batch=8, iters=6, warmup=1, comm_reps=2,
                       fusion=16 << 10),
           TrainConfig("smallcnn", arch="ps", batch=8, iters=6, warmup=1, comm_reps=2)]


def main() -> int:
    comm = ddlcomm.init("mpi")
    return guarded(comm, lambda: run_suite(comm))


def run_suite(comm) -> int:
    failures = []
    for cfg in CONFIGS:
        records = run_config(comm, cfg, placed(torch.device("cpu")), StagedWire)
        if comm.rank != 0:
            continue
        flat = [{**r, **r["extra"]} for r in records]
        its = [r for r in flat if r["phase"] == "iteration"]
        if len(its) != 1:
            failures.append(f"{cfg.label()}: {len(its)} iteration records")
            continue
        it = its[0]
        what = f"{cfg.label()}: "
        if it["wire"] != "staged" or it["buckets"] < 1:
            failures.append(what + f"wire {it['wire']}, {it['buckets']} buckets")
        if it["check"] != "passed" or it["replicas_identical"] is not True:
            failures.append(what + f"check {it['check']}, replicas {it['replicas_identical']}")
        if cfg.overlap and not it["overlap_in_backward"]:
            failures.append(what + "the hooks did not start the all-reduces")
    return conclude(comm, failures, lambda n, _: f"train wires {comm.size} ranks, {n} failures")


if __name__ == "__main__":
    sys.exit(main())
