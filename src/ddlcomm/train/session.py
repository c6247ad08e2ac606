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

import os
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..bench.watchdog import Watchdog
from ..comm import registry
from ..errors import DdlcommError
from ..launch import mpirun, spawn
from ..results import Store, sysinfo
from .config import TrainJob

RUN_ID_ENV = "DDLCOMM_RUN_ID"
JOB_ENV = "DDLCOMM_TRAIN_JOB"
EXIT_CHECK_FAILED = 1
EXIT_RANK_FAILED = 3


def run_info(argv: Sequence[str], config: dict) -> dict:
    info = sysinfo.collect()
    info["command"] = " ".join(["ddlcomm", *argv])
    info["config"] = config
    return info


def _program(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "ddlcomm", *argv]


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def start(job: TrainJob, argv: Sequence[str], env: dict) -> int:
    """Start ``job.ranks`` ranks of this command with ``env``; their exit code."""
    backends = [job.backend] + (["gloo"] if job.needs_gloo else [])
    launcher = registry.common_launcher(backends)
    env = dict(env, **{JOB_ENV: job.to_json()})
    if launcher == "mpirun":
        found = mpirun.find()
        return mpirun.run(found.command(job.ranks, _program(argv)), found.environment(env))
    return spawn.run(job.ranks, _program(argv), env)


def launch(jobs: list[TrainJob], argv: Sequence[str], db_path: Path, config: dict,
           report_dir: Optional[Path]) -> int:
    """Own a run: create it, run every job in turn, add scaling points, finish."""
    with Store(db_path) as store:
        run_id = store.create_run(run_info(argv, config))
    env = dict(os.environ, **{RUN_ID_ENV: str(run_id), "DDLCOMM_DB": str(db_path)})
    previous = signal.signal(signal.SIGTERM, _terminate)
    rc = 0
    try:
        for job in jobs:
            print(f"== {job.ranks} rank{'s' if job.ranks > 1 else ''}, backend {job.backend}: "
                  f"{len(job.configs)} configuration{'s' if len(job.configs) > 1 else ''}",
                  file=sys.stderr, flush=True)
            rc = start(job, argv, env)
            if rc != 0:
                break
    except (KeyboardInterrupt, SystemExit):
        rc = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return finish(db_path, run_id, rc, report_dir, scaling=len(jobs) > 1)


def finish(db_path: Path, run_id: int, rc: int, report_dir: Optional[Path], scaling: bool) -> int:
    """Add scaling points, mark the run, print the summary, write the report."""
    from ..report import train as train_report
    from .scaling import scaling_points
    with Store(db_path) as store:
        points = store.points(run_id)
        if rc == 0 and scaling:
            for rec in scaling_points(points):
                store.add_point(run_id, rec)
            points = store.points(run_id)
        failed = sum(p["check"] == "failed" for p in points)
        if rc == 0:
            store.finish_run(run_id, "failed" if failed else "passed",
                             f"{failed} points failed their check" if failed else None)
        else:
            why = "interrupted" if rc == 130 else f"ranks ended with exit code {rc}"
            print(f"ddlcomm: error: {why}", file=sys.stderr, flush=True)
            store.mark_failed_if_running(run_id, why)
        run = store.run(run_id)
    if points:
        print(train_report.render_summary(points), flush=True)
    print(f"run {run_id}: {len(points)} points, status {run['status']}")
    print(f"database: {db_path}")
    if report_dir is not None and points:
        print(f"report:   {train_report.write_train_report(run, points, report_dir / f'run-{run_id}')}")
    if rc:
        return rc
    return EXIT_CHECK_FAILED if failed else 0


def rank_main(job: TrainJob, argv: Sequence[str], db_path: Path,
              report_dir: Optional[Path], config: dict) -> int:
    """Inside the ranks: run every configuration of ``job``; rank 0 stores the points."""
    from ..launch.env import detect
    from .ddp import run_ddp
    from .loop import progress, run_config
    info = detect()
    comm = registry.create(job.backend, local_rank=info.local_rank if info else None)
    gloo = comm
    if job.needs_gloo:
        gloo = registry.create("gloo", local_rank=comm.local_rank)
    state: dict = {"run_id": int(os.environ[RUN_ID_ENV]) if RUN_ID_ENV in os.environ else None}
    owner = state["run_id"] is None

    def record_failure(message: str) -> None:
        if state["run_id"] is not None and db_path.exists():
            try:
                with Store(db_path) as store:
                    store.mark_failed_if_running(state["run_id"], message)
            except Exception:          # best effort: the rank is going down anyway
                pass

    def on_timeout(what: str, limit: float) -> None:
        message = f"rank {comm.rank}: {what} did not finish within {limit:g} s"
        print(f"ddlcomm: error: {message}", file=sys.stderr, flush=True)
        record_failure(message)
        os._exit(EXIT_RANK_FAILED)

    watchdog = Watchdog(job.timeout_s, on_timeout)
    try:
        from ..errors import RankFailure
        if comm.size != job.ranks:
            raise RankFailure(f"the launcher started {comm.size} ranks but --ranks {job.ranks} "
                              "was asked", "start as many ranks as --ranks says, or leave it out")
        store = None
        if comm.rank == 0:
            store = Store(db_path)
            if owner:
                state["run_id"] = store.create_run(run_info(argv, config))
            store.update_run(state["run_id"], mpi_library=comm.library,
                             mpi_version=comm.library_version)
        if owner:
            state["run_id"] = comm.broadcast_object(state["run_id"], 0)
        for n, cfg in enumerate(job.configs, 1):
            progress(comm.rank, f"[{n}/{len(job.configs)}] {comm.size} rank{'s' if comm.size > 1 else ''} "
                                f"{comm.name}: {cfg.label()}")
            with watchdog.guard(f"training {cfg.label()}"):
                records = run_ddp(comm, gloo, cfg) if cfg.peer == "ddp" else run_config(comm, cfg)
            for rec in records:
                store.add_point(state["run_id"], rec)
        if store is not None:
            store.close()
        comm.barrier()
    except Exception as exc:  # noqa: BLE001 - any failure must end every rank
        where = f" during {watchdog.current}" if watchdog.current else ""
        text = str(exc) if isinstance(exc, DdlcommError) else f"{type(exc).__name__}: {exc}"
        message = f"rank {comm.rank}{where}: {text}"
        print(f"ddlcomm: error: {message}", file=sys.stderr, flush=True)
        record_failure(message)
        if comm.size > 1:
            comm.abort(EXIT_RANK_FAILED)
        return EXIT_RANK_FAILED if not isinstance(exc, DdlcommError) else 2
    if gloo is not comm:
        gloo.close()
    comm.close()
    if owner and comm.rank == 0:
        return finish(db_path, state["run_id"], 0, report_dir, scaling=False)
    return 0                         # failed checks are in the points; the owner counts them
