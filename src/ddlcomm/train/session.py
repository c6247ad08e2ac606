"""Owning a training run: one launch per rank count, the in-rank main, scaling, the finish.

Outside a launcher ``ddlcomm train`` is the owner, as ``ddlcomm bench`` is:
it creates the run, then for each ``--ranks`` value starts that many ranks
(through the environment's mpirun when the backend needs MPI, else as local
processes with torchrun's environment) running the same command line, hands
them their configurations in ``DDLCOMM_TRAIN_JOB`` and the run in
``DDLCOMM_RUN_ID``; rank 0 of each launch stores its points as they complete.
Then the owner adds the scaling points (speed-up and efficiency against one
worker, measured and predicted), marks the run, prints a table and writes
the report.  Under a launcher the ranks run the configurations for the size
they were given and rank 0 owns the run.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from functools import partial
from pathlib import Path
from typing import Optional, Sequence

from ..bench.runs import (exit_code, own, program, rank_run, ranks_ended_it, run_info, run_lost, settle,
                          starting)
from ..comm import registry
from ..errors import EveryRankError, UsageError
from ..launch import commands, mpirun, spawn
from ..launch.env import detect
from ..outputs import print_report
from ..report import train as train_report
from ..report.tables import run_warnings
from ..results import Store
from ..units import counted
from .config import TrainJob, TrainOptions, plan_jobs
from .ddp import run_ddp
from .fits import check_batch_norm, check_hosts
from .loop import progress, run_config
from .scaling import scaling_points

JOB_ENV = "DDLCOMM_TRAIN_JOB"


def main(options: TrainOptions, argv: Sequence[str], db_path: Path, report_dir: Optional[Path],
         tag: Optional[str]) -> int:
    """``ddlcomm train``: own the run, or (under a launcher) be one of its ranks."""
    info = detect()
    registry.check(options.backend)
    if info is not None and JOB_ENV in os.environ:
        job = TrainJob.from_json(os.environ[JOB_ENV])
        return rank_main(job, argv, db_path, report_dir, config={})
    jobs = plan_jobs(options, info.size if info else None)
    if importlib.util.find_spec("torch") is None:
        raise UsageError("ddlcomm train needs PyTorch", "pip install 'ddlcomm[torch]'")
    config = {"backend": options.backend, "ranks": [j.ranks for j in jobs],
              "configs": sorted({c.label() for j in jobs for c in j.configs}),
              "timeout_s": jobs[0].timeout_s,
              "extra": {"tag": tag} if tag else {}}
    if info is not None:
        return rank_main(jobs[0], argv, db_path, report_dir, config)
    return launch(jobs, argv, db_path, config, report_dir)


def _start_with_mpirun(job: TrainJob, argv: Sequence[str], env: dict) -> int:
    found = mpirun.find()
    return found.exit_code(mpirun.run(*commands.on_host(found, job.ranks, program(argv), env)))


def _start_with_spawn(job: TrainJob, argv: Sequence[str], env: dict) -> int:
    return spawn.run(job.ranks, program(argv), env)


#: How to start the ranks, by the launcher kind the backends name (see comm.registry).
STARTERS = {"mpirun": _start_with_mpirun, "spawn": _start_with_spawn}


def start(job: TrainJob, argv: Sequence[str], env: dict) -> int:
    """Start ``job.ranks`` ranks of this command with ``env``; their exit code."""
    backends = [job.backend] + (["gloo"] if job.needs_gloo else [])
    return STARTERS[registry.common_launcher(backends)](job, argv,
                                                       dict(env, **{JOB_ENV: job.to_json()}))


def launch(jobs: list[TrainJob], argv: Sequence[str], db_path: Path, config: dict,
           report_dir: Optional[Path]) -> int:
    """Own a run: create it, run every job in turn, add scaling points, finish."""
    def start_all(env: dict) -> int:
        for job in jobs:
            print(f"== {counted(job.ranks, 'rank')}, backend {job.backend}: "
                  f"{counted(len(job.configs), 'configuration')}",
                  file=sys.stderr, flush=True)
            rc = start(job, argv, env)
            if rc != 0 or ranks_ended_it(env):      # (0 and ended: the ranks refused; own says so)
                return rc
        return 0

    run_id, rc = own(db_path, run_info(argv, config), {}, start_all)
    return finish(db_path, run_id, rc, report_dir, scaling=len(jobs) > 1)


def finish(db_path: Path, run_id: int, rc: int, report_dir: Optional[Path], scaling: bool) -> int:
    """Add scaling points, mark the run, print the summary, write the report."""
    with Store(db_path) as store:
        if rc == 0 and scaling:
            for rec in scaling_points(store.points(run_id)):
                store.add_point(run_id, rec)
        points, failed, run = settle(store, run_id, rc)
    if points:
        print(train_report.render_summary(points), flush=True)
    for warning in run_warnings(run):           # as bench's end says them (results show did)
        print(f"warning: {warning}", flush=True)
    print(f"run {run_id}: {len(points)} points, status {run['status']}")
    print(f"database: {db_path}")
    if report_dir is not None and points:
        print_report(partial(train_report.write_train_report, run, points),
                     report_dir / f"run-{run_id}", run_id)
    return exit_code(rc, failed, run)


def rank_main(job: TrainJob, argv: Sequence[str], db_path: Path,
              report_dir: Optional[Path], config: dict) -> int:
    """Inside the ranks: run every configuration of ``job``; rank 0 stores the points."""
    info = detect()
    with starting(db_path):
        comm = registry.join(job.backend, info)
        gloo = registry.create("gloo", local_rank=comm.local_rank) if job.needs_gloo else comm

    def prepare(watchdog) -> None:
        if comm.size != job.ranks:
            raise EveryRankError(f"the launcher started {comm.size} ranks but --ranks {job.ranks} "
                                 "was asked", "start as many ranks as --ranks says, or leave it out")
        check_batch_norm(job.configs)
        check_hosts(comm, job.configs)

    def body(watchdog, store, run_id) -> int:
        for n, cfg in enumerate(job.configs, 1):
            progress(comm.rank, f"[{n}/{len(job.configs)}] {counted(comm.size, 'rank')} "
                                f"{comm.name}: {cfg.label()}")
            with watchdog.guard(f"training {cfg.label()} on {counted(comm.size, 'rank')}"):
                records = run_ddp(comm, gloo, cfg) if cfg.peer == "ddp" else run_config(comm, cfg)
            for rec in records:               # rank 0's (the others return none)
                store.add_point(run_id, rec)
        return 0                              # failed checks are in the points; the owner counts them

    result = rank_run(comm, db_path, job.timeout_s, lambda: run_info(argv, config), prepare, body)
    if result.code is not None:
        return result.code
    if gloo is not comm:
        gloo.close()
    comm.close()
    if result.lost and result.owner:
        raise run_lost(db_path, result.run_id)
    if result.owner and comm.rank == 0:
        return finish(db_path, result.run_id, 0, report_dir, scaling=False)
    return 0
