"""What every workload shares: its messages, its timed loop, its records.

A workload's size is a list of messages: one of ``--sizes`` bytes, or a
model's gradients (per layer, or fused into ``--fusion`` buckets) in the order
back-propagation produces them.  Sync workloads time whole steps under the
collectives' protocol (barrier before each step) with a time per phase.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from ..collectives import COLLECTIVES, pattern, repeat
from ..dtypes import DType, get_dtype
from ..comm import registry
from ..errors import UnsupportedError, UsageError
from ..measure import timing
from ..measure.records import make_record
from . import get_workload, models
from .paths import check_path


#: The phase that applies the gradients: local computation, so its record has a time and
#: no bandwidth (bytes over its time would be a compute rate, drawn and averaged as if
#: the network had carried them).
APPLY = "apply"


def message_bytes(plan, nbytes: int) -> list[int]:
    """The messages of one step: the model's gradients, or one message of ``nbytes``."""
    if plan.model is None:
        return [nbytes]
    itemsize = get_dtype(plan.dtype).itemsize
    if plan.fusion is not None:         # 0: a message per tensor (fuse's), not per layer
        return models.fuse([b for _, b in models.gradient_sizes(plan.model, itemsize)], plan.fusion)
    return [b for _, b in models.per_layer(plan.model, itemsize)]


def model_bytes(model: str, dtype: str) -> int:
    """Total gradient bytes of ``model`` in ``dtype``."""
    return models.total_parameters(model) * get_dtype(dtype).itemsize


def check_request(plan) -> None:
    """Workloads aggregate gradients: a float dtype, data paths that can run here and that
    the workloads run along, enough ranks."""
    if not get_dtype(plan.dtype).is_float:
        raise UsageError(f"workloads aggregate gradients: --dtype {plan.dtype} is not a float type",
                         "use float32 (or float16, float64)")
    for name in plan.workloads:
        workload = get_workload(name)
        refused = [p for p in plan.paths if workload.paths and p not in workload.paths]
        if refused:
            raise UsageError(f"{name} runs along --path {', '.join(workload.paths)} only, "
                             f"not {', '.join(refused)}", f"measure {name} in a run of its own")
        lacking = [b for b in plan.backends
                   if workload.any_source and not registry.get_spec(b).any_source]
        if lacking:
            raise UnsupportedError(f"{name}'s server receives from whichever worker sends first, "
                                   f"which backend {', '.join(lacking)} cannot",
                                   "use --backend mpi or gloo")
        if plan.warmup is not None and not workload.warms_up:
            raise UsageError(f"--warmup: {name} times every push, the first ones too (its check "
                             "counts every push the server applies)", f"drop --warmup for {name}")
        if plan.ranks is not None and plan.ranks < workload.min_ranks:
            raise UsageError(f"{name} needs at least {workload.min_ranks} ranks "
                             "(a server and a worker)", f"use --ranks {workload.min_ranks} or more")
    for path in plan.paths:
        check_path(path, plan)


def counts(plan, nbytes: int) -> tuple[DType, list[int]]:
    dtype = get_dtype(plan.dtype)
    return dtype, [b // dtype.itemsize for b in message_bytes(plan, nbytes)]


def mean_input(dtype: DType, count: int, ranks) -> np.ndarray:
    """The float64 mean of the collectives' inputs (``fill``) of ``ranks``: the mean of one
    row of each (:func:`~ddlcomm.collectives.pattern`), repeated."""
    if not count:
        return np.zeros(0)
    return repeat(np.mean([pattern(dtype, r, None).astype(np.float64) for r in ranks], axis=0),
                  count)


def timed_phases(comm, step, nphases: int, budget_s: float, iters: Optional[int], warmup: Optional[int],
                 copies: Mapping[str, int], path) -> tuple:
    """Time ``step`` (returning the durations of its ``nphases`` phases) under the protocol;
    returns every rank's times as a (ranks x iterations x phases) table on rank 0 (None on
    the others), the iterations, the warm-up, and per copy phase of ``copies`` (this rank's
    bytes) the most bytes a rank copies (:func:`copy_bytes`) and the bars ``path`` (the
    opened data path) measures for them."""
    times, iterations, warmup = timing.calibrate(comm, timing.phases(comm, step, nphases),
                                                 budget_s, iters, warmup)
    copied, bars = copy_bytes(comm, copies), path.copy_bars(comm, copies)
    gathered = comm.gather(times.reshape(-1), root=0)
    table = gathered.reshape(comm.size, iterations, nphases) if comm.rank == 0 else None
    return table, iterations, warmup, copied, bars


def phase_bytes(phase: str, coll, nbytes: int, p: int, copied: Mapping[str, int],
                bars: Mapping[str, dict]) -> tuple[int, float, dict]:
    """A phase's (algbw bytes, bus factor, extra fields) (pure): a copy phase of ``copied``
    the most bytes a rank copies, with its bars, over its slowest copier's time (the ranks
    that copy nothing in it record about 0 s: over the mean it read up to p times fast); a
    collective's phase (``coll``) that collective's bytes and factor for an ``nbytes``
    message on ``p`` ranks; else the message."""
    if phase in copied:
        return copied[phase], 1.0, {"copy_bytes": copied[phase], "bandwidth_time": "t_max_us",
                                    **bars.get(phase, {})}
    if coll is None:
        return nbytes, 1.0, {}
    return coll.algbw_bytes(nbytes, p), coll.busbw_factor(p), {}


def timed_steps(comm, plan, spec, step, phases: Sequence[str], *, check: str, nmessages: int,
                op: Optional[str], server_phases: Sequence[str] = (),
                copies: Optional[Mapping[str, int]] = None, path, **more) -> list[dict]:
    """Time ``step`` (returning the durations of ``phases``, the whole step last) under the
    protocol (``--steps``/``--iters``/budget, warm-up); rank 0 returns one record per phase.

    A phase named after a collective counts that collective's algbw bytes and bus
    factor; a copy phase of ``copies`` (this rank's bytes per phase) the most bytes a
    rank copies, and carries the bars ``path`` (the opened data path) measures for those
    bytes (:func:`phase_bytes`); every record keeps ``path.facts``; ``server_phases`` are
    the server's (rank 0's) time alone.
    """
    table, iterations, warmup, copied, bars = timed_phases(
        comm, step, len(phases), plan.budget_s, plan.steps or plan.iters, plan.warmup, copies or {}, path)
    more = {**path.facts(comm), **more}
    if table is None:
        return []
    p = comm.size
    records = []
    for k, phase in enumerate(phases):
        nbytes, factor, extra = phase_bytes(phase, COLLECTIVES.get(phase), spec.nbytes, p, copied, bars)
        records.append(phase_record(
            comm, plan, spec, phase, table[:1 if phase in server_phases else p, :, k], op=op,
            iterations=iterations, warmup=warmup, check=check, nmessages=nmessages,
            algbw_bytes=nbytes, busbw_factor=factor, **{**more, **extra}))
    return records


def copy_bytes(comm, copies: Mapping[str, int]) -> dict[str, int]:
    """Per copy phase, the most bytes a rank copies in it (``copies``: this rank's; every
    rank has the same phases). A copy phase's time is its slowest copier's, and a
    gather's root copies the whole table back: its record counts those bytes."""
    return {phase: int(timing.agree_max(comm, float(n))) for phase, n in copies.items()}


def extra_fields(plan, spec, phase: str, nmessages: int, **more) -> dict:
    extra = {"workload": spec.name, "phase": phase, "path": spec.path, "messages": nmessages}
    if plan.model is not None:
        extra.update(model=plan.model, fusion=plan.fusion)      # None: a message per layer
    extra.update(more)
    return extra


def phase_record(comm, plan, spec, phase: str, times: np.ndarray, *, op: Optional[str],
                 iterations: int, warmup: int, check: str, nmessages: int,
                 algbw_bytes: int, busbw_factor: float, **more) -> dict:
    """The stored record of one phase of a workload (times: ranks x iterations, seconds);
    :data:`APPLY` without a bandwidth."""
    dtype = get_dtype(plan.dtype)
    record = make_record(
        comm, collective=spec.name, form="buffer", dtype=dtype.name, op=op,
        nbytes=spec.nbytes, count=spec.nbytes // dtype.itemsize, root=0, in_place=True,
        iterations=iterations, warmup=warmup, times=times, algbw_bytes=algbw_bytes,
        busbw_factor=busbw_factor, check=check,
        extra=extra_fields(plan, spec, phase, nmessages, **more))
    if phase == APPLY:
        record["algbw_GBps"] = record["busbw_GBps"] = None
    return record

