"""Workload ``allreduce``: every worker averages its gradients with all others.

One step: all-reduce (average, in place) of every gradient message, in
back-propagation order, then each worker applies the averaged gradient to its
parameters (``params -= grad``).  Phases: allreduce, apply, step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..collectives import fill
from ..measure.checks import close, verdict
from ..measure.timing import clock
from . import base

PHASES = ("allreduce", "apply", "step")


@dataclass(frozen=True)
class AllreduceWorkload:
    name: str = "allreduce"
    min_ranks: int = 1

    def measure(self, comm, plan, spec, alloc) -> list[dict]:
        dtype, counts = base.counts(plan, spec.nbytes)
        grads = [alloc(dtype, n) for n in counts]
        params = [alloc(dtype, n) for n in counts]
        calls = [comm.bind("allreduce", g, g, op="avg") for g in grads]

        def step():
            t0 = clock()
            for call in calls:
                call()
            t1 = clock()
            for p, g in zip(params, grads):
                np.subtract(p, g, out=p)
            t2 = clock()
            return t1 - t0, t2 - t1, t2 - t0

        check = "skipped"
        if plan.check:
            for g, p, n in zip(grads, params, counts):
                g[:] = fill(dtype, n, comm.rank, None)
                p[:] = 0
            comm.barrier()
            step()
            ok = True
            for g, p, n in zip(grads, params, counts):
                mean = base.mean_input(dtype, n, range(comm.size))
                ok = ok and close(g, mean) and close(p, -mean)
            check = verdict(comm, ok)
        return base.timed_steps(comm, plan, spec, step, PHASES, check=check,
                                nmessages=len(counts), op="avg")

ALLREDUCE = AllreduceWorkload()
