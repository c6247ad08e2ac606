"""Who owns something: a process named by its pid and start time, and whether it
still lives (a pid alone can be reused after the owner died); the owner's side
of a resource it removes at exit, closed once; and children that end with their owner."""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans(adopt: bool = True) -> frozenset[int]:
    """Make this process the parent of its descendants that lose theirs (Linux's
    ``PR_SET_CHILD_SUBREAPER``; nothing elsewhere): ranks whose launcher was killed outright
    come to it, not to init, and :func:`end_orphans` can end them.  Returns the children it
    had already (live or ended), which are not orphans of the launch: pass them to
    :func:`end_orphans` and :func:`reap_ended` as ``keep``.  ``adopt=False`` stops adopting
    (once the ranks have ended: a process that embeds ddlcomm stays no subreaper)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1 if adopt else 0)
    me = os.getpid()
    return frozenset(_children(me)) | frozenset(_children(me, ended=True))


def end_orphans(grace_s: float = 10.0, keep: frozenset[int] = frozenset()) -> int:
    """SIGTERM the children this process has left but those of ``keep`` (the orphans
    :func:`adopt_orphans` took in, once its launcher has ended), SIGKILL those alive
    ``grace_s`` later; reap them all.  Returns how many there were."""
    kids = [pid for pid in _children(os.getpid()) if pid not in keep]
    terminate(kids, _reaped, grace_s)
    return len(kids)


def terminate(pids: Sequence[int], gone: Callable[[int], bool], grace_s: float,
              first: int = signal.SIGTERM, kill: Callable[[int, int], None] = os.kill) -> list[int]:
    """Send ``pids`` ``first`` (SIGTERM), SIGKILL those not ``gone`` ``grace_s`` later;
    returns those still not gone another ``grace_s`` on.  ``kill`` sends a signal
    (``os.killpg``: to each pid's whole process group)."""
    left = list(pids)
    for sig in (first, signal.SIGKILL):
        for pid in left:
            try:
                kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            left = [pid for pid in left if not gone(pid)]
            if left:
                time.sleep(0.05)
        if not left:
            break
    return left


def reap_ended(keep: frozenset[int] = frozenset()) -> int:
    """Reap this process's children that have ended and wait for it (zombies), but those of
    ``keep`` (children some other code owns, whose exit status is theirs); how many.

    Open MPI's prterun does not wait for the ssh stand-ins it starts (a run in
    ``--containers``): they come to this process (:func:`adopt_orphans`), and until they
    are reaped their CPU time, with the daemons' and the ranks' under them, is not in
    ``os.times()``'s children (the run's load record counted the ranks as other processes).
    Call it once the launcher has returned: no child still owned by a Popen is left then."""
    return sum(_reaped(pid) for pid in _children(os.getpid(), ended=True) if pid not in keep)


def proc_stat(pid: "int | str") -> Optional[list[str]]:
    """The fields of ``/proc/PID/stat`` after the command's name (state first, then the
    parent's pid, ...: proc(5)'s 3rd field on), None where the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children(pid: int, ended: bool = False) -> list[int]:
    """The live children of ``pid`` (those ended and not yet reaped, zombies, where
    ``ended``), from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = proc_stat(stat.parent.name)
        if fields and len(fields) > 1 and fields[1] == str(pid) and (fields[0] == "Z") == ended:
            kids.append(int(stat.parent.name))
    return kids


def _reaped(pid: int) -> bool:
    """Whether child ``pid`` has ended (reaped now, or already)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def forwarded(exc: BaseException) -> int:
    """The signal to pass on to a launcher or ranks for ``exc``, the exception that stopped
    their owner: the owner's own signal where its handler raised ``SystemExit(128 + N)``
    (SIGTERM, SIGHUP), else SIGINT (Ctrl-C's KeyboardInterrupt)."""
    code = getattr(exc, "code", None)
    if isinstance(exc, SystemExit) and isinstance(code, int) and 128 < code < 128 + signal.NSIG:
        return code - 128
    return signal.SIGINT


def signal_name(number: int) -> Optional[str]:
    """``SIGKILL`` for 9: the name of signal ``number``, None where it has none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def die_with_parent(sig: int = signal.SIGTERM) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` by which the child gets ``sig`` when this process ends, even by
    SIGKILL (Linux's ``PR_SET_PDEATHSIG``; None elsewhere).  A launcher killed this way
    ends its ranks, which mark their run interrupted; without it they ran on to the end
    of the plan under a run already called stale.  The signal comes when the *thread*
    that started the child ends, so start such children from the main thread; it is not
    passed on to what the child forks, only kept across its exec."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl     # looked up here, not in the child
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:                     # the owner died before prctl
            os.kill(os.getpid(), sig)
    return arm


def end(proc: subprocess.Popen, grace_s: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Send ``proc`` ``sig``, SIGKILL it if it is still there after ``grace_s``; reap it.
    One stuck past SIGKILL too (uninterruptible sleep) is left, not waited for."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def owner_alive(pid: int, start: Optional[str] = None) -> bool:
    """Whether ``pid`` lives and is still the process that started at ``start``."""
    if not pid_alive(pid):
        return False
    return start is None or start_time(pid) in (None, start)


def this_process() -> dict:
    """This process as an owner: ``{"host", "pid", "start"}``."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": start_time(pid)}


def owner_gone(owner: Optional[dict]) -> bool:
    """True when ``owner`` (from :func:`this_process`) ran on this host and has died;
    False when it lives, ran elsewhere or is unknown."""
    if not owner or owner.get("host") != socket.gethostname() or not owner.get("pid"):
        return False
    return not owner_alive(int(owner["pid"]), owner.get("start"))


def first_close(resource) -> bool:
    """Whether this is ``resource``'s first close: marks it closed (its ``_open``) and drops
    the ``atexit`` hook its ``close`` registered; False when it was closed already."""
    if not resource._open:
        return False
    resource._open = False
    atexit.unregister(resource.close)
    return True
