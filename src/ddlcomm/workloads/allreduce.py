"""Workload ``allreduce``: every worker averages its gradients with all others.

One step: all-reduce (average, in place) of every gradient message, in
back-propagation order, then each worker applies the averaged gradient to its
parameters (``params -= grad``).  Phases: allreduce, apply, step; along a GPU
data path the all-reduce's parts too (``allreduce.d2h``, ...).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..collectives import fill
from ..measure.checks import close, verdict
from ..measure.timing import clock
from . import base
from .paths import get_path
from .stages import added, copied, run_stages


@dataclass(frozen=True)
class AllreduceWorkload:
    name: str = "allreduce"
    min_ranks: int = 1
    #: it needs a receive from whichever rank sends first (any source)
    any_source: bool = False
    #: its steps run --warmup untimed first
    warms_up: bool = True
    #: the data paths it runs along (every one)
    paths: tuple = ()

    def measure(self, comm, plan, spec, alloc) -> list[dict]:
        dtype, counts = base.counts(plan, spec.nbytes)
        with get_path(spec.path).open(comm, plan, alloc, server=False) as path:
            return self._measure(comm, plan, spec, path, dtype, counts)

    def _measure(self, comm, plan, spec, path, dtype, counts) -> list[dict]:
        side = path.side
        grads = [side.alloc(dtype, n) for n in counts]
        params = [side.alloc(dtype, n) for n in counts]
        stages = [path.stage(comm, "allreduce", g, g, op="avg") for g in grads]

        def step():
            t0 = clock()
            runs = run_stages(stages)
            t1 = clock()
            for p, g in zip(params, grads):
                side.subtract(p, g)
            side.sync()
            t2 = clock()
            return (*added(runs), t2 - t1, t2 - t0)

        check = "skipped"
        if plan.check:
            for g, p, n in zip(grads, params, counts):
                side.load(g, fill(dtype, n, comm.rank, None))
                side.load(p, np.zeros(n, dtype.numpy))
            comm.barrier()
            step()
            ok = True
            for g, p, n in zip(grads, params, counts):
                mean = base.mean_input(dtype, n, range(comm.size))
                ok = ok and close(side.read(g), mean) and close(side.read(p), -mean)
            check = verdict(comm, ok)
        return base.timed_steps(comm, plan, spec, step, (*stages[0].phases(), base.APPLY, "step"),
                                check=check, nmessages=len(counts), op="avg",
                                copies=copied(stages), path=path)


ALLREDUCE = AllreduceWorkload()
