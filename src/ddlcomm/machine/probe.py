"""How every probe of :mod:`ddlcomm.machine` asks the machine: never raising, never hanging.

A probe that needs a program runs it through :func:`command` (a timeout,
stdin closed, the reason kept when it is missing or fails); one that must load
a library that could hang, crash or initialise a device (MPI, CUDA) runs a
Python function of this package in a child interpreter through :func:`child`,
which returns the function's JSON answer.  :func:`guarded` turns any probe's
exception into ``{"error": ...}`` so that one broken probe leaves the others.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

#: Seconds a program asked for facts (ompi_info, nvidia-smi, srun --version) may take.
COMMAND_TIMEOUT_S = 5.0
#: Seconds a child interpreter may take (it may import torch or initialise MPI).
CHILD_TIMEOUT_S = 20.0
#: The line prefix a child writes its JSON answer after (libraries may print too).
ANSWER_MARK = "@@ddlcomm-machine@@ "

# src/ (or site-packages), so that a child imports this same ddlcomm.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])


def which(name: str, beside: Optional[str] = None) -> Optional[str]:
    """``name`` in the folder ``beside`` (a program's folder) if executable there, else on PATH."""
    if beside:
        path = Path(beside) / name
        if os.access(path, os.X_OK) and path.is_file():
            return str(path)
    return shutil.which(name)


def run(argv: Sequence[str], timeout_s: float,
        env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """``argv`` in its own process group, output captured; on timeout the whole group
    is killed (an MPI singleton may have started helpers) and TimeoutExpired raised."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, errors="replace",
                            env=None if env is None else dict(env), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S,
            env: Optional[Mapping[str, str]] = None) -> tuple[Optional[str], Optional[str]]:
    """Run ``argv``; ``(stdout + stderr, None)`` when it exited 0, else ``(output or None, why)``."""
    try:
        done = run(argv, timeout_s, env)
    except FileNotFoundError:
        return None, f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"`{' '.join(argv)}` did not end within {timeout_s:g} s"
    except OSError as exc:
        return None, f"`{' '.join(argv)}` could not start: {exc}"
    out = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        last = out.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return out, f"`{' '.join(argv)}` failed: {last[0]}"
    return out, None


def child_code(target: str) -> str:
    """The ``python -c`` program that prints ``target()``'s answer (``module:function``)."""
    module, _, function = target.partition(":")
    return ("import importlib, json, sys\n"
            f"answer = getattr(importlib.import_module({module!r}), {function!r})()\n"
            "sys.stdout.flush()\n"
            f"print({ANSWER_MARK!r} + json.dumps(answer, default=str), flush=True)\n")


def parse_answer(output: str) -> Optional[Any]:
    """The JSON after the last :data:`ANSWER_MARK` line of a child's output, None if none (pure)."""
    for line in reversed(output.splitlines()):
        if line.startswith(ANSWER_MARK):
            try:
                return json.loads(line[len(ANSWER_MARK):])
            except ValueError:
                return None
    return None


def child(target: str, env: Optional[Mapping[str, str]] = None, python: Optional[str] = None,
          timeout_s: float = CHILD_TIMEOUT_S) -> dict:
    """``target()`` (``"ddlcomm.machine.mpi:in_this_process"``) run in a child interpreter.

    Returns its dict, or ``{"error": why}`` when the child timed out, died, or
    printed no answer.  ``env`` (default ours) gets this ddlcomm first on PYTHONPATH.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE_ROOT, env.get("PYTHONPATH")) if p)
    argv = [python or sys.executable, "-c", child_code(target)]
    try:
        done = run(argv, timeout_s, env)
    except subprocess.TimeoutExpired:
        return {"error": f"{target} did not answer within {timeout_s:g} s"}
    except OSError as exc:
        return {"error": f"{target}: cannot start {argv[0]}: {exc}"}
    answer = parse_answer(done.stdout)
    if isinstance(answer, dict):
        return answer
    tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines()
            or [f"exit code {done.returncode}"])[-1]
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
    return {"error": f"{target} gave no answer ({how}): {tail}"}


def guarded(probe: Callable[[], dict]) -> dict:
    """``probe()``, or ``{"error": "<Type>: message"}`` if it raised."""
    try:
        return probe()
    except Exception as exc:  # a fact we could not get is reported, never fatal
        return {"error": f"{type(exc).__name__}: {exc}"}
