"""The in-rank side of ``ddlcomm bench``: pre-flight, then measure every point.

Timing protocol (README, "Timing protocol"; as OSU and nccl-tests): an untimed check call whose
result is verified; warm-up calls; then per timed iteration ``barrier; t0;
collective; t1`` on every rank.  Rank 0 gathers every rank's per-call times,
summarises them (:mod:`ddlcomm.measure`) and stores the point at once.
Workloads (:mod:`ddlcomm.workloads`) follow the same protocol per step.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Any, Optional

import numpy as np
from tqdm import tqdm

from .. import kernels
from ..comm import algorithms, tuning
from ..comm.device import one_gpu
from ..comm.nodes import same_node
from ..dtypes import get_dtype
from ..errors import EveryRankError, UnsupportedError, UsageError
from ..kernels.device import copy_pass
from ..launch.placement import format_cpulist, split_ranks, transport
from ..measure import timing
from ..measure.calls import prepare
from ..measure.checks import verdict
from ..measure.records import backend_facts, collective_records, facts_at_root
from ..memory import heap
from ..memory import kind as memory_kind
from ..memory.gpu import use_gpu
from ..units import counted
from ..workloads import get_workload
from ..workloads.paths import PATHS
from .buffers import PointBuffers
from .cimpl import measure_c
from .plan import BenchPlan, CollectivePoint, PointSpec, check_whole_blocks, on_device
from .staged import measure_staged
from .watchdog import Watchdog

#: "tty" or "plain": whether the owner's stderr is a terminal (rank 0's never is under a launcher).
PROGRESS_ENV = "DDLCOMM_PROGRESS"


def measure_collective(comm, plan: BenchPlan, spec: PointSpec) -> list[dict]:
    """Check, warm up and time one collective; rank 0 returns its record."""
    coll, dtype, op, count, in_place = CollectivePoint.of(plan, spec, comm.size)
    algorithm = spec.algorithm
    extra: dict[str, Any] = {}
    if algorithm != "library":
        algorithm, by = algorithms.decide(
            spec.name, algorithm, count * dtype.itemsize, comm.size, one_node=same_node(comm),
            tuning=tuning.load(plan.tuning) if plan.tuning else None, library=comm.library,
            on_device=on_device(plan), one_device=on_device(plan) and one_gpu(comm),
            host_messages="host" in comm.memories)
        if by != "asked":
            extra["auto_by"] = by if by == "rules" else f"tuning {plan.tuning}"
    with PointBuffers(plan.memory, plan.hbw_fallback) as bufs:
        if algorithm != "library" and not bufs.on_device:     # device: the call says (facts)
            reducer = algorithms.kernel(algorithm, op, dtype.numpy)
            if reducer is not None:
                extra["kernel"] = kernels.describe(reducer)
        prepared = prepare(coll, comm, spec.form, dtype, count, op, plan.root, in_place,
                           bufs.alloc, algorithm=algorithm, device=bufs.device_copies(),
                           kind_cache=plan.kind_cache)
        check = "skipped"
        if plan.check:
            prepared.reset()
            comm.barrier()
            prepared.run()
            comm.sync()
            expected = coll.expected(dtype, count, comm.rank, comm.size, op, plan.root)
            check = verdict(comm, coll.verify(prepared.result(), expected, dtype))
        times, iterations, warmup = timing.calibrate(comm, timing.calls(comm, prepared.run),
                                                     plan.budget_s, plan.iters, plan.warmup)
        pages = bufs.placement(comm)
        extra.update(facts_at_root(comm, prepared.facts()))   # what each rank's bound call ran
        del prepared                      # its views die with the buffers
        if op is not None and spec.form == "buffer" and count:
            if bufs.on_device:
                extra["floor_us"] = timing.pass_us(comm, copy_pass, bufs.tensor(dtype, count),
                                                   bufs.tensor(dtype, count), plan.budget_s / 4,
                                                   slowest=True)
            else:
                extra["add_us"] = timing.add_us(comm, op, dtype, count, bufs.alloc,
                                                plan.budget_s / 4)
    extra.update(backend_facts(comm))
    return collective_records(comm, coll, dtype, op, count, times, form=spec.form,
                              root=plan.root, in_place=in_place, iterations=iterations,
                              warmup=warmup, check=check, algorithm=spec.algorithm,
                              extra={"pages": pages, "algorithm_run": algorithm, **extra})


def measure_workload(comm, plan: BenchPlan, spec: PointSpec) -> list[dict]:
    """A workload's phases, its buffers (zeroed) in the run's memory kind (on its data path)."""
    with PointBuffers(plan.memory, plan.hbw_fallback) as bufs:
        def alloc(dtype, count: int) -> np.ndarray:
            out = bufs.alloc(dtype, count)
            out[...] = 0
            return out
        records = get_workload(spec.name).measure(comm, plan, spec, alloc)
        pages = bufs.placement(comm)
    facts = backend_facts(comm)
    for record in records:
        record["extra"].update(facts, pages=pages)
    return records


#: How each kind of point is measured.
MEASURES = {"collective": measure_collective, "workload": measure_workload, "c": measure_c,
            "staged": measure_staged}


def placement_fields(plan: BenchPlan, nranks: int, cpus: Optional[list[str]] = None,
                     hosts: Optional[list[str]] = None) -> dict:
    """Where the ranks and buffers were: stored with every point of the run.

    ``transport`` names, for each pair of ranks, the path their MPI takes as
    inferred from the placement (shared memory within a container or on one
    host, TCP between containers, the network between hosts, e.g. the nodes of
    a Slurm job): the libraries do not report it per pair.  ``hosts`` is each
    rank's host name as the rank read it.  ``cpus`` is each rank's CPU
    affinity as the rank itself read it (taskset's list syntax), so a binding
    is recorded as it was applied, not as asked.
    """
    groups = split_ranks(nranks, plan.containers or 1)
    where = {r: i for i, g in enumerate(groups) for r in g}
    across = "tcp"
    if hosts is not None and not plan.containers and len(set(hosts)) > 1:
        where, across = {r: hosts.index(h) for r, h in enumerate(hosts)}, "network"
    pairs = {f"{a}-{b}": transport(where[a], where[b], across)
             for a in range(nranks) for b in range(a + 1, nranks)}
    return {"memory": plan.memory or "numpy", "containers": plan.containers,
            "ranks_per_container": [len(g) for g in groups] if plan.containers else [],
            "bind": plan.bind, "transport": pairs, **({"cpus": cpus} if cpus is not None else {}),
            **({"hosts": hosts} if hosts is not None else {})}


def needs_gpu(plan: BenchPlan) -> bool:
    """Whether the run's memory kind or one of its data paths puts data on a GPU."""
    return (plan.memory is not None and memory_kind(plan.memory).gpu) or \
        any(PATHS[p].needs_gpu for p in plan.paths)


def gpu_fields(uuids: list[str], gpus: list[int]) -> dict:
    """Each rank's GPU (``local_rank % gpus``) and how many ranks shared that physical GPU
    (its uuid: ranks in containers have host names of their own, and a rank given its own
    ``CUDA_VISIBLE_DEVICES`` calls any GPU index 0) (pure)."""
    return {"gpu": gpus, "ranks_per_gpu": [uuids.count(u) for u in uuids]}


def check_plan(comms: dict, plan: BenchPlan) -> None:
    """Refuse, before measuring anything, what a backend declares it cannot do, and sizes
    too small for the job's ranks (started by a launcher of the user's, they were not known):
    every rank finds it alike, so rank 0 alone says it and no rank aborts the others."""
    try:
        _check_plan(comms, plan)
    except (UsageError, UnsupportedError) as exc:
        raise EveryRankError(exc.args[0], exc.hint) from None


def _check_plan(comms: dict, plan: BenchPlan) -> None:
    dtype = get_dtype(plan.dtype)
    check_whole_blocks(plan, next(iter(comms.values())).size)
    for spec in plan.points():
        comm = comms[spec.backend]
        if dtype.name not in comm.dtypes:
            raise UnsupportedError(f"backend {comm.name} cannot carry {dtype.name}",
                                   f"supported: {', '.join(comm.dtypes)}")
        if spec.kind in ("collective", "staged") and spec.form == "buffer":
            comm.check_supported(spec.name)


def preflight(comms: dict, plan: BenchPlan, watchdog: Watchdog) -> None:
    """Every rank answers on every backend within the limit, and the job has the size asked for."""
    for name, comm in comms.items():
        with watchdog.guard(f"pre-flight on {name} (every rank answering)", min(plan.timeout_s, 60.0)):
            comm.allgather_object((comm.rank, socket.gethostname(), os.getpid()))
        if plan.ranks is not None and comm.size != plan.ranks:
            raise EveryRankError(f"the launcher started {comm.size} ranks but --ranks {plan.ranks} "
                                 "was asked", "start as many ranks as --ranks says, or leave --ranks out")
        if plan.root >= comm.size:          # under a launcher of yours, first known here
            raise EveryRankError(f"--root {plan.root} is not one of the {comm.size} ranks "
                                 "the launcher started", f"use --root 0 to {comm.size - 1}")


def run_sweep(comms: dict, plan: BenchPlan, watchdog: Watchdog, store: Any,
              run_id: Optional[int]) -> int:
    """Measure every point of ``plan``; rank 0 stores each record as it completes.

    Returns the number of records whose check failed (the same on every rank).
    """
    first = next(iter(comms.values()))
    points = plan.points(first.size)
    progress = None
    if first.rank == 0:
        # Into a log file, a redraw every few seconds is enough.
        plain = os.environ.get(PROGRESS_ENV, "plain" if not sys.stderr.isatty() else "tty") == "plain"
        progress = tqdm(total=len(points), unit="pt", file=sys.stderr, leave=True,
                        desc=f"{','.join(plan.backends)} {counted(first.size, 'rank')}",
                        dynamic_ncols=not plain,
                        mininterval=5.0 if plain else 0.1, ncols=100 if plain else None)
    failed = 0
    heap_used = heap.apply(plan.heap)
    place = use_gpu(first.local_rank) if needs_gpu(plan) else None
    gpu = None if place is None else (place["gpu"], place["gpu_uuid"])
    where = first.allgather_object((format_cpulist(sorted(os.sched_getaffinity(0))),
                                    socket.gethostname(), gpu))
    common = placement_fields(plan, first.size, [w[0] for w in where], [w[1] for w in where])
    common["heap"] = heap_used
    if gpu is not None:
        common.update(gpu_fields([w[2][1] for w in where], [w[2][0] for w in where]))
    try:
        for spec in points:
            label = spec.label(len(plan.backends) > 1)
            if progress is not None:
                progress.set_postfix_str(label, refresh=False)
            with watchdog.guard(label):
                records = MEASURES[spec.kind](comms[spec.backend], plan, spec)
            for record in records:
                record["extra"] = {**common, **record["extra"]}
                failed += record["check"] == "failed"
                store.add_point(run_id, record)
            if progress is not None:
                progress.update(1)
    finally:
        if progress is not None:
            progress.close()
    flag = np.array([failed], np.int64)
    first.broadcast(flag, 0)
    return int(flag[0])
