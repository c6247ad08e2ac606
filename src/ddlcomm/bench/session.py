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
import sys
from functools import partial
from pathlib import Path
from typing import Optional, Sequence

from ..collectives import COLLECTIVES
from ..comm import registry
from ..dtypes import get_dtype
from ..launch import commands, mpirun, spawn
from ..launch.containers import ContainerSet
from ..launch.env import LaunchInfo
from ..outputs import print_report
from ..report import html, tables
from ..results import Store
from .plan import BenchPlan
from .runner import PROGRESS_ENV, check_plan, preflight, run_sweep
from .runs import (EXIT_CHECK_FAILED, exit_code, own, program, rank_run, run_info, run_lost, settle,
                   starting)


# ---------------------------------------------------------------- owner side
def _containers(plan: BenchPlan):
    """The run's containers (removed on exit, also on failure), or none."""
    if not plan.containers:
        return contextlib.nullcontext(None)
    return ContainerSet(plan.containers, plan.ranks, plan.bind)


def _start_with_mpirun(plan: BenchPlan, argv: Sequence[str], env: dict) -> int:
    launcher = mpirun.find()
    with _containers(plan) as cset:
        cmd, extra = commands.mpirun_command(launcher, cset, plan.ranks, program(argv),
                                             plan.bind)
        return launcher.exit_code(mpirun.run(cmd, launcher.environment({**extra, **env})))


def _start_with_spawn(plan: BenchPlan, argv: Sequence[str], env: dict) -> int:
    with _containers(plan) as cset:
        return spawn.run(plan.ranks, program(argv), env,
                         prefixes=commands.spawn_prefixes(cset, plan.ranks, plan.bind),
                         master_addr=commands.master_addr(cset))


#: How to start ranks, by the launcher kinds backends name (see comm.registry).
STARTERS = {"mpirun": _start_with_mpirun, "spawn": _start_with_spawn}


def launch(plan: BenchPlan, argv: Sequence[str], db_path: Path,
           report_dir: Optional[Path]) -> int:
    """Own a run: create it, start the ranks, wait, finish. Returns the exit code.
    (``plan.ranks`` is set: outside a launcher the plan is resolved with its default.)"""
    launcher = registry.common_launcher(plan.backends)
    run_id, rc = own(db_path, run_info(argv, plan.as_config()),
                     {PROGRESS_ENV: "tty" if sys.stderr.isatty() else "plain"},
                     lambda env: STARTERS[launcher](plan, argv, env))
    return finish(db_path, run_id, rc, report_dir, plan)


def finish(db_path: Path, run_id: int, rc: int, report_dir: Optional[Path],
           plan: Optional[BenchPlan] = None) -> int:
    """Mark the run, print its tables, write its report; return the exit code."""
    with Store(db_path) as store:
        points, failed, run = settle(
            store, run_id, rc, lambda points: _where_it_ended(plan, points) if plan else "")
    if points:
        print(tables.render_points(points), flush=True)
    for warning in tables.run_warnings(run):
        print(f"warning: {warning}", flush=True)
    passed = sum(p["check"] == "passed" for p in points)
    skipped = sum(p["check"] == "skipped" for p in points)
    print(f"run {run_id}: {len(points)} points, {passed} passed"
          f"{f', {skipped} not checked' if skipped else ''}"
          f"{f', {failed} FAILED' if failed else ''}; status {run['status']}")
    print(f"database: {db_path}")
    if report_dir is not None and points:
        print_report(partial(html.write_run_report, run, points), report_dir / f"run-{run_id}",
                     run_id)
    return exit_code(rc, failed, run)


def _where_it_ended(plan: BenchPlan, points: list) -> str:
    """Points run in plan order, so the first one not stored is where the ranks ended; each
    is looked for as its record stores it (a collective's bytes in whole elements at the
    run's ranks, a barrier's none; the data path among the facts, host where none)."""
    done = {(p["collective"], p["backend"], p["algorithm"], p["form"],
             p["extra"].get("path", "host"), p["bytes"]) for p in points}
    dtype = get_dtype(plan.dtype)
    for spec in plan.points(plan.ranks):
        nbytes = spec.nbytes if spec.kind == "workload" else \
            COLLECTIVES[spec.name].count_for(spec.nbytes, dtype, plan.ranks) * dtype.itemsize
        if (spec.name, spec.backend, spec.algorithm, spec.form, spec.path, nbytes) not in done:
            return f" during {spec.label(len(plan.backends) > 1)}"
    return ""


# ---------------------------------------------------------------- rank side
def rank_main(plan: BenchPlan, argv: Sequence[str], info: LaunchInfo, db_path: Path,
              report_dir: Optional[Path]) -> int:
    """Run inside a launcher: measure, store (rank 0), and finish if we own the run."""
    order = registry.start_order(plan.backends)
    with starting(db_path):
        comms = {name: registry.join(name, info) for name in order}
    comm = comms[order[0]]

    def prepare(watchdog) -> None:
        preflight(comms, plan, watchdog)
        check_plan(comms, plan)

    result = rank_run(comm, db_path, plan.timeout_s, lambda: run_info(argv, plan.as_config()),
                      prepare, lambda watchdog, store, run_id: run_sweep(comms, plan, watchdog,
                                                                         store, run_id))
    if result.code is not None:
        return result.code
    for c in comms.values():
        c.close()
    if result.lost and result.owner:
        raise run_lost(db_path, result.run_id)
    if result.owner and comm.rank == 0:
        return finish(db_path, result.run_id, 0, report_dir)
    # under a launcher of yours every rank says the checks; under ddlcomm's own the owner
    # does, from the points (a rank's 1 would read to it as a rank that failed)
    return EXIT_CHECK_FAILED if result.failed and result.owner else 0
