"""Rank-side suite for ddlcomm's native algorithms: every (collective, algorithm) vs NumPy.

Run under a launcher (``mpirun -n N python native_suite.py [--backend NAME]``);
passes at any N.  For every algorithm of :mod:`ddlcomm.comm.native`, plain and
chunked: every dtype the backend carries × every op × counts 0, 1, 7, 13
(smaller than, equal to, not divisible by the number of ranks) × every root,
in place and not; a few large (1,000,003-element) cases; non-integer floats
against a float64 reference within the format's rounding; a custom reduction
kernel; multi-dimensional buffers; the argument checks and their messages.

Every rank builds every rank's input from seeds, so expected values need no
communication.  Integer-valued inputs make sums and products exact in every
dtype and reduction order, so those results must match exactly; ``avg``
(one rounding of the division) and non-integer inputs are compared within
the format's rounding.  Outputs start as a sentinel (NaN / 0xFF bytes), so a
call that writes nothing fails; inputs must come back untouched.

Exit 0 when every case passed on every rank; rank 0 prints
``<library> <version>: N ranks, F failures, C cases`` and the failures.  An
exception on any rank aborts the whole job (no rank is left waiting).
"""
from __future__ import annotations

import sys
import time
from typing import Optional

import numpy as np

import ddlcomm
from ddlcomm.comm import algorithms, native
from ddlcomm.dtypes import DTYPES, OPS, get_op
from ddlcomm.errors import EveryRankError, UsageError
from suite_kit import THIN_HELP, Checks, conclude, data, guarded, is_float, reference, thinned

COUNTS = (0, 1, 7, 13)
BIG = 1_000_003
#: Chunk sizes small enough that even 7- and 13-element buffers travel in pieces.
TINY_CHUNK = 8
#: Every algorithm, each as (collective, algorithm, label, keyword arguments).
VARIANTS = [
    ("allreduce", "ring", "", {}),
    ("allreduce", "ring", " chunked", {"chunk_bytes": TINY_CHUNK}),
    ("allreduce", "rhd", "", {}),
    ("allreduce", "rhd", " chunked", {"chunk_bytes": TINY_CHUNK}),
    ("broadcast", "binomial", "", {}),
    ("broadcast", "pipelined", "", {}),
    ("broadcast", "pipelined", " chunked", {"chunk_bytes": TINY_CHUNK}),
    ("reduce", "binomial", "", {}),
    ("reduce", "binomial", " chunked", {"chunk_bytes": TINY_CHUNK}),
    ("gather", "linear", "", {}),
    ("gather", "binomial", "", {}),
]


def eps(dtype) -> float:
    try:
        return float(np.finfo(dtype).eps)
    except ValueError:                          # bfloat16 from ml_dtypes
        import ml_dtypes
        return float(ml_dtypes.finfo(dtype).eps)


def floats(rank: int, count: int, dtype, salt: int) -> np.ndarray:
    """Non-integer values in [-1, 1), exactly representable in ``dtype``."""
    rng = np.random.default_rng(104729 * rank + salt)
    return rng.uniform(-1, 1, size=count).astype(dtype)


def matches(got, want_wide: np.ndarray, dtype, tol: Optional[np.ndarray] = None) -> bool:
    """``got`` equals the exact ``want_wide`` rounded to ``dtype`` (within ``tol`` if given)."""
    if not isinstance(got, np.ndarray) or got.dtype != np.dtype(dtype) \
            or got.size != want_wide.size:
        return False
    got = got.reshape(-1)
    if tol is None:
        return bool(np.array_equal(got, want_wide.astype(dtype)))
    return bool(np.all(np.abs(got.astype(np.float64) - want_wide) <= tol))


def sentinel(count: int, dtype) -> np.ndarray:
    out = np.empty(count, dtype)
    out.view(np.uint8)[:] = 0xFF                # NaN for floats, -1 / 255 for ints
    return out


class Suite(Checks):
    # -------------------------------------------------------------- collectives
    def allreduce(self, fn, label, kw, dtype, op, count, shape=None) -> None:
        comm, p, rank = self.comm, self.comm.size, self.comm.rank
        salt = self.next_salt()
        every = [data(r, count, dtype, op, salt) for r in range(p)]
        want = reference(op, every)
        tol = avg_tol(want, dtype) if op == "avg" else None
        mine = every[rank] if shape is None else every[rank].reshape(shape)
        kept = mine.copy()
        name = f"allreduce {label} {np.dtype(dtype).name} {op} count={count}"
        out = sentinel(count, dtype).reshape(mine.shape)
        got = fn(comm, mine, out, op, **kw)
        self.check(f"{name} out-of-place", got is out and matches(got, want, dtype, tol)
                   and np.array_equal(mine, kept))
        buf = mine.copy()
        got = fn(comm, buf, buf, op, **kw)
        self.check(f"{name} in place", got is buf and matches(got, want, dtype, tol))
        if count == 7:
            got = fn(comm, mine, None, op, **kw)
            self.check(f"{name} recvbuf=None", matches(got, want, dtype, tol)
                       and np.array_equal(mine, kept))

    def reduce(self, fn, label, kw, dtype, op, count, root) -> None:
        comm, p, rank = self.comm, self.comm.size, self.comm.rank
        salt = self.next_salt()
        every = [data(r, count, dtype, op, salt) for r in range(p)]
        want = reference(op, every)
        tol = avg_tol(want, dtype) if op == "avg" else None
        mine = every[rank]
        kept = mine.copy()
        name = f"reduce {label} {np.dtype(dtype).name} {op} count={count} root={root}"
        out = sentinel(count, dtype) if rank == root else None
        got = fn(comm, mine, out, op, root, **kw)
        ok = (got is out and matches(got, want, dtype, tol)) if rank == root else got is None
        self.check(f"{name} out-of-place", ok and np.array_equal(mine, kept))
        buf = mine.copy()
        got = fn(comm, buf, buf, op, root, **kw)
        ok = (got is buf and matches(got, want, dtype, tol)) if rank == root \
            else got is None and np.array_equal(buf, kept)
        self.check(f"{name} in place", ok)

    def broadcast(self, fn, label, kw, dtype, count, root) -> None:
        comm, rank = self.comm, self.comm.rank
        want = data(root, count, dtype, "sum", self.next_salt())
        buf = want.copy() if rank == root else sentinel(count, dtype)
        got = fn(comm, buf, root, **kw)
        self.check(f"broadcast {label} {np.dtype(dtype).name} count={count} root={root}",
                   got is buf and np.array_equal(buf.view(np.uint8), want.view(np.uint8)))

    def gather(self, fn, label, kw, dtype, count, root) -> None:
        comm, p, rank = self.comm, self.comm.size, self.comm.rank
        salt = self.next_salt()
        every = [data(r, count, dtype, "sum", salt) for r in range(p)]
        want = np.concatenate(every)
        mine = every[rank]
        kept = mine.copy()
        name = f"gather {label} {np.dtype(dtype).name} count={count} root={root}"
        out = sentinel(count * p, dtype) if rank == root else None
        got = fn(comm, mine, out, root, **kw)
        ok = (got is out and np.array_equal(got.view(np.uint8), want.view(np.uint8))) \
            if rank == root else got is None
        self.check(name, ok and np.array_equal(mine, kept))
        if count == 7:
            got = fn(comm, mine, None, root, **kw)
            ok = np.array_equal(got, want) if rank == root else got is None
            self.check(f"{name} recvbuf=None", ok)

    # -------------------------------------------------------------- extras
    def noninteger_floats(self, fn, label, kw, dtype, op, count, root=None) -> None:
        """Rounding happens: compare with float64 within p·eps·sum|x| (+ the last rounding)."""
        comm, p, rank = self.comm, self.comm.size, self.comm.rank
        salt = self.next_salt()
        every = [floats(r, count, dtype, salt) for r in range(p)]
        want = reference(op, every)
        bound = np.sum(np.abs(np.stack(every).astype(np.float64)), axis=0)
        if op == "avg":
            bound = bound / p
        tol = (p + 1) * eps(dtype) * bound + eps(dtype) * np.abs(want)
        if root is None:
            got = fn(comm, every[rank], None, op, **kw)
            self.check(f"allreduce {label} non-integer {np.dtype(dtype).name} {op} count={count}",
                       matches(got, want, dtype, tol))
        else:
            got = fn(comm, every[rank], None, op, root, **kw)
            self.check(f"reduce {label} non-integer {np.dtype(dtype).name} {op} count={count} "
                       f"root={root}", matches(got, want, dtype, tol) if rank == root
                       else got is None)

    def custom_kernel(self, fn, label, kw, count) -> None:
        """A caller's reduce(a, b, out) is the one used (here: a counting np.add)."""
        comm, p, rank = self.comm, self.comm.size, self.comm.rank
        calls = []

        def kernel(a, b, out):
            calls.append(a.size)
            np.add(a, b, out=out)
        salt = self.next_salt()
        every = [data(r, count, np.float32, "sum", salt) for r in range(p)]
        got = fn(comm, every[rank], None, "sum", reduce=kernel, **kw)
        # Some ranks reduce nothing (rhd's folded ranks): count over every rank.
        used = comm.allreduce_object(len(calls)) > 0 if p > 1 else True
        self.check(f"allreduce {label} custom kernel count={count}",
                   used and matches(got, reference("sum", every), np.float32))

    def point_to_point(self) -> None:
        """The public primitives the algorithms build on: sendrecv, isend/irecv, around a ring."""
        comm, p, rank = self.comm, self.comm.size, self.comm.rank
        right, left = (rank + 1) % p, (rank - 1) % p
        for count in (0, 5, 300_001):
            mine = np.full(count, rank, np.int64)
            got = comm.sendrecv(mine, right, sentinel(count, np.int64), left, tag=3)
            self.check(f"sendrecv count={count}", np.array_equal(got, np.full(count, left)))
            if p == 1:                          # Gloo cannot message itself (sendrecv copies)
                continue
            got = sentinel(count, np.int64)
            recv = comm.irecv(got, left, tag=4)
            send = comm.isend(mine, right, tag=4)
            recv.wait()
            send.wait()
            self.check(f"isend/irecv count={count}", np.array_equal(got, np.full(count, left)))

    def argument_checks(self) -> None:
        """Bad arguments raise UsageError with a precise message: those every rank refuses
        alike before any message is sent; a receive buffer (every rank's here) after the
        call into scratch memory that each rank refusing its own takes part in."""
        comm = self.comm
        ring = native.get("allreduce", "ring")
        a = np.ones(5, np.float32)
        ro = np.ones(5, np.float32)
        ro.setflags(write=False)
        frozen_cols = np.ones((4, 4), np.float32)[:, 1]
        frozen_cols.setflags(write=False)
        expect = [
            (lambda: ring(comm, a, ro), "allreduce's receive buffer is read-only"),
            (lambda: algorithms.bind(comm, "allreduce", "shm", np.ones(5, np.int32), None,
                                     get_op("avg"), 0),
             "allreduce by shm: rank 0: op avg needs a floating-point dtype, not int32"),
        ] + [
            (lambda: ring(comm, a, np.ones(4, np.float32)),
             "allreduce's receive buffer needs 5 elements, got 4"),
            (lambda: ring(comm, a, np.ones(5, np.float64)),
             "allreduce's receive buffer is float64, not float32 like the send buffer"),
            (lambda: ring(comm, a, a.reshape(5, 1)),
             "allreduce's receive buffer overlaps the send buffer"),
            (lambda: ring(comm, a, chunk_bytes=0),
             "chunk_bytes must be a positive number of bytes, not 0"),
            (lambda: ring(comm, a, reduce="fast"),
             "reduce must be a callable reduce(a, b, out), not str"),
            (lambda: ring(comm, a, op="mean"), "unknown op 'mean'"),
            (lambda: ring(comm, np.ones(5, np.int32), op="avg"),
             "op avg needs a floating-point dtype, not int32"),
            (lambda: ring(comm, np.ones((4, 4), np.float32)[:, 1]),
             "buffers must be C-contiguous arrays"),
            (lambda: ring(comm, [1.0, 2.0]), "allreduce's send buffer must be a NumPy array"),
            (lambda: ring(comm, [1.0, 2.0], np.zeros(2, np.float32)),
             "allreduce's send buffer must be a NumPy array"),
            (lambda: native.get("broadcast", "pipelined")(comm, [1.0]),
             "broadcast's buffer must be a NumPy array"),
            # read-only as well, off the root: refused alike (it took part, the root never sent)
            (lambda: native.get("broadcast", "binomial")(comm, frozen_cols, root=0),
             "buffers must be C-contiguous"),
            (lambda: native.get("reduce", "binomial")(comm, a, root=comm.size),
             f"root {comm.size} is not a rank of this communicator"),
            (lambda: native.get("allreduce", "tree"),
             "unknown allreduce algorithm 'tree' (choose from ring, rhd)"),
            (lambda: native.get("alltoall", "ring"), "no native algorithm for collective 'alltoall'"),
        ]
        for call, message in expect:
            try:
                call()
            except UsageError as exc:
                self.check(f"error message {message!r} (got {str(exc)!r})",
                           str(exc).startswith(message))
            else:
                self.check(f"error {message!r} not raised", False)


    def one_rank_refuses(self) -> None:
        """A buffer of its own that one rank alone refuses (read-only, the wrong size): that
        rank raises after taking part with scratch memory, so the others complete the call
        with the right result (they were left waiting in it)."""
        comm, p, rank = self.comm, self.comm.size, self.comm.rank
        if p == 1:
            return
        bad, total = p - 1, p * (p + 1) / 2
        ro = np.zeros(5, np.float32)
        ro.setflags(write=False)
        mine = np.full(5, rank + 1, np.float32)
        cases = [(f"allreduce by {name}", lambda f=native.get("allreduce", name):
                  f(comm, mine, ro if rank == bad else np.zeros(5, np.float32)),
                  "allreduce's receive buffer is read-only", lambda got: np.all(got == total))
                 for name in ("ring", "rhd")]
        cases += [(f"gather by {name}", lambda f=native.get("gather", name):
                   f(comm, mine, np.zeros(4, np.float32) if rank == bad else None, root=bad),
                   "gather's receive buffer needs", lambda got: got is None) for name in ("linear", "binomial")]
        cases.append(("reduce by binomial", lambda: native.get("reduce", "binomial")(
            comm, mine, np.zeros(4, np.float32) if rank == bad else None, root=bad),
            "reduce's receive buffer needs", lambda got: got is None))
        cases += [(f"broadcast by {name}", lambda f=native.get("broadcast", name):
                   f(comm, ro if rank == bad else mine.copy(), root=0),
                   "broadcast's buffer is read-only", lambda got: np.all(got == 1)) for name in ("binomial", "pipelined")]
        for label, call, message, right in cases:
            try:
                got = call()
                self.check(f"{label}: rank {rank} got {got}", rank != bad and right(got))
            except UsageError as exc:
                self.check(f"{label}: rank {rank} raised {exc}", rank == bad and str(exc).startswith(message))
        # bound (algorithms.bind: the harness's and training's way): checked on every rank and
        # agreed, so every rank raises, naming the rank; none waits in the set-up or first call
        for name in ("ring", "rhd", "shm", "hierarchical"):
            try:
                algorithms.bind(comm, "allreduce", name, mine, ro if rank == bad else np.zeros(5, np.float32),
                                get_op("sum"), 0)
                self.check(f"bind {name}: rank {rank} bound a read-only buffer of rank {bad}", False)
            except EveryRankError as exc:
                self.check(f"bind {name}: rank {rank} raised {exc}",
                           f"rank {bad}: allreduce's receive buffer is read-only" in str(exc))
        comm.barrier()


def avg_tol(want: np.ndarray, dtype) -> np.ndarray:
    """avg: the exact sum divided once, so within one rounding (two: via float32)."""
    return 2 * eps(dtype) * np.abs(want)


def run(comm, only: Optional[list[str]] = None, thin: bool = False) -> Suite:
    """Every case; ``only`` narrows the dtypes (default: every one the backend carries);
    ``thin`` the reductions' (dtype, op) pairs (:func:`suite_kit.thinned`)."""
    suite = Suite(comm)
    p = comm.size
    roots = range(p)
    dtypes = [DTYPES[n].numpy for n in ("float16", "bfloat16", "float32", "float64",
                                        "int32", "int64", "uint8")
              if n in DTYPES and n in comm.dtypes and (only is None or n in only)]
    suite.argument_checks()
    suite.one_rank_refuses()
    suite.point_to_point()
    for coll, alg, extra, kw in VARIANTS:
        fn = native.get(coll, alg)
        label = alg + extra
        for dtype in dtypes:
            for count in COUNTS:
                if coll in ("allreduce", "reduce"):
                    for op, rop in OPS.items():
                        if rop.floats_only and not is_float(dtype) or thinned(dtype, op, thin):
                            continue
                        if coll == "allreduce":
                            suite.allreduce(fn, label, kw, dtype, op, count)
                        else:
                            for root in roots:
                                suite.reduce(fn, label, kw, dtype, op, count, root)
                elif coll == "broadcast":
                    for root in roots:
                        suite.broadcast(fn, label, kw, dtype, count, root)
                else:
                    for root in roots:
                        suite.gather(fn, label, kw, dtype, count, root)
        # A few large cases, and the extras, per algorithm.
        big_kw = dict(kw, chunk_bytes=64 * 1024) if "chunk_bytes" in kw else kw
        if coll == "allreduce":
            suite.allreduce(fn, label, big_kw, np.float32, "sum", BIG)
            suite.allreduce(fn, label, kw, np.int32, "max", 1000, shape=(10, 100))
            for dtype in (d for d in dtypes if is_float(d)):
                for op in ("sum", "avg"):
                    suite.noninteger_floats(fn, label, kw, dtype, op, 1001)
            suite.custom_kernel(fn, label, kw, 13)
        elif coll == "reduce":
            suite.reduce(fn, label, big_kw, np.float32, "sum", BIG, p - 1)
            for dtype in (d for d in dtypes if is_float(d)):
                suite.noninteger_floats(fn, label, kw, dtype, "sum", 1001, root=p // 2)
        elif coll == "broadcast":
            suite.broadcast(fn, label, big_kw, np.float32, BIG, p // 2)
        else:
            suite.gather(fn, label, kw, np.int32, BIG // 4, p - 1)
    return suite


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--dtypes", help="comma list of dtypes (default: all the backend carries)")
    parser.add_argument("--thin", action="store_true", help=THIN_HELP)
    args = parser.parse_args()
    only = args.dtypes.split(",") if args.dtypes else None
    comm = ddlcomm.init(args.backend)
    start = time.perf_counter()
    suite = guarded(comm, lambda: run(comm, only, args.thin))
    elapsed = time.perf_counter() - start
    return conclude(comm, suite.failures,
                    lambda n, cases: f"{comm.library} {comm.library_version}: {comm.size} ranks, "
                                     f"{n} failures, {sum(cases)} cases, {elapsed:.1f} s", suite.cases)


if __name__ == "__main__":
    sys.exit(main())
