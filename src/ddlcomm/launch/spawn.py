"""Starting ranks without MPI: N local processes with torchrun's environment.

Each process gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID``, as torchrun would give it, so
backends that rendezvous through ``env://`` (gloo) start as under torchrun.
Their output streams through.  When one rank exits non-zero the others are
ended (as torchrun and mpirun do), so a failed rank never leaves the rest
waiting forever.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Mapping, Optional, Sequence

from ..errors import BackendUnavailable, UsageError
from .processes import die_with_parent, forwarded, signal_name, terminate


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def held_port(host: str = "127.0.0.1"):
    """A TCP port the OS picks, held while the block runs: bound, never listening, so that
    no other process is handed it meanwhile (a port merely free a moment ago could be taken
    before rank 0's store binds it), while torch's store binds it all the same (both
    sockets set SO_REUSEADDR, which Linux grants where no socket listens on the port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        yield s.getsockname()[1]


def rank_env(base: Mapping[str, str], rank: int, size: int, port: int,
             run_id: str = "ddlcomm", master_addr: str = "127.0.0.1") -> dict[str, str]:
    """The environment of rank ``rank`` of ``size`` (pure)."""
    env = dict(base)
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(size), MASTER_ADDR=master_addr, MASTER_PORT=str(port),
               TORCHELASTIC_RUN_ID=run_id)
    return env


def run(nranks: int, program: Sequence[str], env: Mapping[str, str],
        grace_s: float = 10.0, poll_s: float = 0.05,
        prefixes: Optional[Sequence[Sequence[str]]] = None, master_addr: str = "127.0.0.1") -> int:
    """Start ``nranks`` copies of ``program``; return the first non-zero exit code, else 0.

    ``prefixes[r]`` (e.g. entering a container, binding to cores) goes before
    rank r's command; ``master_addr`` is where rank 0 listens.  Ctrl-C (or the owner's SIGTERM or SIGHUP) is
    passed on; ranks that outlive a failed one by ``grace_s`` seconds are
    killed, and every rank gets SIGTERM if this process is killed outright.
    Returns 130 when interrupted.
    """
    if nranks < 1:
        raise UsageError(f"cannot start {nranks} ranks", "give 1 or more")
    with held_port() as port:        # held until the job ends: rank 0's store binds it meanwhile
        return _run(nranks, program, env, port, grace_s, poll_s,
                    prefixes or [[] for _ in range(nranks)], master_addr)


def _run(nranks: int, program: Sequence[str], env: Mapping[str, str], port: int, grace_s: float,
         poll_s: float, prefixes: Sequence[Sequence[str]], master_addr: str) -> int:
    """:func:`run`'s job, its ranks meeting on ``port``."""
    procs: list[subprocess.Popen] = []
    failed_at, code = None, 0
    try:
        for r in range(nranks):
            procs.append(subprocess.Popen([*prefixes[r], *program],
                                          env=rank_env(env, r, nranks, port, master_addr=master_addr),
                                          start_new_session=True, stdin=subprocess.DEVNULL,
                                          preexec_fn=die_with_parent()))
        while True:
            codes = [p.poll() for p in procs]       # every rank's, each round: any may fail first
            if None not in codes:
                break
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad and failed_at is None:
                code, failed_at = _first_failure(bad), time.monotonic()
                _signal_all(procs, signal.SIGTERM)
            if failed_at is not None and time.monotonic() - failed_at > grace_s:
                _signal_all(procs, signal.SIGKILL)
            time.sleep(poll_s)
    except (KeyboardInterrupt, SystemExit) as exc:   # Ctrl-C, or SIGTERM/SIGHUP as SystemExit
        _end_all(procs, forwarded(exc), grace_s)
        return 130
    except OSError as exc:                          # a rank's command could not start
        _end_all(procs, signal.SIGTERM, grace_s)
        raise BackendUnavailable(f"cannot start rank {len(procs)}: {exc}",
                                 "check the command and the tools it starts with (taskset, nsenter)") from None
    if code == 0:
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        code = _first_failure(bad) if bad else 0
    return code


def _first_failure(bad: list[tuple[int, int]]) -> int:
    """The exit code of a failed job from its failed ranks' (rank, return code): a rank
    killed by a signal is the cause (the others fail after it: Gloo's "Connection reset by
    peer" named no culprit), said on stderr, and its code is the shell's 128 + N."""
    rank, code = next((b for b in bad if b[1] < 0), bad[0])
    if code < 0:
        name = signal_name(-code) or f"signal {-code}"
        print(f"ddlcomm: rank {rank} was killed by {name}", file=sys.stderr, flush=True)
        return 128 - code
    return code


def _signal_all(procs, sig) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def _end_all(procs, first: int, grace_s: float) -> None:
    """Send every live rank's process group ``first``, SIGKILL those left ``grace_s`` later
    (:func:`~ddlcomm.launch.processes.terminate`); each ended rank is reaped."""
    by_pid = {p.pid: p for p in procs}
    terminate([p.pid for p in procs if p.poll() is None], lambda pid: by_pid[pid].poll() is not None,
              grace_s, first=first, kill=os.killpg)
