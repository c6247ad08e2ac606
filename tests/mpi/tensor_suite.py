"""Rank-side check of CPU torch tensors through the public buffer calls (not bound ones).

Run under a launcher (``mpirun -n N python tensor_suite.py [--backend NAME]``).  The calls
took tensors at their checks, then used NumPy-only code on them: ``.size`` (a method on a
tensor), ``np.empty_like`` (a NumPy result for a tensor call), ``self._types[buf.dtype]``
(a torch dtype); gather and reduce failed at the root only, leaving the others waiting.
Each call's result is compared with NumPy; results a call allocates are tensors.
"""
from __future__ import annotations

import numpy as np
import torch

import ddlcomm

from suite_kit import conclude, guarded


def run_cases(comm) -> list[str]:
    r, p = comm.rank, comm.size
    mine = torch.arange(2 * p, dtype=torch.float32) + r
    every = [np.arange(2 * p, dtype=np.float32) + k for k in range(p)]
    total = np.sum(every, axis=0)
    cases = {
        "allreduce": (lambda: comm.allreduce(mine.clone()), total),
        "allreduce in place": (lambda: (lambda t: comm.allreduce(t, t))(mine.clone()), total),
        "allreduce avg bfloat16": (lambda: comm.allreduce(mine.to(torch.bfloat16), op="avg"),
                                   total / p),
        "broadcast": (lambda: comm.broadcast(mine.clone(), root=p - 1), every[-1]),
        "allgather": (lambda: comm.allgather(mine), np.concatenate(every)),
        "gather": (lambda: comm.gather(mine, root=p - 1),
                   np.concatenate(every) if r == p - 1 else None),
        "reduce": (lambda: comm.reduce(mine, root=0), total if r == 0 else None),
        "reduce_scatter": (lambda: comm.reduce_scatter(mine), total[2 * r:2 * r + 2]),
        "alltoall": (lambda: comm.alltoall(mine),
                     np.concatenate([e[2 * r:2 * r + 2] for e in every])),
        "iallreduce": (lambda: comm.iallreduce(mine.clone()).wait(), total),
    }
    failures = []
    for name, (call, want) in cases.items():
        got = call()
        if want is None:
            ok = got is None
        else:
            ok = torch.is_tensor(got) and np.allclose(got.float().numpy(), want, rtol=1e-2)
        if not ok:
            failures.append(f"rank {r}: {name}: got {got!r}")
    return failures


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    comm = ddlcomm.init(parser.parse_args().backend)
    failures = guarded(comm, lambda: run_cases(comm))
    return conclude(comm, failures, lambda n, _: f"{comm.name}: tensors {comm.size} ranks, "
                                                 f"{n} failures")


if __name__ == "__main__":
    raise SystemExit(main())
