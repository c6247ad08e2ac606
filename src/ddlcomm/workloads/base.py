"""What every workload shares: its messages, its timed loop, its records.

A workload's size is a list of messages: one of ``--sizes`` bytes, or a
model's gradients (per layer, or fused into ``--fusion`` buckets) in the order
back-propagation produces them.  Sync workloads time whole steps under the
collectives' protocol (barrier before each step) with a time per phase.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..dtypes import DType, get_dtype
from ..errors import UsageError
from ..measure import timing
from ..measure.records import make_record
from . import get_workload, models
from .paths import get_path


def message_bytes(plan, nbytes: int) -> list[int]:
    """The messages of one step: the model's gradients, or one message of ``nbytes``."""
    if plan.model is None:
        return [nbytes]
    itemsize = get_dtype(plan.dtype).itemsize
    if plan.fusion:
        return models.fuse([b for _, b in models.gradient_sizes(plan.model, itemsize)], plan.fusion)
    return [b for _, b in models.per_layer(plan.model, itemsize)]


def model_bytes(model: str, dtype: str) -> int:
    """Total gradient bytes of ``model`` in ``dtype``."""
    return models.total_parameters(model) * get_dtype(dtype).itemsize


def check_request(plan) -> None:
    """Workloads aggregate gradients: a float dtype, host data, enough ranks."""
    if not get_dtype(plan.dtype).is_float:
        raise UsageError(f"workloads aggregate gradients: --dtype {plan.dtype} is not a float type",
                         "use float32 (or float16, float64)")
    get_path(plan.path)
    for name in plan.workloads:
        workload = get_workload(name)
        if plan.ranks is not None and plan.ranks < workload.min_ranks:
            raise UsageError(f"{name} needs at least {workload.min_ranks} ranks "
                             "(a server and a worker)", f"use --ranks {workload.min_ranks} or more")


def counts(plan, nbytes: int) -> tuple[DType, list[int]]:
    dtype = get_dtype(plan.dtype)
    return dtype, [b // dtype.itemsize for b in message_bytes(plan, nbytes)]


def calibrated_phases(comm, plan, step, nphases: int):
    """Probe, choose iterations (``--steps``/``--iters``/budget) and warm-up, then time
    (iterations x nphases) phase durations, the whole step last."""
    return timing.calibrate(comm, timing.phases(comm, step, nphases), plan.budget_s,
                            plan.steps or plan.iters, plan.warmup)


def extra_fields(plan, workload: str, phase: str, nmessages: int, **more) -> dict:
    extra = {"workload": workload, "phase": phase, "path": plan.path, "messages": nmessages}
    if plan.model is not None:
        extra.update(model=plan.model, fusion=plan.fusion or 0)
    extra.update(more)
    return extra


def phase_record(comm, plan, spec, phase: str, times: np.ndarray, *, op: Optional[str],
                 iterations: int, warmup: int, check: str, nmessages: int,
                 algbw_bytes: int, busbw_factor: float, **more) -> dict:
    """The stored record of one phase of a workload (times: ranks x iterations, seconds)."""
    dtype = get_dtype(plan.dtype)
    return make_record(
        comm, collective=spec.name, form="buffer", dtype=dtype.name, op=op,
        nbytes=spec.nbytes, count=spec.nbytes // dtype.itemsize, root=0, in_place=True,
        iterations=iterations, warmup=warmup, times=times, algbw_bytes=algbw_bytes,
        busbw_factor=busbw_factor, check=check,
        extra=extra_fields(plan, spec.name, phase, nmessages, **more))

