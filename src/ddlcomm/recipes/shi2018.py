"""shi2018: performance modelling of synchronous SGD (Shi and Chu, DASC 2018).

The time of one S-SGD iteration broken down by phase (io, h2d, forward,
backward, update, communication exposed and hidden) for AlexNet, GoogLeNet
and ResNet-50, and weak scaling over 1, 2 and 4 workers, each measured
against the S-SGD model fed the one-worker phases and the communication
measured at N (``ddlcomm train --ranks 1,2,4``), with wait-free
back-propagation (``--overlap``) off and on, all-reduce with 25 MiB fusion
over MPI (Open MPI).

Scaled default: 64x64 images (AlexNet's pooling needs 63), batch 4 per
worker, 4 timed iterations after 1 of warm-up, the buckets' aggregation timed
alone 3 times, one core per worker (4 workers oversubscribe a 2-core machine;
the report says so).  ``--full``: 224x224 images, batch 32, 100 iterations,
and 1, 2, 4, 8 workers.
"""
from __future__ import annotations


from ..memory.gpu import cuda_available
from ..report.train import write_train_report
from .base import Recipe, Step, cores_of

MODELS = ("alexnet", "googlenet", "resnet50")


def steps(full: bool) -> list[Step]:
    ranks = "1,2,4,8" if full else "1,2,4"
    shape = ("--image-size", "224", "--batch", "32", "--iters", "100", "--warmup", "10") if full else \
        ("--image-size", "64", "--batch", "4", "--iters", "4", "--warmup", "1")
    return [Step(f"{model} workers {ranks}, overlap off/on",
                 ("--model", model, "--ranks", ranks, "--backend", "mpi", "--arch", "allreduce",
                  "--overlap", "both", "--fusion", "25MiB", "--comm-reps", "3", *shape),
                 command="train")
            for model in MODELS]


def unavailable() -> list[tuple[str, str]]:
    ok, why = cuda_available()
    return [("GPU workers (h2d over PCIe)",
             f"{'this recipe trains on the CPU' if ok else why}: h2d is a host copy, timed as such")]


def report(recipe, points, out_dir, missing=()):
    cores = cores_of(points)
    return write_train_report(None, points, out_dir, title=recipe.title, notes=[
        "Bars: time per iteration by phase along the critical path (the worker whose own work "
        "took longest); diamonds: the S-SGD model's t_iter from this run's phases and buckets.",
        "Scaling: speed-up N·t_iter(1)/t_iter(N) at a fixed batch per worker; dashed: the model "
        "fed the one-worker phases and the communication measured at N.",
        f"One core per worker; this machine has {cores}, so more workers than that share cores.",
    ] + [f"Not available here: {v}: {why}" for v, why in missing])


RECIPE = Recipe("shi2018", "shi2018: S-SGD iteration breakdown and scaling vs the model",
                steps, unavailable, report)
