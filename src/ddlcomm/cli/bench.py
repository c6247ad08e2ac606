"""``ddlcomm bench``: its options, and the hand-over to the benchmark session.

The options are checked by ``bench/plan.py`` (:func:`~ddlcomm.bench.plan.resolve`)
before any rank starts; outside a launcher this command owns the run, under one
it is one of the ranks.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Optional

from ..bench.plan import (BenchOptions, BenchPlan, check_fits, check_ranks, mem_available, resolve,
                          staged_note, usable_cpus)
from ..bench.runs import owners_run
from ..comm import registry
from ..errors import UsageError
from ..launch.containers import check_available
from ..launch.env import detect
from ..memory import heap
from . import common


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="time collectives over a backend, verify and store them",
                       description=(
                           "Time collectives the way OSU and nccl-tests do (warm-up, a barrier "
                           "before each timed call, per-call times per rank), verify every point "
                           "on an untimed call, store the results and write a report. Outside a "
                           "launcher it starts --ranks ranks itself; under mpirun/srun/torchrun "
                           "it runs in the ranks it was given."))
    b.add_argument("--backend", default="mpi",
                   help="communication backend, or a comma list measured side by side in one "
                        f"run, interleaved per size: {', '.join(registry.BACKENDS)} (default: mpi)")
    b.add_argument("--collective",
                   help="comma list of: broadcast, gather, allgather, reduce, allreduce, "
                        "reduce_scatter, alltoall, barrier (default: broadcast,gather,allreduce, those "
                        "of them that have every --algorithm named)")
    b.add_argument("--workload", help="data-parallel workloads instead of collectives, a comma "
                                      "list measured side by side: ps-sync, ps-async, allreduce")
    b.add_argument("--sizes",
                   help="LO:HI[xF] sweep (LO, LO*F, LO*F^2, ... to HI; default x2) or a comma list, "
                        "per-rank message bytes (default: one element of --dtype to 64MiB, "
                        "4B:64MiB for float32)")
    b.add_argument("--model", help="workloads: send a model's gradients, per layer "
                                   "(alexnet, googlenet, resnet50, mobilenet, vgg16)")
    b.add_argument("--fusion", metavar="BYTES",
                   help="workloads with --model: fuse gradients into buckets of at most BYTES "
                        "(e.g. 25MiB; 0: per tensor); without it, one message per layer")
    b.add_argument("--steps", help="workloads: timed steps (ps-async: pushes per worker, default 100, "
                                   "every one timed: no --warmup, no --budget)")
    b.add_argument("--path",
                   help="data path, or a comma list measured side by side: host (default) or the "
                        "GPU paths host-staged, direct (also for single collectives), "
                        "nccl-chief (workloads only); they need a GPU.  A path applies to the "
                        "library's collectives: ddlcomm's own algorithms beside it run on the "
                        "buffers themselves (then one path).  Left out on --memory device, an "
                        "MPI's collectives go host-staged (a GPU pointer goes to an MPI only on "
                        "direct, where it says it is CUDA-aware), nccl's and gloo's on the device "
                        "buffers")
    b.add_argument("--dtype", default="float32",
                   help="float16, bfloat16, float32, float64, int32, int64, uint8 (default: float32)")
    b.add_argument("--op", default="sum", help="sum, prod, min, max, avg (default: sum)")
    b.add_argument("--form", choices=["buffer", "object", "both"],
                   help="buffer calls (NumPy arrays), pickled-object calls, or both (default; "
                        "buffer on --memory device or along a GPU --path, where object is refused)")
    b.add_argument("--algorithm", default="library",
                   help="comma list of algorithms measured side by side: library (the backend's "
                        "own collective), auto, or ddlcomm's own (ring, rhd, shm, shm-map, "
                        "hierarchical, binomial, linear, ...; buffer form); NAME+numpy or NAME+c picks the "
                        "reduction kernel (default: the compiled one), on --memory device "
                        "NAME+torch or NAME+cupy (default torch); NAME@SIZE the piece a "
                        "pipelined all-reduce moves at a time (shm@256KiB, ring@1MiB); "
                        "default library")
    b.add_argument("--tuning", metavar="FILE",
                   help="a table of `ddlcomm model tune` (what was fastest on this machine): "
                        "--algorithm auto runs its choice where it has the library, collective "
                        "and rank count, else its rules; recorded with each point as auto_by")
    b.add_argument("--impl", help="implementations side by side, a comma list of c (the C "
                                  "reference, same protocol and buffers), buffer, object; "
                                  "instead of --form")
    b.add_argument("--memory", help="memory kind of the benchmark buffers: pageable, hugepage, "
                                    "numa:N, hbw, shared, pinned, device (default: NumPy's "
                                    "allocator, recorded as numpy)")
    b.add_argument("--kind-cache", choices=None, metavar="on|off",
                   help="ddlcomm's own algorithms on --memory device: look each buffer's kind "
                        "(host or device) up once (on, the default) or ask the CUDA driver on "
                        "every call (off), as awan2019 compares; recorded with each point")
    b.add_argument("--heap", choices=heap.HEAPS, default="glibc",
                   help="the C library's heap in the ranks: glibc (default) leaves its adaptive "
                        "thresholds, so the object form's calls pay the page faults of a heap "
                        "that has seen no block larger than the point's (1.3-3.7x the time at "
                        f"1-16 MiB, 2 ranks); steady fixes them first ({heap.steady_thresholds()}), "
                        "as a process that has freed a large block runs; recorded with each point")
    b.add_argument("--hbw-fallback", choices=["dram"],
                   help="with --memory hbw on a machine without high-bandwidth memory: "
                        "use DRAM instead of failing (recorded with every point)")
    b.add_argument("--containers", help="split the ranks into K containers made of Linux "
                                        "namespaces (network, IPC, mount, UTS; needs root)")
    b.add_argument("--bind", default="none", choices=["none", "core", "numa"],
                   help="bind ranks (and containers) to cores or NUMA nodes (default: none)")
    b.add_argument("--in-place", action="store_true",
                   help="reduce in place where the collective can (allreduce, reduce; the "
                        "others run out of place, and each point records which)")
    b.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="verify every point on an untimed call (default: on)")
    b.add_argument("--ranks", help="number of ranks (default: 2, or the launcher's)")
    common.add_oversubscribe(b)
    b.add_argument("--iters", help="timed iterations per point (default: fit --budget)")
    b.add_argument("--warmup", help="untimed warm-up calls per point (default: iters/10, 2..200)")
    b.add_argument("--budget", default="0.2",
                   help="seconds of timed calls per point when --iters is not given (default 0.2)")
    b.add_argument("--timeout", default="120",
                   help="seconds one point may take before every rank is ended (default 120)")
    b.add_argument("--root", default="0", help="root rank of rooted collectives (default 0)")
    common.add_run_options(b)


def bench_plan(args: argparse.Namespace, default_ranks: Optional[int]) -> BenchPlan:
    """The checked plan of parsed ``bench`` options (raises UsageError)."""
    return resolve(BenchOptions(**{f.name: getattr(args, f.name) for f in fields(BenchOptions)}),
                   default_ranks)


def refuse_own_launch_options(plan: BenchPlan) -> None:
    """Under a launcher of yours the ranks are where it put them: --containers and --bind
    (what ddlcomm's own launch does) would be stored as if they had been applied."""
    if plan.containers:
        raise UsageError("--containers is ddlcomm's own launch: under a launcher of yours the ranks "
                         "run where it put them", "leave --containers out, or let ddlcomm start "
                         "the ranks (--ranks N, without mpirun)")
    if plan.bind != "none":
        raise UsageError(f"--bind {plan.bind} is ddlcomm's own launch: under a launcher of yours "
                         "bind with it", "e.g. mpirun --bind-to core, srun --cpu-bind=cores")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from ..bench import session     # here: a refused command need not import what runs one
    info = detect()
    plan = bench_plan(args, default_ranks=None if info else 2)
    note = staged_note(plan)
    if note and (info is None or (info.rank == 0 and owners_run() is None)):
        print(f"ddlcomm: note: {note}", file=sys.stderr)   # once: the run's owner or rank 0
    db = common.db_path(args)
    if info is not None:
        if owners_run() is None:
            refuse_own_launch_options(plan)
        return session.rank_main(plan, argv, info, db, common.report_dir(args, db))
    check_ranks(plan.ranks, usable_cpus(), args.oversubscribe)   # memory: check_fits
    if plan.containers:
        check_available()
    check_fits(plan, mem_available())
    return session.launch(plan, argv, db, common.report_dir(args, db))
