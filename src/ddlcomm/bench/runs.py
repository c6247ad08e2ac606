"""Owning a run, on both sides of the launcher: what ``ddlcomm bench`` and ``ddlcomm train`` share.

Outside any launcher the command is the *owner*: :func:`own` creates the run
row, starts the ranks (they re-run the same command line and find the run
through ``DDLCOMM_RUN_ID``), and turns SIGTERM and Ctrl-C into a clean end;
:func:`settle` marks the run from its points and the ranks' exit code.  In
the ranks, :func:`rank_run` holds the run (created by rank 0 when no owner
did), a per-rank watchdog, and the rule that any failure ends every rank and
leaves the run marked failed with the rank's message.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from ..errors import DdlcommError, EveryRankError, RunLost, first_line
from ..launch import processes, shmclean
from ..machine import load
from ..results import Store, sysinfo
from ..results.store import DB_ENV, rescue_path
from ..units import counted, format_size
from .interrupts import OnInterrupt
from .watchdog import Watchdog

RUN_ID_ENV = "DDLCOMM_RUN_ID"
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_RANK_FAILED = 3
EXIT_INTERRUPTED = 130


def owners_run() -> Optional[int]:
    """In a rank, the run its owner made (:data:`RUN_ID_ENV`); None under a launcher of yours."""
    return int(os.environ[RUN_ID_ENV]) if RUN_ID_ENV in os.environ else None


def program(argv: Sequence[str]) -> list[str]:
    """This command again, as each rank runs it."""
    return [sys.executable, "-m", "ddlcomm", *argv]


def most_ranks(config: dict) -> Optional[int]:
    """The largest rank count a run's configuration names (``ranks``: a count or a list), else None."""
    ranks = config.get("ranks")
    counts = ranks if isinstance(ranks, (list, tuple)) else [ranks]
    counts = [r for r in counts if isinstance(r, int) and not isinstance(r, bool)]
    return max(counts) if counts else None


def run_info(argv: Sequence[str], config: dict) -> dict:
    """The run row: the machine (with its GPUs shared by the run's most ranks),
    the command line and its resolved configuration."""
    info = sysinfo.collect(most_ranks(config))
    info["command"] = ["ddlcomm", *argv]          # stored shell-quoted (Store)
    info["config"] = config
    return info


#: What the owner ends its ranks on, beside Ctrl-C: kill, and a closed terminal or ssh session.
OWNER_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


#: run id -> the signal its owner (this process) was sent while the ranks ran, for settle().
_OWNER_SIGNAL: dict[int, str] = {}


class _Signals:
    """The owner's handler while its ranks run: SIGTERM or SIGHUP end the ranks and mark the
    run as Ctrl-C does (the launcher is sent the same signal:
    :func:`ddlcomm.launch.processes.forwarded`); every signal is kept, to be named."""

    def __init__(self) -> None:
        self.got: list[int] = []

    def __call__(self, signum, frame):
        self.got.append(signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)


def own(db_path: Path, info: dict, env: dict, start: Callable[[dict], int]) -> tuple[int, int]:
    """Create the run and call ``start(environment)`` to run the ranks; (run id, exit code).

    The environment is ours plus ``env``, the run id and the database.
    SIGTERM, SIGHUP and Ctrl-C while the ranks run give exit code 130; after any
    abnormal end, what the ranks left is cleaned up (:func:`_clean_up`).  How busy the
    machine was while they ran is stored with the run (``load``; the ranks are our
    children, so their CPU time is known).  RunLost where the database file was removed
    or replaced meanwhile.
    """
    with Store(db_path) as opened:
        run_id = opened.create_run(info)
    env = dict(os.environ, **env, **{RUN_ID_ENV: str(run_id), DB_ENV: str(db_path)})
    signals = _Signals()
    # Ctrl-C only where it interrupts (a job started in the background ignores it)
    interruptible = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ctrl_c = (signal.SIGINT,) if interruptible else ()
    previous = {sig: signal.signal(sig, signals) for sig in (*OWNER_SIGNALS, *ctrl_c)}
    before, segments = load.snapshot(), shmclean.names()
    had = processes.adopt_orphans()     # children of the caller's own: not the launch's
    try:
        rc = start(env)
        if rc == 0 and ranks_ended_it(env):
            rc = EXIT_USAGE                 # every rank refused alike, rank 0 said why
    except (KeyboardInterrupt, SystemExit):
        rc = EXIT_INTERRUPTED
    except DdlcommError as exc:         # no rank started (no launcher, no containers)
        with Store(db_path) as store:
            store.end_if_running(run_id, "failed", f"starting the ranks failed: {exc}")
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        processes.adopt_orphans(False)  # those orphaned while the ranks ran are ours already
    processes.reap_ended(had)           # the launcher's orphans: their CPU time is the run's
    if rc:
        _clean_up(segments, had)
    if opened.moved():                  # do not make a new, empty one in its place
        raise run_lost(db_path, run_id)
    try:
        record_load(db_path, run_id, before, most_ranks(info.get("config") or {}), own=True)
    except DdlcommError as exc:         # a full disk: the run must still be settled and said
        print(f"warning: the run's load record was not stored: {exc}", file=sys.stderr, flush=True)
    if signals.got and rc == EXIT_INTERRUPTED:
        _OWNER_SIGNAL[run_id] = processes.signal_name(signals.got[0]) or f"signal {signals.got[0]}"
    return run_id, rc


def run_lost(db_path: Path, run_id: int) -> RunLost:
    """The error of a run whose database file was removed or replaced while it ran, naming
    the copy rank 0 saved (:func:`rescue_path`) where there is one."""
    saved = rescue_path(db_path, run_id)
    return RunLost(f"{db_path} was removed or replaced while run {run_id} ran"
                   + (f": rank 0 saved the database it wrote to {saved}" if saved.exists()
                      else ": its points went with it"),
                   "leave a database in place while a run writes it")


def _name_owners_signal(store: Store, run_id: int, signame: str) -> None:
    """The ranks record the signal that reached them, and a launcher may have passed on
    another (Open MPI's prterun ends its ranks with SIGTERM on Ctrl-C): the run names the
    one the owner was sent."""
    error = store.run(run_id).get("error") or ""
    head = "interrupted ("
    said = error[len(head):].split(")", 1)[0] if error.startswith(head) else None
    if said and said.startswith("SIG") and said != signame:
        store.update_run(run_id, error=head + signame + error[len(head) + len(said):])


def _clean_up(segments: set[str], had: frozenset[int]) -> None:
    """After ranks that did not reach MPI_Finalize: end those a launcher killed outright left
    running (they wrote on; not the children of ``had``, the caller's own), remove the
    shared-memory segments they left."""
    orphans = processes.end_orphans(keep=had)
    if orphans:
        print(f"note: ended {orphans} process{'' if orphans == 1 else 'es'} the launcher "
              "left running", file=sys.stderr, flush=True)
    count, size = shmclean.remove_left(segments)
    if count:
        print(f"note: removed {counted(count, 'shared-memory segment')} ({format_size(size)}) "
              "the ranks left in /dev/shm", file=sys.stderr, flush=True)


def record_load(db_path: Path, run_id: int, before: dict, ranks: Optional[int], own: bool) -> None:
    """Store the run's load record from ``before`` and a snapshot now (see machine/load.py)."""
    with Store(db_path) as store:
        store.update_run(run_id, load=load.summarize(before, load.snapshot(), ranks, own))


def settle(store: Store, run_id: int, rc: int,
           where: Callable[[list], str] = lambda points: "") -> tuple[list, int, dict]:
    """Mark the run: passed or failed by its checks when the ranks ended well, else
    failed with why (``where(points)`` may say where it ended).  (points, failed, run)."""
    points = store.points(run_id)
    failed = sum(p["check"] == "failed" for p in points)
    interrupted = rc == EXIT_INTERRUPTED
    signame = _OWNER_SIGNAL.pop(run_id, None) if interrupted else None
    ended = "interrupted" if interrupted else ended_with(rc)
    ended += f" ({signame})" if signame else ""
    why = ended + where(points) if rc else ""
    try:
        if signame:
            _name_owners_signal(store, run_id, signame)
        said = _mark(store, run_id, rc, failed, why) or why
    except DdlcommError as exc:        # a full disk: the points stay, the run reads stale
        said = why
        print(f"warning: run {run_id}'s end was not stored: {exc}", file=sys.stderr, flush=True)
    by_rank = not said.startswith(why)
    if rc and not (rc == EXIT_USAGE and by_rank):   # bad input a rank found: the rank said it
        # A rank that recorded the end knows where it was (a pre-flight, a signal's name):
        # say that, not the guess from the points stored.
        line = f"{ended}: {said}" if by_rank and not interrupted else said
        print(f"ddlcomm: error: {line}", file=sys.stderr, flush=True)
    return points, failed, store.run(run_id)


def ended_with(rc: int) -> str:
    """How the ranks' launcher ended, for a run's error (pure): its exit code, and the
    signal it stands for (a negative code: the launcher itself killed; 128 + N: a rank)."""
    if rc < 0:
        return f"the launcher was killed by {processes.signal_name(-rc)}"
    name = processes.signal_name(rc - 128) if rc > 128 else None
    killed = ": killed outright, by kill -9 or by the kernel when memory ran out (dmesg says " \
        "which)" if name == "SIGKILL" else ""
    return f"ranks ended with exit code {rc}" + (f" ({name}{killed})" if name else "")


def _mark(store: Store, run_id: int, rc: int, failed: int, why: str) -> Optional[str]:
    """Store how the run ended (see :func:`settle`); the error it has then."""
    if rc == 0:
        store.finish_run(run_id, "failed" if failed else "passed",
                         f"{failed} points failed their check" if failed else None)
        return None
    interrupted = rc == EXIT_INTERRUPTED
    if not store.end_if_running(run_id, "interrupted" if interrupted else "failed", why):
        _failed_not_interrupted(store, run_id, interrupted, why)
    return store.run(run_id)["error"]


def exit_code(rc: int, failed: int, run: dict) -> int:
    """The owner's exit code (README's table) from the launcher's ``rc``, the points that
    failed their check and the run as stored: the ranks' own code where it is one of the
    table's (bad input, a rank failed, interrupted); 3 for any other end of the ranks or
    the launcher (a signal, a launcher's 1, which would read as a failed check), and where
    the run's end could not be stored (it reads ``running``: a record no script may take
    for whole); else 1 where a point failed."""
    if rc:
        return rc if rc in (EXIT_USAGE, EXIT_RANK_FAILED, EXIT_INTERRUPTED) else EXIT_RANK_FAILED
    if run.get("status") == "running":
        return EXIT_RANK_FAILED
    return EXIT_CHECK_FAILED if failed else 0


def _failed_not_interrupted(store: Store, run_id: int, interrupted: bool, why: str) -> None:
    """A rank that fails makes the launcher stop the others, and they record the run
    interrupted: the owner, who saw the launcher fail, makes it failed."""
    run = store.run(run_id)
    if not interrupted and run["status"] == "interrupted":
        store.update_run(run_id, status="failed",
                         error=f"{why}; the launcher then stopped the other ranks ({run['error']})")


def fail_message(rank: int, what: Optional[str], exc: BaseException) -> str:
    """One line: the rank, where it was, and its error; another library's error by its
    type and :func:`~ddlcomm.errors.first_line`."""
    where = f" during {what}" if what else ""
    text = str(exc) if isinstance(exc, DdlcommError) else f"{type(exc).__name__}: {first_line(exc)}"
    return f"rank {rank}{where}: {text}"


@dataclass(frozen=True)
class RankResult:
    """How :func:`rank_run` ended: ``code`` is set when the rank failed (return it)."""

    code: Optional[int]
    owner: bool = False
    run_id: Optional[int] = None
    failed: int = 0
    #: rank 0: the database file was removed or replaced while the run wrote it (a copy
    #: saved: :func:`run_lost` says where); nothing more is written to that path
    lost: bool = False


def _record(db_path: Path, run_id: Optional[int], status: str, message: str) -> bool:
    """End run ``run_id`` with ``status`` and ``message`` unless it has ended (best effort:
    the rank is going down anyway); whether the store says it has ended now."""
    if run_id is None or not db_path.exists():
        return False
    try:
        with Store(db_path) as store:
            store.end_if_running(run_id, status, message)
            return store.run(run_id)["status"] != "running"
    except Exception:  # noqa: BLE001 - nothing left to tell
        return False


def ranks_ended_it(env: Mapping[str, str]) -> bool:
    """Whether the ranks of the run that ``env`` (an owner's, :func:`own`) names ended it
    themselves: where they exit 0 all the same, every rank refused alike and rank 0 said
    why (:func:`rank_run`; any other end of theirs exits non-zero)."""
    try:
        with Store(Path(env[DB_ENV]), readonly=True) as store:     # (a file removed: not made)
            return store.run(int(env[RUN_ID_ENV]))["status"] != "running"
    except (KeyError, DdlcommError):
        return False


@contextlib.contextmanager
def starting(db_path: Path):
    """While a rank starts (the backends' start-up, before :func:`rank_run`'s own handler),
    SIGINT, SIGTERM or SIGHUP still end the run as interrupted: an owner killed in its first
    seconds sent its launcher SIGTERM, and the ranks died of it, the run left 'running'."""
    run_id = owners_run()

    def act(signame: str) -> None:
        message = f"interrupted ({signame}) while the ranks started"
        os.write(2, f"ddlcomm: {message}\n".encode())          # no lock: any thread
        _record(db_path, run_id, "interrupted", message)
        os._exit(EXIT_INTERRUPTED)

    with OnInterrupt(act):
        yield


def rank_run(comm, db_path: Path, timeout_s: float, info: Callable[[], dict],
             prepare: Callable[[Watchdog], None],
             body: Callable[[Watchdog, Optional[Store], int], int]) -> RankResult:
    """Run ``body`` in every rank of ``comm`` under a watchdog, within the run.

    ``prepare(watchdog)`` runs first (checks every rank agrees on); then rank 0
    opens the store (creating the run from ``info()`` when no owner made it),
    and ``body(watchdog, store, run_id)`` (store None off rank 0) returns the
    number of failed checks.  Any exception or timeout prints the rank's
    message, marks the run failed and ends every rank.
    """
    state: dict = {"run_id": owners_run()}
    owner = state["run_id"] is None

    def record(status: str, message: str) -> bool:
        return _record(db_path, state["run_id"], status, message)

    def on_timeout(what: str, limit: float) -> None:
        given = " (--timeout: a hang, or raise it where a step takes longer)" \
            if limit == timeout_s else ""         # (a point's or a training step's limit)
        message = f"rank {comm.rank}: {what} did not finish within {limit:g} s{given}"
        print(f"ddlcomm: error: {message}", file=sys.stderr, flush=True)
        record("failed", message)
        shmclean.unlink_mine()
        os._exit(EXIT_RANK_FAILED)

    def on_interrupt(signame: str) -> None:
        current, last = watchdog.current, watchdog.last
        where = f" during {current}" if current else f" after {last}" if last else ""
        # under a launcher of yours, its SIGTERM may end the job for a rank that died
        cause = ", from the launcher: an interrupt, a job's limit or another rank's end" \
            if owner and signame == "SIGTERM" else ""
        message = f"interrupted ({signame}{cause}){where}"
        os.write(2, f"ddlcomm: rank {comm.rank}: {message}\n".encode())   # no lock: any thread
        record("interrupted", message)
        shmclean.unlink_mine()
        os._exit(EXIT_INTERRUPTED)

    watchdog = Watchdog(timeout_s, on_timeout)
    try:
        with OnInterrupt(on_interrupt):
            return _run_body(comm, db_path, state, owner, watchdog, info, prepare, body)
    except Exception as exc:  # noqa: BLE001 - any failure must end every rank
        return _failed(comm, exc, watchdog, record, owner)


def _failed(comm, exc: Exception, watchdog: Watchdog, record: Callable[[str, str], bool],
            owner: bool) -> RankResult:
    """:func:`rank_run`'s end on ``exc``: say it, record it, end every rank."""
    alike = isinstance(exc, EveryRankError)        # every rank ends by itself; rank 0 says why
    message = str(exc) if alike else fail_message(comm.rank, watchdog.current, exc)
    if comm.rank == 0 or not alike:
        print(f"ddlcomm: error: {message}", file=sys.stderr, flush=True)
    recorded = record("failed", message)
    if comm.size > 1 and alike:
        # no rank exits before rank 0 has said why: a launcher (prterun) ends the
        # others as the first rank exits with an error, rank 0 among them
        with watchdog.guard("every rank ending together after the refusal", 30.0):
            comm.barrier()
    if comm.size > 1 and not alike:
        shmclean.unlink_mine()
        comm.abort(EXIT_RANK_FAILED)
    if alike and recorded and not owner:
        # ddlcomm's launch: its owner reads the refusal from the run (ranks_ended_it);
        # a non-zero exit would add Open MPI's box after rank 0's one line
        return RankResult(0)
    return RankResult(exc.exit_code if isinstance(exc, DdlcommError) else EXIT_RANK_FAILED)


def _keep(store: Store, db_path: Path, run_id: int, failed: int) -> bool:
    """Rank 0, at the end: where the database file was removed or replaced while the run
    wrote it, save what the store still holds open to :func:`rescue_path` (the owner says
    where), the run ended in it as its checks say (no owner can end it there: it would
    read stale); then close the store, and remove SQLite's files left beside a removed one.
    Whether the file was removed or replaced."""
    moved = store.moved()
    if moved:
        to = rescue_path(db_path, run_id)
        store.save_copy(to)
        with Store(to) as copy:
            copy.finish_run(run_id, "failed" if failed else "passed",
                            f"{db_path} was removed or replaced while the run wrote it: this "
                            "copy was saved from the file rank 0 had open")
        print(f"ddlcomm: warning: {db_path} was removed or replaced during the run: its "
              f"database is saved to {to}", file=sys.stderr, flush=True)
    store.close()
    if not db_path.exists():
        for leftover in (Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
            leftover.unlink(missing_ok=True)
    return moved


def _run_body(comm, db_path: Path, state: dict, owner: bool, watchdog: Watchdog,
              info: Callable[[], dict], prepare: Callable[[Watchdog], None],
              body: Callable[[Watchdog, Optional[Store], int], int]) -> RankResult:
    """:func:`rank_run`'s work: the checks, the run (created by rank 0 when no owner
    did), the body."""
    prepare(watchdog)
    store = None
    if comm.rank == 0:
        store = Store(db_path)
        if owner:
            state["run_id"] = store.create_run(info())
        store.update_run(state["run_id"], mpi_library=comm.library,
                         mpi_version=comm.library_version)
    if owner:
        state["run_id"] = comm.broadcast_object(state["run_id"], 0)
    before = load.snapshot() if owner and store is not None else None
    failed = body(watchdog, store, state["run_id"])
    lost = store is not None and _keep(store, db_path, state["run_id"], failed)
    comm.barrier()
    if before is not None and not lost:     # not into a new, empty file in its place
        # ranks of a launcher we did not start: their CPU time and count per host are not ours to read
        record_load(db_path, state["run_id"], before, None, own=False)
    return RankResult(None, owner, state["run_id"], failed, lost)
