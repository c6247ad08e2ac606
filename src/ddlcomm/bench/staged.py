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

from ..measure.checks import verdict
from ..measure.records import backend_facts, make_record
from ..workloads.base import phase_bytes, timed_phases
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
        table, iterations, warmup, copied, bars = timed_phases(
            comm, stage.run, len(phases), plan.budget_s, plan.iters, plan.warmup, stage.copied(), path)
        extra = {**path.facts(comm), **backend_facts(comm), "path": spec.path}
    if table is None:
        return []
    moved = count * dtype.itemsize

    def record(k: int, phase: str) -> dict:
        nbytes, factor, more = phase_bytes(phase, coll if phase == coll.name else None, moved, comm.size,
                                           copied, bars)
        return make_record(
            comm, collective=coll.name, form="buffer", dtype=dtype.name, op=op.name if op else None,
            nbytes=moved, count=count, root=plan.root, in_place=in_place, iterations=iterations,
            warmup=warmup, times=table[:, :, k], algbw_bytes=nbytes, busbw_factor=factor, check=check,
            extra={**extra, "phase": phase, **more})
    # the whole collective counts its algbw bytes and bus factor, a copy part the most bytes a
    # rank copies in it and carries its bars, the collective part the message
    return [record(k, phase) for k, phase in enumerate(phases)]
