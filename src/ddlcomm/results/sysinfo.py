"""Facts about this machine and this ddlcomm for a run's row.

The run row's columns (host, CPU, OS, versions) plus ``machine``: everything
``ddlcomm info`` reports (:func:`ddlcomm.machine.facts`).  The MPI library the
ranks really ran is also set by the backend once it runs.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any, Optional

from .. import machine
from ..machine.cpus import cpu_model

import ddlcomm

#: Seconds each git command may take before it is given up.
GIT_TIMEOUT_S = 5.0
#: The commit of a copy of a checkout without its .git (as the device tool's copy of the
#: working tree may be): scripts/gpu-check's caller passes it, else runs there name none.
COMMIT_ENV = "DDLCOMM_GIT_COMMIT"

# The ddlcomm package folder (this file is ddlcomm/results/sysinfo.py).
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def ddlcomm_version() -> str:
    """The installed ddlcomm's version, else ``ddlcomm.__version__``, else ``'unknown'``."""
    try:
        return importlib.metadata.version("ddlcomm")
    except importlib.metadata.PackageNotFoundError:
        pass
    return str(getattr(ddlcomm, "__version__", "unknown"))


def _git(args: list[str], cwd: Path) -> str | None:
    """Output of ``git ARGS`` in ``cwd``, or None if git is missing, fails or hangs."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(directory: str | os.PathLike[str] | None = None) -> str | None:
    """HEAD of the git checkout holding ``directory`` (default: the ddlcomm package).

    ``'-dirty'`` is appended when ``git status --porcelain`` lists changes.
    Outside a checkout (or without git) it is ``$DDLCOMM_GIT_COMMIT`` where that
    is set (a copy of a checkout without its .git), else None; an installed
    package is never taken for a checkout, even inside another repository's tree.
    """
    where = Path(directory) if directory is not None else _PACKAGE_DIR
    if {"site-packages", "dist-packages"} & set(where.parts):
        return None
    commit = _git(["rev-parse", "HEAD"], where)
    if not commit:
        return os.environ.get(COMMIT_ENV) or None
    status = _git(["status", "--porcelain"], where)
    return commit + "-dirty" if status else commit


def collect(ranks: Optional[int] = None, with_machine: bool = True) -> dict[str, Any]:
    """Run fields describing this machine and software.

    Keys: ``host``, ``cpu_model``, ``cores`` (logical CPUs), ``os``,
    ``python``, ``ddlcomm_version``, ``git_commit`` (None outside a checkout)
    and, with ``with_machine``, ``machine`` (:func:`ddlcomm.machine.facts` at
    ``ranks`` local ranks; about a second or two, for the MPI and GPU probes).
    """
    info = {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "ddlcomm_version": ddlcomm_version(),
        "git_commit": git_commit(),
    }
    if with_machine:
        info["machine"] = machine.facts(ranks)
    return info
