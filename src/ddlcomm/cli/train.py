"""``ddlcomm train``: its options, and the hand-over to the training session.

The options are checked by ``train/config.py`` (:func:`~ddlcomm.train.config.plan_jobs`)
before any rank starts (UsageError: one line, exit 2).
"""
from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Optional

from ..memory import heap
from ..train.config import OVERLAP, PEERS, WAIT_CHOICES, TrainJob, TrainOptions
from ..train.config import plan_jobs as _plan_jobs
from ..train.device import DEVICES
from ..train.nets import NETS
from . import common

DESCRIPTION = (
    "Synchronous data-parallel training of a real network (PyTorch, on the CPU or on each "
    "rank's GPU: --device) with its gradients aggregated through a ddlcomm backend: --arch allreduce (tensor fusion into --fusion buckets, "
    "optionally overlapped with backward) or --arch ps (rank 0 is the parameter server). Each "
    "iteration is timed by phase (io, h2d, forward, backward, update, exposed and hidden "
    "communication; warm-up excluded); reports images/s, weak-scaling speed-up and efficiency "
    "over a --ranks list, a one-worker --batch-sweep, and the S-SGD model's predicted iteration "
    "time beside the measured one. Data is synthetic (fixed random images and labels) unless "
    "--data is given. Checks after training that every rank holds identical parameters. "
    "Outside a launcher it starts the ranks itself; under mpirun/torchrun it runs in the ranks "
    "it was given.")


def add_parser(sub) -> argparse.ArgumentParser:
    t = sub.add_parser("train", help="data-parallel training: images/s, phases, scaling, vs the model",
                       description=DESCRIPTION)
    t.add_argument("--model", default="smallcnn",
                   help=f"network: {', '.join(NETS)} (default smallcnn: trains in seconds on a CPU)")
    t.add_argument("--backend", default="mpi", help="ddlcomm backend aggregating gradients: mpi, gloo, "
                                                    "nccl (GPU only) (default mpi)")
    t.add_argument("--device", choices=list(DEVICES),
                   help="where the network, data and gradients live: cpu, or cuda (GPU "
                        "local_rank %% gpus; nccl and gloo are handed the CUDA buckets, mpi's "
                        "library all-reduce host-staged copies, --algorithm the CUDA buckets; "
                        "every phase ends with a CUDA sync). Default: cuda "
                        "for --backend nccl, else cpu")
    t.add_argument("--arch", default="allreduce",
                   help="allreduce, ps, or a comma list measured in turn (default allreduce)")
    t.add_argument("--fusion", default="25MiB", metavar="BYTES",
                   help="tensor fusion: gradients packed into buckets of at most BYTES, in the order "
                        "backward makes them ready (0: one per tensor; default 25MiB); DDP's bucket size too")
    t.add_argument("--overlap", nargs="?", const="on", default="off", choices=list(OVERLAP),
                   help="allreduce: start each bucket's all-reduce from the gradient hooks while "
                        "backward goes on (--overlap = on); 'both' measures off and on in one run "
                        "(default off); ps beside it runs once, without")
    t.add_argument("--algorithm", default="library",
                   help="allreduce: the buckets' all-reduce: library (the backend's own, default), "
                        "or ddlcomm's ring, rhd, shm, auto (chosen per bucket size) or, on the CPU, "
                        "shm-map (the buckets moved into shared memory: nothing staged) and "
                        "hierarchical (shm in each node, ring or rhd among nodes), with a kernel "
                        "suffix (ring+numpy) where wanted; on the GPU they reduce there and move "
                        "blocks by CUDA IPC or pinned copies (blocking: not with --overlap)")
    t.add_argument("--wait", default="spin", choices=list(WAIT_CHOICES),
                   help="allreduce: how a rank waits for all-reduces in flight: spin (the "
                        "backend's own wait; MPI's keeps polling a core), sleep (poll between "
                        "sleeps of 50 us to 1 ms, leaving the core to ranks and jobs sharing it), "
                        "or both, measured in turn (default spin); ps beside it runs once, spinning")
    t.add_argument("--peer", default="none", choices=PEERS,
                   help="ddp: also train the same configuration with torch DistributedDataParallel "
                        "in the same job, over the backend's torch.distributed group (nccl, gloo; "
                        "with mpi, a Gloo group beside it) (default none)")
    t.add_argument("--ranks", help="ranks, or a comma list for a weak-scaling study "
                                   "(1 is added as the baseline); default 2 (1 with --batch-sweep), or the launcher's")
    common.add_oversubscribe(t)
    t.add_argument("--batch", help="images per worker per iteration (default: the model's CPU-sized one)")
    t.add_argument("--batch-sweep", metavar="LIST",
                   help="comma list of batch sizes trained by one worker (--ranks 1)")
    t.add_argument("--image-size", help="input height and width in pixels (default: 32 for smallcnn, "
                                        "224 for the others)")
    t.add_argument("--iters", default="20", help="timed iterations per configuration (default 20)")
    t.add_argument("--warmup", default="3", help="untimed iterations first (default 3)")
    t.add_argument("--lr", help="SGD learning rate, momentum 0.9 (default: the model's)")
    t.add_argument("--seed", default="1", help="seed of the weights and of the synthetic data (default 1)")
    t.add_argument("--threads", default="1",
                   help="torch threads per rank (default 1: a core per worker, as a GPU per worker)")
    t.add_argument("--heap", choices=heap.HEAPS, default="steady",
                   help="the C library's heap in the ranks: steady (default) keeps what a step "
                        f"frees for the next ({heap.steady_thresholds()}), so no configuration "
                        "computes slower for what its collective happened to allocate; glibc "
                        "leaves its adaptive defaults, under which ResNet-50's CPU backward ran "
                        "1.3-1.5x slower after ddlcomm's or Gloo's all-reduces than after Open "
                        "MPI's, which frees a bucket-sized temporary (each step's temporaries "
                        "faulted in anew)")
    t.add_argument("--data", metavar="DIR",
                   help="train on the .npz files (arrays x (N,3,H,W), y (N,)) of DIR, read ahead by "
                        "a reader thread, instead of synthetic data")
    t.add_argument("--prefetch", help="with --data: batches read ahead (default 4)")
    t.add_argument("--comm-reps", default="10",
                   help="repetitions of the buckets' aggregation timed alone for the model (default 10)")
    t.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="check that all replicas are identical after training (default on)")
    t.add_argument("--timeout", default="900", help="seconds one configuration may take (default 900)")
    common.add_run_options(t)
    return t


def options(args: argparse.Namespace) -> TrainOptions:
    return TrainOptions(**{f.name: getattr(args, f.name) for f in fields(TrainOptions)})


def plan_jobs(args: argparse.Namespace, launcher_size: Optional[int]) -> list[TrainJob]:
    """Every launch of the run, from parsed ``train`` options (raises UsageError)."""
    return _plan_jobs(options(args), launcher_size)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from ..train import session     # here: the other commands need not import what trains
    db = common.db_path(args)
    return session.main(options(args), argv, db, common.report_dir(args, db), args.tag)
