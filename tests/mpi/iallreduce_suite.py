"""Rank-side check of the non-blocking all-reduce (``Communicator.iallreduce``).

Run under a launcher (``mpirun -n N python iallreduce_suite.py [--backend NAME]``);
passes at any N.  For each dtype the backend carries, op, count (0, 1, odd)
and in-place/out-of-place: several all-reduces are started before any is
waited for, some are completed by polling ``test()``, others by ``wait()``
in reverse order, and each result is compared with NumPy.  Inputs are small
integers, so sums are exact in any order.  Exit 0 when every case passed on
every rank (rank 0 prints "N ranks, 0 failures").
"""
from __future__ import annotations

import sys
import time

import numpy as np

import ddlcomm
from ddlcomm.dtypes import DTYPES

from rank_suite import close
from suite_kit import conclude, data, guarded, reference

COUNTS = (0, 1, 7, 1000)
OPS = ("sum", "avg", "max")


def run_cases(comm) -> list[str]:
    failures = []
    p, rank = comm.size, comm.rank
    salt = 0
    for dname in ("float32", "float64", "int32", "float16"):
        if dname not in comm.dtypes or dname not in DTYPES:
            continue
        dtype = DTYPES[dname].numpy
        for op in OPS:
            if op == "avg" and not DTYPES[dname].is_float:
                continue
            pending = []
            for count in COUNTS:
                for in_place in (False, True):
                    salt += 1
                    mine = data(rank, count, dtype, op, salt)
                    want = reference(op, [data(r, count, dtype, op, salt) for r in range(p)]).astype(dtype)
                    kept = mine.copy()
                    out = mine if in_place else np.zeros(count, dtype)
                    req = comm.iallreduce(mine, out, op=op)
                    pending.append((f"{dname} {op} count={count} in_place={in_place}",
                                    req, out, want, None if in_place else (mine, kept)))
            # Half polled to completion, half waited for, in reverse order.
            polled, waited = pending[::2], pending[1::2]
            deadline = time.monotonic() + 60
            while not all(r.test() for _, r, *_ in polled):
                if time.monotonic() > deadline:
                    failures.append(f"rank {rank}: {dname} {op}: test() never completed")
                    break
            for _, req, *_ in reversed(waited):
                req.wait()
            for name, req, out, want, inputs in pending:
                got = req.wait()               # a second wait returns at once
                ok = got is out and req.done and close(out, want, dtype)
                if inputs is not None:
                    ok = ok and np.array_equal(inputs[0], inputs[1])   # sendbuf untouched
                if not ok:
                    failures.append(f"rank {rank}: iallreduce {name}")
    return failures + temporary_send_buffers(comm)


def temporary_send_buffers(comm) -> list[str]:
    """A send buffer no one else holds (``iallreduce(x * 2)``): Open MPI read it after it
    was freed and its memory reused (mpi4py does not keep it), so the sums were wrong."""
    import gc
    failures = []
    for count in (4, 1000, 100000):
        req = comm.iallreduce(np.full(count, comm.rank + 1, np.float32))
        gc.collect()
        reused = [np.zeros(count, np.float32) for _ in range(8)]
        got = req.wait()
        if not np.all(got == comm.size * (comm.size + 1) // 2):
            failures.append(f"rank {comm.rank}: iallreduce of a temporary, count={count}")
        del reused
    return failures


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    args = parser.parse_args()
    comm = ddlcomm.init(args.backend)
    failures = guarded(comm, lambda: run_cases(comm))
    return conclude(comm, failures, lambda n, _: f"{comm.library} {comm.library_version}: "
                                                 f"iallreduce {comm.size} ranks, {n} failures")


if __name__ == "__main__":
    sys.exit(main())
