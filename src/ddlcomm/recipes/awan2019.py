"""awan2019: MPI against NCCL for distributed deep learning (Awan et al.).

The paper has two halves, kept as separate parts of this recipe's steps:

* all-reduce latency (4 B to 256 MiB; the library's against ddlcomm's ring
  and recursive halving/doubling with device-side reduction, with and without
  the buffer-kind cache): belongs with ddlcomm's own collectives and is not
  written yet; when it is, it joins :data:`PARTS` as another entry;
* the training-scaling study (:func:`training_steps`, here): images/s,
  speed-up and efficiency of data-parallel ResNet-50 over 1, 2 and 4 workers
  with Horovod-style training (all-reduce of 25 MiB fused buckets overlapped
  with backward), through Open MPI, MPICH and Gloo (the collective library
  torch users pick on CPUs, standing in for NCCL, which needs GPUs), with
  torch DistributedDataParallel beside them.

Scaled default: 32x32 images (CIFAR-sized: the 100 MB of gradients weigh as
much as they do, the compute shrinks), batch 4 per worker, 5 timed iterations
after 1 of warm-up.
``--full``: 224x224, batch 64, 100 iterations, 1..8 workers.
"""
from __future__ import annotations

import os
from typing import Callable

from .base import Recipe, Step

MODEL = "resnet50"
#: (label, environment, backend): ddlcomm's all-reduce through each library.
LIBRARIES = (("Open MPI", "openmpi", "mpi"), ("MPICH", "mpich", "mpi"), ("Gloo", "openmpi", "gloo"))


def training_steps(full: bool) -> list[Step]:
    ranks = "1,2,4,8" if full else "1,2,4"
    shape = ("--image-size", "224", "--batch", "64", "--iters", "100", "--warmup", "10") if full else \
        ("--image-size", "32", "--batch", "4", "--iters", "5", "--warmup", "1")
    out = []
    for label, env, backend in LIBRARIES:
        peer = ("--peer", "ddp") if backend == "gloo" else ()
        out.append(Step(f"training {MODEL} {label} workers {ranks}",
                        ("--model", MODEL, "--ranks", ranks, "--backend", backend,
                         "--arch", "allreduce", "--overlap", "--fusion", "25MiB",
                         "--comm-reps", "3", *peer, *shape), env=env, command="train"))
    return out


#: The recipe's parts, each a function of ``full`` returning its steps (see the module doc).
PARTS: tuple[Callable[[bool], list[Step]], ...] = (training_steps,)


def steps(full: bool) -> list[Step]:
    return [step for part in PARTS for step in part(full)]


def unavailable() -> list[tuple[str, str]]:
    return [("NCCL all-reduce and training", "no GPU here (Gloo stands in on CPUs)"),
            ("all-reduce latency half", "not written yet: it belongs with ddlcomm's own "
                                        "collectives (ring, rhd, buffer-kind cache)")]


def report(recipe, points, out_dir):
    from ..report.train import write_train_report
    cores = os.cpu_count() or 1
    return write_train_report(None, points, out_dir, title=recipe.title, notes=[
        "Training half: ResNet-50, all-reduce of 25 MiB buckets overlapped with backward, through "
        "each library; DDP (Gloo) beside them at each worker count.",
        "Speed-up N·t_iter(1)/t_iter(N) at a fixed batch per worker against one worker alone.",
        f"One core per worker; this machine has {cores}, so more workers than that share cores.",
    ] + [f"Not available here: {v}: {why}" for v, why in unavailable()])


RECIPE = Recipe("awan2019", "awan2019: training scaling through MPI and Gloo (training half)",
                steps, unavailable, report)
