"""``ddlcomm train``: its options, their checks, and the hand-over to the session.

Every option is checked here, before any rank starts (UsageError: one line,
exit 2).  The configurations of a launch are the product of ``--arch``,
``--overlap`` and the batch sizes, plus DDP's with ``--peer ddp``.
"""
from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path
from typing import Callable, Optional

from ..errors import UsageError
from ..units import parse_positive_int, parse_seconds, parse_size
from .aggregate import ARCHS
from .config import TrainConfig, TrainJob
from .nets import NETS, check_image_size, get_net

PEERS = ("none", "ddp")
OVERLAP = {"off": (False,), "on": (True,), "both": (False, True)}
WAIT_CHOICES = {"spin": ("spin",), "sleep": ("sleep",), "both": ("spin", "sleep")}

DESCRIPTION = (
    "Synchronous data-parallel training of a real network (PyTorch, CPU) with its gradients "
    "aggregated through a ddlcomm backend: --arch allreduce (tensor fusion into --fusion buckets, "
    "optionally overlapped with backward) or --arch ps (rank 0 is the parameter server). Each "
    "iteration is timed by phase (io, h2d, forward, backward, update, exposed and hidden "
    "communication; warm-up excluded); reports images/s, weak-scaling speed-up and efficiency "
    "over a --ranks list, a one-worker --batch-sweep, and the S-SGD model's predicted iteration "
    "time beside the measured one. Data is synthetic (fixed random images and labels) unless "
    "--data is given. Checks after training that every rank holds identical parameters. "
    "Outside a launcher it starts the ranks itself; under mpirun/torchrun it runs in the ranks "
    "it was given.")


def add_parser(sub, add_db: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    t = sub.add_parser("train", help="data-parallel training: images/s, phases, scaling, vs the model",
                       description=DESCRIPTION)
    t.add_argument("--model", default="smallcnn",
                   help=f"network: {', '.join(NETS)} (default smallcnn: trains in seconds on a CPU)")
    t.add_argument("--backend", default="mpi", help="ddlcomm backend aggregating gradients: mpi, gloo "
                                                    "(default mpi)")
    t.add_argument("--arch", default="allreduce",
                   help="allreduce, ps, or a comma list measured in turn (default allreduce)")
    t.add_argument("--fusion", default="25MiB", metavar="BYTES",
                   help="tensor fusion: gradients packed into buckets of at most BYTES, in the order "
                        "backward makes them ready (0: one per tensor; default 25MiB); DDP's bucket size too")
    t.add_argument("--overlap", nargs="?", const="on", default="off", choices=list(OVERLAP),
                   help="allreduce: start each bucket's all-reduce from the gradient hooks while "
                        "backward goes on (--overlap = on); 'both' measures off and on in one run")
    t.add_argument("--wait", default="spin", choices=list(WAIT_CHOICES),
                   help="allreduce: how a rank waits for all-reduces in flight: spin (the "
                        "backend's own wait; MPI's keeps polling a core), sleep (poll between "
                        "sleeps of 50 us to 1 ms, leaving the core to ranks and jobs sharing it), "
                        "or both, measured in turn (default spin)")
    t.add_argument("--peer", default="none", choices=PEERS,
                   help="ddp: also train the same configuration with torch DistributedDataParallel "
                        "over Gloo in the same job (default none)")
    t.add_argument("--ranks", help="ranks, or a comma list for a weak-scaling study "
                                   "(1 is added as the baseline); default 2, or the launcher's")
    t.add_argument("--batch", help="images per worker per iteration (default: the model's CPU-sized one)")
    t.add_argument("--batch-sweep", metavar="LIST",
                   help="comma list of batch sizes trained by one worker (--ranks 1)")
    t.add_argument("--image-size", help="input height and width in pixels (default: 32 for smallcnn, "
                                        "224 for the others)")
    t.add_argument("--iters", default="20", help="timed iterations per configuration (default 20)")
    t.add_argument("--warmup", default="3", help="untimed iterations first (default 3)")
    t.add_argument("--lr", help="SGD learning rate, momentum 0.9 (default: the model's)")
    t.add_argument("--seed", default="1", help="seed of the weights and of the synthetic data")
    t.add_argument("--threads", default="1",
                   help="torch threads per rank (default 1: a core per worker, as a GPU per worker)")
    t.add_argument("--data", metavar="DIR",
                   help="train on the .npz files (arrays x (N,3,H,W), y (N,)) of DIR, read ahead by "
                        "a reader thread, instead of synthetic data")
    t.add_argument("--prefetch", default="4", help="with --data: batches read ahead (default 4)")
    t.add_argument("--comm-reps", default="10",
                   help="repetitions of the buckets' aggregation timed alone for the model (default 10)")
    t.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="check that all replicas are identical after training (default on)")
    t.add_argument("--timeout", default="900", help="seconds one configuration may take (default 900)")
    add_db(t)
    t.add_argument("--tag", help="a label stored with the run (recipes find their runs by it)")
    t.add_argument("--report-dir", metavar="DIR",
                   help="where run-N/index.html goes (default: reports/ beside the database)")
    t.add_argument("--no-report", action="store_true", help="do not write the HTML/PNG report")
    return t


def _list(text: str, flag: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise UsageError(f"{flag} is empty")
    if len(set(items)) != len(items):
        raise UsageError(f"{flag} names something twice: {text}")
    return items


def base_config(args: argparse.Namespace) -> TrainConfig:
    spec = get_net(args.model)
    image = parse_positive_int(args.image_size, "--image-size") if args.image_size else spec.image_size
    check_image_size(spec, image)
    lr = spec.lr
    if args.lr is not None:
        try:
            lr = float(args.lr)
        except ValueError:
            raise UsageError(f"--lr must be a number, got {args.lr!r}") from None
        if not 0 < lr < 10:
            raise UsageError(f"--lr must be above 0 and below 10, got {args.lr}")
    fusion = parse_size(args.fusion)
    data = None
    if args.data is not None:
        from .data import data_files
        data_files(args.data)                      # refuse a missing or empty folder now
        data = str(Path(args.data).expanduser().resolve())
    return TrainConfig(
        model=spec.name, fusion=fusion, batch=spec.batch, image_size=image,
        iters=parse_positive_int(args.iters, "--iters"),
        warmup=parse_positive_int(args.warmup, "--warmup", 0), lr=lr,
        seed=parse_positive_int(args.seed, "--seed", 0),
        threads=parse_positive_int(args.threads, "--threads"), data=data,
        prefetch=parse_positive_int(args.prefetch, "--prefetch"),
        comm_reps=parse_positive_int(args.comm_reps, "--comm-reps"), check=args.check)


def plan_jobs(args: argparse.Namespace, launcher_size: Optional[int]) -> list[TrainJob]:
    """Every launch of the run with its configurations (raises UsageError)."""
    from ..comm import registry
    registry.get_spec(args.backend)                       # unknown: names the choices
    base = base_config(args)
    archs = _list(args.arch, "--arch")
    for a in archs:
        if a not in ARCHS:
            raise UsageError(f"unknown --arch {a!r}", f"choose from {', '.join(ARCHS)}")
    overlaps = OVERLAP[args.overlap]
    waits = WAIT_CHOICES[args.wait]
    if True in overlaps and archs == ["ps"]:
        raise UsageError("--overlap applies to --arch allreduce", "drop --overlap for ps")
    if "sleep" in waits and archs == ["ps"]:
        raise UsageError("--wait applies to --arch allreduce", "drop --wait for ps")
    if args.batch_sweep is not None and args.batch is not None:
        raise UsageError("give --batch or --batch-sweep, not both")
    if args.batch_sweep is not None:
        batches = sorted({parse_positive_int(b, "--batch-sweep") for b in _list(args.batch_sweep, "--batch-sweep")})
    else:
        batches = [parse_positive_int(args.batch, "--batch")] if args.batch else [base.batch]
    if args.ranks is not None:
        ranks = sorted({parse_positive_int(r, "--ranks") for r in _list(args.ranks, "--ranks")})
    else:
        ranks = [launcher_size or (1 if args.batch_sweep else 2)]
    if launcher_size is not None and ranks != [launcher_size]:
        raise UsageError(f"the launcher started {launcher_size} ranks but --ranks {args.ranks} was asked",
                         "start as many ranks as --ranks says, or leave it out")
    if len(ranks) > 1 and launcher_size is None and 1 not in ranks:
        ranks = [1] + ranks                      # the weak-scaling baseline: one worker alone
    if args.batch_sweep is not None and ranks != [1]:
        raise UsageError("--batch-sweep trains on one worker", "use --ranks 1 (or leave --ranks out)")
    if args.peer == "ddp":
        registry.check("gloo")
    timeout = parse_seconds(args.timeout, "--timeout")
    jobs = []
    for n in ranks:
        if len(ranks) > 1 and n == 1:
            # The weak-scaling baseline: one worker alone, nothing to aggregate, per batch size.
            jobs.append(TrainJob(args.backend, 1, [base.with_(batch=b) for b in batches], timeout))
            continue
        if "ps" in archs and n < 2:
            raise UsageError("--arch ps needs a server and at least one worker", "use --ranks 2 or more")
        configs = [base.with_(arch=arch, overlap=overlap, wait=wait, batch=batch)
                   for arch, overlap, wait, batch in itertools.product(archs, overlaps, waits, batches)
                   if not (arch == "ps" and (overlap or wait != "spin"))]
        if args.peer == "ddp":
            configs += [base.with_(peer="ddp", batch=b) for b in batches]
        jobs.append(TrainJob(args.backend, n, configs, timeout))
    return jobs


def run(args: argparse.Namespace, argv: list[str], db: Path, report_dir: Optional[Path]) -> int:
    """The ``train`` command: own the run, or (under a launcher) be one of its ranks."""
    from ..comm import registry
    from ..launch.env import detect
    from . import session
    info = detect()
    registry.check(args.backend)
    if info is not None and session.JOB_ENV in os.environ:
        job = TrainJob.from_json(os.environ[session.JOB_ENV])
        return session.rank_main(job, argv, db, report_dir, config={})
    jobs = plan_jobs(args, info.size if info else None)
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        raise UsageError("ddlcomm train needs PyTorch", "pip install 'ddlcomm[torch]'")
    config = {"backend": args.backend, "ranks": [j.ranks for j in jobs],
              "configs": sorted({c.label() for j in jobs for c in j.configs}),
              "extra": {"tag": args.tag} if args.tag else {}}
    if info is not None:
        return session.rank_main(jobs[0], argv, db, report_dir, config)
    return session.launch(jobs, argv, db, config, report_dir)
