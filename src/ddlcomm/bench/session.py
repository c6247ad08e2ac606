"""Who owns a benchmark run: starting ranks, the in-rank main, and the finish.

Outside any launcher, ``ddlcomm bench`` is the *owner*: it creates the run row,
starts the ranks through the backend's launcher (they re-run the same command
line and find the run through ``DDLCOMM_RUN_ID``), waits, marks the run, then
prints the tables and writes the report.  Started by a launcher directly, rank
0 is the owner.  Either way a crash leaves every completed point stored and
the run marked failed.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..comm import registry
from ..errors import DdlcommError
from ..launch import mpirun, spawn
from ..launch.env import LaunchInfo
from ..results import Store, sysinfo
from .plan import BenchPlan
from .runner import PROGRESS_ENV, check_plan, fail_message, preflight, run_sweep
from .watchdog import Watchdog

RUN_ID_ENV = "DDLCOMM_RUN_ID"
EXIT_CHECK_FAILED = 1
EXIT_RANK_FAILED = 3


def _run_info(argv: Sequence[str], plan: BenchPlan) -> dict:
    info = sysinfo.collect()
    info["command"] = " ".join(["ddlcomm", *argv])
    info["config"] = plan.as_config()
    return info


# ---------------------------------------------------------------- owner side
def _program(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "ddlcomm", *argv]


def _containers(plan: BenchPlan):
    """The run's containers (removed on exit, also on failure), or none."""
    if not plan.containers:
        return contextlib.nullcontext(None)
    from ..launch.containers import ContainerSet
    return ContainerSet(plan.containers, plan.ranks or 2, plan.bind)


def _start_with_mpirun(plan: BenchPlan, argv: Sequence[str], env: dict) -> int:
    from ..launch import placement
    launcher = mpirun.find()
    with _containers(plan) as cset:
        cmd, extra = placement.mpirun_command(launcher, cset, plan.ranks or 2, _program(argv),
                                              plan.bind)
        return mpirun.run(cmd, launcher.environment({**env, **extra}))


def _start_with_spawn(plan: BenchPlan, argv: Sequence[str], env: dict) -> int:
    from ..launch import placement
    nranks = plan.ranks or 2
    with _containers(plan) as cset:
        return spawn.run(nranks, _program(argv), env, prefixes=placement.spawn_prefixes(cset, nranks, plan.bind),
                         master_addr=placement.master_addr(cset))


#: How to start ranks, by the launcher kinds backends name (see comm.registry).
STARTERS = {"mpirun": _start_with_mpirun, "spawn": _start_with_spawn}


def launch(plan: BenchPlan, argv: Sequence[str], db_path: Path,
           report_dir: Optional[Path]) -> int:
    """Own a run: create it, start the ranks, wait, finish. Returns the exit code."""
    launcher = registry.common_launcher(plan.backends)
    with Store(db_path) as store:
        run_id = store.create_run(_run_info(argv, plan))
    env = dict(os.environ, **{RUN_ID_ENV: str(run_id), "DDLCOMM_DB": str(db_path),
                              PROGRESS_ENV: "tty" if sys.stderr.isatty() else "plain"})
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        rc = STARTERS[launcher](plan, argv, env)
    except (KeyboardInterrupt, SystemExit):
        rc = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return finish(db_path, run_id, rc, report_dir, plan)


def _terminate(signum, frame):
    """SIGTERM to the owner: end the ranks and mark the run, as Ctrl-C does."""
    raise SystemExit(128 + signum)


def finish(db_path: Path, run_id: int, rc: int, report_dir: Optional[Path],
           plan: Optional[BenchPlan] = None) -> int:
    """Mark the run, print its tables, write its report; return the exit code."""
    from ..report import html, tables
    with Store(db_path) as store:
        points = store.points(run_id)
        failed = sum(p["check"] == "failed" for p in points)
        if rc == 0:
            store.finish_run(run_id, "failed" if failed else "passed",
                             f"{failed} points failed their check" if failed else None)
        else:
            why = "interrupted" if rc == 130 else f"ranks ended with exit code {rc}"
            # Points run in plan order, so the first one not stored is where it ended.
            if plan is not None:
                why += _where_it_ended(plan, points)
            print(f"ddlcomm: error: {why}", file=sys.stderr, flush=True)
            store.mark_failed_if_running(run_id, why)
        run = store.run(run_id)
    if points:
        print(tables.render_points(points), flush=True)
    summary = (f"run {run_id}: {len(points)} points, {len(points) - failed} passed"
               f"{f', {failed} FAILED' if failed else ''}; status {run['status']}")
    print(summary)
    print(f"database: {db_path}")
    if report_dir is not None and points:
        index = html.write_run_report(run, points, report_dir / f"run-{run_id}")
        print(f"report:   {index}")
    if rc:
        return rc
    return EXIT_CHECK_FAILED if failed else 0


def _where_it_ended(plan: BenchPlan, points: list) -> str:
    """Points run in plan order, so the first one not stored is where the ranks ended."""
    done = {(p["collective"], p["backend"], p["algorithm"], p["form"], p["bytes"]) for p in points}
    for spec in plan.points():
        if (spec.name, spec.backend, spec.algorithm, spec.form, spec.nbytes) not in done:
            return f" during {spec.label(len(plan.backends) > 1)}"
    return ""


# ---------------------------------------------------------------- rank side
def rank_main(plan: BenchPlan, argv: Sequence[str], info: LaunchInfo, db_path: Path,
              report_dir: Optional[Path]) -> int:
    """Run inside a launcher: measure, store (rank 0), and finish if we own the run."""
    # MPI first: a gloo backend started under mpirun rendezvouses through it.
    order = sorted(plan.backends, key=lambda b: b != "mpi")
    comms = {name: registry.create(name, local_rank=info.local_rank) for name in order}
    comm = comms[order[0]]
    state: dict = {"run_id": int(os.environ[RUN_ID_ENV]) if RUN_ID_ENV in os.environ else None}

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

    watchdog = Watchdog(plan.timeout_s, on_timeout)
    owner = state["run_id"] is None
    try:
        preflight(comms, plan, watchdog)
        check_plan(comms, plan)
        store = None
        if comm.rank == 0:
            store = Store(db_path)
            if owner:
                state["run_id"] = store.create_run(_run_info(argv, plan))
            store.update_run(state["run_id"], mpi_library=comm.library,
                             mpi_version=comm.library_version)
        if owner:
            state["run_id"] = comm.broadcast_object(state["run_id"], 0)
        failed = run_sweep(comms, plan, watchdog, store, state["run_id"])
        if store is not None:
            store.close()
        comm.barrier()
    except Exception as exc:  # noqa: BLE001 - any failure must end every rank
        message = fail_message(comm.rank, watchdog.current, exc)
        print(f"ddlcomm: error: {message}", file=sys.stderr, flush=True)
        record_failure(message)
        if comm.size > 1:
            comm.abort(EXIT_RANK_FAILED)
        return EXIT_RANK_FAILED if not isinstance(exc, DdlcommError) else 2
    for c in comms.values():
        c.close()
    if owner and comm.rank == 0:
        return finish(db_path, state["run_id"], 0, report_dir)
    return EXIT_CHECK_FAILED if failed else 0
