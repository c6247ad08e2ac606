"""Facts about this machine and this ddlcomm for a run's row.

MPI library and version are not here: the backend reports them once it runs.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import ddlcomm

#: Seconds each git command may take before it is given up.
GIT_TIMEOUT_S = 5.0

# The ddlcomm package folder (this file is ddlcomm/results/sysinfo.py).
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def cpu_model(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str | None:
    """The CPU's 'model name' from ``cpuinfo``, else ``platform.processor()``, else None."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def last_level_cache(cpu: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Bytes of the highest-level data or unified cache of ``cpu`` (sysfs), None if unknown."""
    best: tuple[int, int] | None = None
    for index in Path(cpu).glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
        try:
            nbytes = int(size.rstrip("KMGkmg")) * unit
        except ValueError:
            continue
        if best is None or level > best[0]:
            best = (level, nbytes)
    return best[1] if best else None


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
    None when it is not a checkout (an installed package is never taken for
    one, even inside another repository's tree) or git is missing.
    """
    where = Path(directory) if directory is not None else _PACKAGE_DIR
    if {"site-packages", "dist-packages"} & set(where.parts):
        return None
    commit = _git(["rev-parse", "HEAD"], where)
    if not commit:
        return None
    status = _git(["status", "--porcelain"], where)
    return commit + "-dirty" if status else commit


def collect() -> dict[str, Any]:
    """Run fields describing this machine and software.

    Keys: ``host``, ``cpu_model``, ``cores`` (logical CPUs), ``os``,
    ``python``, ``ddlcomm_version``, ``git_commit`` (None outside a checkout).
    """
    return {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "ddlcomm_version": ddlcomm_version(),
        "git_commit": git_commit(),
    }
