"""Points of ``--impl c``: the C reference's timing loop, called inside the ranks.

The C loop (``bench/c/ddlcomm_cref.c``, loaded through ctypes) runs on the
same communicator, buffers and memory kind as the Python forms, and follows
the same protocol, so ``--impl c,buffer,object`` compares like with like in
one run, interleaved per size.
"""
from __future__ import annotations

import numpy as np

from ..measure import timing
from ..measure.checks import verdict
from ..measure.records import collective_records
from .buffers import PointBuffers
from .cref import CReference
from .plan import BenchPlan, CollectivePoint, PointSpec

_REFERENCES: dict[int, CReference] = {}


def _reference(comm) -> CReference:
    """The C reference bound to ``comm`` (built and loaded on first use; it refuses a
    backend other than mpi)."""
    ref = _REFERENCES.get(id(comm))
    if ref is None:
        ref = _REFERENCES[id(comm)] = CReference(comm)
    return ref


def measure_c(comm, plan: BenchPlan, spec: PointSpec) -> list[dict]:
    """Check, calibrate and time one collective through the C loop; rank 0 returns its record
    (what the C reference can time was checked with the plan: ``ABILITIES.check_request``)."""
    coll, dtype, op, count, _ = CollectivePoint.of(plan, spec, comm.size)
    ref = _reference(comm)
    with PointBuffers(plan.memory, plan.hbw_fallback) as bufs:
        send, recv = coll.buffers(dtype, count, comm.rank, comm.size, op, plan.root, False,
                                  bufs.alloc)
        if coll.in_send and comm.rank != plan.root:
            send[:] = 0

        def timed(iters: int, warmup: int) -> np.ndarray:
            return ref.time(spec.name, send, recv, plan.root, iters, warmup)

        check = "skipped"
        if plan.check:
            timed(1, 0)
            expected = coll.expected(dtype, count, comm.rank, comm.size, op, plan.root)
            check = verdict(comm, coll.verify(coll.result_of(send, recv), expected, dtype))
        times, iterations, warmup = timing.calibrate(comm, timed, plan.budget_s, plan.iters,
                                                     plan.warmup)
        pages = bufs.placement(comm)
        extra = {"pages": pages}
        if op is not None and count:          # the floor the buffer form's points have
            extra["add_us"] = timing.add_us(comm, op, dtype, count, bufs.alloc, plan.budget_s / 4)
    return collective_records(comm, coll, dtype, op, count, times, form="c", root=plan.root,
                              in_place=False, iterations=iterations, warmup=warmup, check=check,
                              extra=extra)
