"""Parameter-server workloads: rank 0 is the server, ranks 1..p-1 the workers.

``ps-sync`` — one step: the server broadcasts every parameter message; every
message of gradients is gathered to the server; the server applies the
workers' average (``params -= mean(grads)``).  Phases: broadcast, gather,
apply (the server's time), step.

``ps-async`` — each worker, on its own schedule, pushes its gradients with the
version of the parameters they came from and pulls the parameters back; the
server applies each push as it arrives (``params -= grad``) and answers with
the new parameters.  Point-to-point only; the server waits with ``recv_any``,
which does not spin a core while idle.  Reports each worker's step time, the
server's apply time and pushes/s, and staleness (how many updates the
parameters a push came from were behind).  The check is exact: the server's
final parameters must equal minus the sum of every push, which holds only if
every push was applied exactly once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..collectives import fill
from ..errors import UsageError
from ..measure.checks import close, verdict
from ..measure.timing import clock
from . import base
from .paths import get_path
from .stages import added, copied, run_stages

PUSH, PULL = 11, 12
DEFAULT_ASYNC_STEPS = 100


def _prepare(name: str, comm, plan, spec):
    """A PS workload's dtype and message counts; refuses a job without workers."""
    if comm.size < 2:
        raise UsageError(f"{name} needs a server and at least one worker", "use --ranks 2 or more")
    return base.counts(plan, spec.nbytes)


@dataclass(frozen=True)
class PSSync:
    name: str = "ps-sync"
    min_ranks: int = 2
    #: it needs a receive from whichever rank sends first (any source)
    any_source: bool = False
    #: its steps run --warmup untimed first
    warms_up: bool = True
    #: the data paths it runs along (every one)
    paths: tuple = ()

    def measure(self, comm, plan, spec, alloc) -> list[dict]:
        dtype, counts = _prepare(self.name, comm, plan, spec)
        with get_path(spec.path).open(comm, plan, alloc, server=True) as path:
            return self._measure(comm, plan, spec, path, dtype, counts)

    def _measure(self, comm, plan, spec, path, dtype, counts) -> list[dict]:
        p, server, side = comm.size, comm.rank == 0, path.side
        params = [side.alloc(dtype, n) for n in counts]
        grads = [side.alloc(dtype, n) for n in counts]
        tables = [side.alloc(dtype, n * p) if server else None for n in counts]
        sums = [side.alloc(dtype, n) if server else None for n in counts]
        bcasts = [path.stage(comm, "broadcast", x, root=0) for x in params]
        gathers = [path.stage(comm, "gather", g, t, root=0) for g, t in zip(grads, tables)]
        scale = 1.0 / (p - 1)

        def step():
            t0 = clock()
            b = run_stages(bcasts)
            g = run_stages(gathers)
            t2 = clock()
            if server:
                for x, t, acc, n in zip(params, tables, sums, counts):
                    side.apply_mean(x, t, p, n, acc, scale)
                side.sync()
            t3 = clock()
            return (*added(b), *added(g), t3 - t2, t3 - t0)

        phases = (*bcasts[0].phases(), *gathers[0].phases(), base.APPLY, "step")
        check = "skipped"
        if plan.check:
            check = verdict(comm, _check_sync(comm, dtype, counts, params, grads, step, side))
        return base.timed_steps(comm, plan, spec, step, phases, check=check,
                                nmessages=len(counts), op=None, server_phases=(base.APPLY,),
                                copies={**copied(bcasts), **copied(gathers)}, path=path)


def _check_sync(comm, dtype, counts, params, grads, step, side) -> bool:
    """One step from known parameters and gradients: the server holds the parameters
    minus the workers' mean gradient, every worker the parameters it was sent."""
    server = comm.rank == 0
    for x, g, n in zip(params, grads, counts):
        side.load(x, fill(dtype, n, 0, None) if server else np.zeros(n, dtype.numpy))
        side.load(g, fill(dtype, n, comm.rank, None))
    comm.barrier()
    step()
    ok = True
    for x, n in zip(params, counts):
        start = fill(dtype, n, 0, None).astype(np.float64)
        ok = ok and close(side.read(x), start - base.mean_input(dtype, n, range(1, comm.size))
                          if server else start)
    return ok


@dataclass(frozen=True)
class PSAsync:
    name: str = "ps-async"
    min_ranks: int = 2
    #: it needs a receive from whichever rank sends first (any source)
    any_source: bool = True
    #: the data paths it runs along: host memory only (point-to-point, any-source receive)
    paths: tuple = ("host",)
    #: every push is timed, the first ones too, and its check counts every push the server
    #: applied: no untimed warm-up (``--warmup`` refused), and no budget (``--steps``)
    warms_up: bool = False

    def measure(self, comm, plan, spec, alloc) -> list[dict]:
        dtype, counts = _prepare(self.name, comm, plan, spec)
        p, steps = comm.size, plan.steps or plan.iters or DEFAULT_ASYNC_STEPS
        # Two gradient patterns of 0s and 1s: sums stay exact (float16 up to 2048 pushes).
        patterns = [[(np.arange(n) + k) % 2 for n in counts] for k in (0, 1)]
        patterns = [[a.astype(dtype.numpy) for a in pat] for pat in patterns]
        params = [alloc(dtype, n) for n in counts]
        header = np.zeros(1, np.int64)
        comm.barrier()
        if comm.rank == 0:
            result = self._serve(comm, params, counts, dtype, steps * (p - 1), alloc, header)
        else:
            result = self._work(comm, params, patterns, steps, header)
        reports = comm.gather_object(result, root=0)
        comm.barrier()
        if comm.rank != 0:
            return []
        server = reports[0]
        n_even = sum(1 for w in range(1, p) for s in range(steps) if (w + s) % 2 == 0)
        n_odd = steps * (p - 1) - n_even
        ok = all(close(x, -(n_even * pat0.astype(np.float64) + n_odd * pat1.astype(np.float64)))
                 for x, pat0, pat1 in zip(params, patterns[0], patterns[1]))
        check = "passed" if ok and server["pushes"] == steps * (p - 1) else "failed"
        worker_times = np.array([reports[w]["step_s"] for w in range(1, p)])
        staleness = np.array(server["staleness"])
        more = {"pushes_per_s": server["pushes"] / server["elapsed_s"],
                "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
                "steps_per_worker": steps, "workers": p - 1}
        common = dict(op=None, iterations=steps, warmup=0, check=check, nmessages=len(counts),
                      busbw_factor=1.0, **more)
        return [
            base.phase_record(comm, plan, spec, "step", worker_times,
                              algbw_bytes=spec.nbytes, **common),
            base.phase_record(comm, plan, spec, base.APPLY, np.array([server["apply_s"]]),
                              algbw_bytes=spec.nbytes, **{**common, "iterations": len(server["apply_s"])}),
        ]

    @staticmethod
    def _serve(comm, params, counts, dtype, total, alloc, header):
        grads = [alloc(dtype, n) for n in counts]
        version, apply_s, staleness = 0, [], []
        reply = np.zeros(1, np.int64)
        start = clock()
        for _ in range(total):
            source = comm.recv_any(header, PUSH)
            for g in grads:
                comm.recv(g, source, PUSH)
            t0 = clock()
            for x, g in zip(params, grads):
                np.subtract(x, g, out=x)
            apply_s.append(clock() - t0)
            staleness.append(version - int(header[0]))
            version += 1
            reply[0] = version
            comm.send(reply, source, PULL)
            for x in params:
                comm.send(x, source, PULL)
        return {"pushes": total, "elapsed_s": clock() - start, "apply_s": apply_s,
                "staleness": staleness}

    @staticmethod
    def _work(comm, params, patterns, steps, header):
        step_s = []
        version = 0
        for s in range(steps):
            t0 = clock()
            header[0] = version
            comm.send(header, 0, PUSH)
            for g in patterns[(comm.rank + s) % 2]:
                comm.send(g, 0, PUSH)
            comm.recv(header, 0, PULL)
            for x in params:
                comm.recv(x, 0, PULL)
            version = int(header[0])
            step_s.append(clock() - t0)
        return {"step_s": step_s}


PS_SYNC = PSSync()
PS_ASYNC = PSAsync()
