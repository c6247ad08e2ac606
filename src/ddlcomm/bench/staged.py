"""Points of a collective along a GPU data path (``--collective X --path host-staged``).

The collective's data lives where the path puts it (the GPU); the path turns
the call into separately timed parts (host-staged: ``d2h``, the collective on
pinned host buffers, ``h2d``).  Inputs are filled and the result verified on
host copies, as for every point; the timed loop is the workloads' phase loop
(a barrier before each call, each part timed apart), and rank 0 stores one
record per phase: the whole collective (``phase`` = its name) and each part
(``phase`` = ``allreduce.d2h``...), all with the path and the pinned copy
bandwidth measured alone in the same run.
"""
from __future__ import annotations

from ..measure import timing
from ..measure.checks import verdict
from ..measure.records import backend_facts, make_record
from ..workloads.base import copy_bytes
from ..workloads.paths import get_path
from .buffers import PointBuffers
from .plan import BenchPlan, CollectivePoint, PointSpec


def measure_staged(comm, plan: BenchPlan, spec: PointSpec) -> list[dict]:
    """Check and time one collective along ``spec.path``; rank 0 returns a record per phase."""
    coll, dtype, op, count, in_place = CollectivePoint.of(plan, spec, comm.size)
    with PointBuffers(plan.memory, plan.hbw_fallback) as bufs, \
            get_path(spec.path).open(comm, plan, bufs.alloc, server=False) as path:
        side = path.side
        send, recv = coll.buffers(dtype, count, comm.rank, comm.size, op, plan.root, in_place)
        dsend = side.alloc(dtype, send.size)
        drecv = None if recv is None else dsend if recv is send else side.alloc(dtype, recv.size)
        stage = path.stage(comm, coll.name, dsend, drecv, op.name if op else None, plan.root)

        def reset() -> None:
            coll.reset(send, recv, dtype, count, comm.rank, op, plan.root)
            side.load(dsend, send)
            if drecv is not None and drecv is not dsend:
                side.load(drecv, recv)

        reset()
        check = "skipped"
        if plan.check:
            comm.barrier()
            stage.run()
            where = coll.result_of(dsend, drecv)
            got = None if where is None else side.read(where)
            expected = coll.expected(dtype, count, comm.rank, comm.size, op, plan.root)
            check = verdict(comm, coll.verify(got, expected, dtype))
        phases = stage.phases()
        times, iterations, warmup = timing.calibrate(
            comm, timing.phases(comm, stage.run, len(phases)), plan.budget_s, plan.iters,
            plan.warmup)
        mine = stage.copied()
        copied, bars = copy_bytes(comm, mine), path.copy_bars(comm, mine)
    facts = backend_facts(comm)
    return _records(comm, coll, dtype, op, count, times, phases, plan.root, in_place,
                    iterations, warmup, check, copied, bars,
                    {**path.facts(comm), **facts, "path": spec.path})


def _records(comm, coll, dtype, op, count, times, phases, root, in_place, iterations, warmup,
             check, copied, bars, extra) -> list[dict]:
    """Every rank's (iterations x phases) times gathered to rank 0: one record per phase
    (the whole collective counts its algbw bytes and bus factor, a copy part the most bytes
    a rank copies in it (``copied``) and carries its bars (``bars``), the collective part
    the message)."""
    gathered = comm.gather(times.reshape(-1), root=0)
    if comm.rank != 0:
        return []
    table = gathered.reshape(comm.size, iterations, len(phases))
    moved = count * dtype.itemsize

    def record(k: int, phase: str) -> dict:
        whole, part_bytes = phase == coll.name, copied.get(phase)
        return make_record(
            comm, collective=coll.name, form="buffer", dtype=dtype.name,
            op=op.name if op else None, nbytes=moved, count=count, root=root,
            in_place=in_place, iterations=iterations, warmup=warmup, times=table[:, :, k],
            algbw_bytes=coll.algbw_bytes(moved, comm.size) if whole else
            moved if part_bytes is None else part_bytes,
            busbw_factor=coll.busbw_factor(comm.size) if whole else 1.0, check=check,
            extra={**extra, "phase": phase,
                   **({} if part_bytes is None else {"copy_bytes": part_bytes}),
                   **bars.get(phase, {})})
    return [record(k, phase) for k, phase in enumerate(phases)]
