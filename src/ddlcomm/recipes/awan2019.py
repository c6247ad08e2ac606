"""awan2019: MPI against NCCL for distributed deep learning (Awan et al.).

The paper has two halves, kept as separate parts of this recipe's steps (where
there is a GPU, its half runs first: a run cut short keeps what only it measures):

* all-reduce latency (:func:`latency_steps`): 4 B to 256 MiB, each
  library's own all-reduce against ddlcomm's ring and recursive
  halving/doubling over that library's point-to-point, reduced by the compiled
  kernel, through Open MPI, MPICH and Gloo;
* its GPU half (:func:`gpu_latency_steps`, where torch sees a GPU): the same
  sizes on device buffers -- NCCL, Gloo on CUDA tensors, each MPI host-staged
  (``--path host-staged``), and ddlcomm's ring, rhd and shm on device buffers
  (:mod:`ddlcomm.comm.device`: GPU reductions, CUDA IPC between the ranks
  sharing the GPU) with the buffer-kind cache on and off, over each MPI;
* its GPU training study (:func:`gpu_training_steps`, where torch sees a GPU):
  ResNet-50 on 1, 2 and 4 ranks sharing the GPU, NCCL (after backward and
  overlapped, with DDP over NCCL beside it) against ddlcomm's device shm and
  ring all-reduces of the buckets over Open MPI;
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

from pathlib import Path
from typing import Callable

from ..memory.gpu import cuda_available
from ..report.recipe import write_recipe_report
from ..report.train import write_train_report
from .base import Recipe, Step, cores_of

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


def latency_steps(full: bool) -> list[Step]:
    """All-reduce latency per size: library, ring and rhd side by side, per library."""
    sizes, ranks = ("4B:256MiBx2", "2,4") if full else ("4B:256MiBx4", "2")
    timing = ("--iters", "1000") if full else ("--budget", "0.1")
    return [Step(f"latency {label} {n} ranks",
                 ("--backend", backend, "--collective", "allreduce", "--algorithm", "library,ring,rhd",
                  "--sizes", sizes, "--ranks", n, "--form", "buffer", *timing),
                 env=env)
            for label, env, backend in LIBRARIES for n in ranks.split(",")]


#: The GPU half's latency runs: (label, environment, options); all on --memory device.
GPU_RUNS = (
    [("NCCL", "openmpi", ("--backend", "nccl", "--algorithm", "library")),
     ("Gloo-CUDA", "openmpi", ("--backend", "gloo", "--algorithm", "library"))]
    + [(f"{name} host-staged", env, ("--backend", "mpi", "--path", "host-staged"))
       for name, env, backend in LIBRARIES if backend == "mpi"]
    + [(f"ddlcomm over {name}, kind cache {cache}", env,
        ("--backend", backend, "--algorithm", "ring,rhd,shm", "--kind-cache", cache))
       for name, env, backend in LIBRARIES for cache in ("on", "off")])
#: The GPU training study, ResNet-50 on ranks sharing the GPU: (label, environment, options).
#: NCCL's all-reduce of the buckets, after backward and overlapped, with DDP over NCCL
#: beside it; ddlcomm's device all-reduces (GPU reduction, CUDA IPC; blocking, so after
#: backward) over Open MPI, which carries host messages only.
GPU_TRAINING = (
    ("NCCL", "openmpi", ("--backend", "nccl", "--overlap", "both", "--peer", "ddp")),
    ("ddlcomm shm over Open MPI", "openmpi", ("--backend", "mpi", "--algorithm", "shm")),
    ("ddlcomm ring over Open MPI", "openmpi", ("--backend", "mpi", "--algorithm", "ring")),
)


def gpu_latency_steps(full: bool) -> list[Step]:
    """All-reduce latency on device buffers: NCCL, Gloo-CUDA, MPI host-staged, ddlcomm's own
    (ring, rhd, shm; GPU reduction) with the kind cache on and off."""
    sizes, ranks = ("4B:256MiBx2", "2,4") if full else ("4B:256MiBx4", "2")
    timing = ("--iters", "1000") if full else ("--budget", "0.1")
    return [Step(f"GPU latency {label} {n} ranks",
                 ("--collective", "allreduce", "--memory", "device", *how, "--sizes", sizes,
                  "--ranks", n, "--form", "buffer", *timing),
                 env=env)
            for label, env, how in GPU_RUNS for n in ranks.split(",")]


def gpu_training_steps(full: bool) -> list[Step]:
    """ResNet-50 training scaling on the GPU, 1, 2 and 4 ranks sharing it (8 with ``--full``):
    NCCL (and DDP over it) against ddlcomm's device all-reduces."""
    ranks = "1,2,4,8" if full else "1,2,4"
    shape = ("--image-size", "224", "--batch", "64", "--iters", "100", "--warmup", "10") if full else \
        ("--image-size", "32", "--batch", "4", "--iters", "5", "--warmup", "1")
    return [Step(f"GPU training {MODEL} {label} workers {ranks}",
                 ("--model", MODEL, "--ranks", ranks, "--device", "cuda", "--fusion", "25MiB",
                  "--comm-reps", "3", *how, *shape), env=env, command="train")
            for label, env, how in GPU_TRAINING]


def _gpu_here(full: bool) -> list[Step]:
    """The GPU half where torch sees a GPU, else nothing (see :func:`unavailable`)."""
    return gpu_latency_steps(full) + gpu_training_steps(full) if cuda_available()[0] else []


#: The recipe's parts, each a function of ``full`` returning its steps (see the module doc):
#: (where there is a GPU) the GPU half first, as choi2021's, so that a run cut short by a
#: time limit loses the part any machine can measure.
PARTS: tuple[Callable[[bool], list[Step]], ...] = (_gpu_here, latency_steps, training_steps)


def steps(full: bool) -> list[Step]:
    return [step for part in PARTS for step in part(full)]


def unavailable() -> list[tuple[str, str]]:
    """Exactly what this recipe does not run here, each with why: without a GPU every run
    of the GPU half, latency and training."""
    ok, why = cuda_available()
    if ok:
        return []
    return [(f"GPU half: {label}", why) for label, _, _ in GPU_RUNS] + \
        [(f"GPU training: {label}", why) for label, _, _ in GPU_TRAINING]


def report(recipe, points, out_dir, missing=()):
    cores = cores_of(points)
    # a host-staged point's parts (allreduce.d2h, ...) are not all-reduces: the whole only
    latency = [p for p in points if p.get("collective") == "allreduce"
               and p.get("phase") in (None, "allreduce")]
    training = [p for p in points if p.get("collective") != "allreduce"]
    links = []
    if latency:
        write_recipe_report(
            f"{recipe.title}: all-reduce latency", latency, Path(out_dir) / "latency",
            figure_of=lambda p: f"allreduce, {p['ranks']} ranks", panel_of=_library,
            x_of=lambda p: p["bytes"], line_of=_line,
            x_label="bytes per rank", panel_order=[label for label, _, _ in LIBRARIES] + [
                f"GPU: {label}" for label in ("NCCL", "Gloo", "Open MPI", "MPICH")], x_bytes=True,
            notes=["Each library's own all-reduce against ddlcomm's ring and recursive "
                   "halving/doubling over that library's point-to-point (compiled reduction kernel).",
                   *(["GPU panels: device buffers; ddlcomm's ring, rhd and shm reduce on the GPU and "
                      "move blocks by CUDA IPC between ranks sharing the GPU; MPI host-staged copies "
                      "through pinned host memory around the library's all-reduce."]
                     if any(_library(p).startswith("GPU") for p in latency) else [])],
            unavailable=missing)
        links.append(("The all-reduce latency half", "latency/index.html"))
    looked = [p for p in latency if p.get("kind_lookup_us_per_call") is not None]
    if looked:
        write_recipe_report(
            f"{recipe.title}: the buffer-kind cache", looked, Path(out_dir) / "lookups",
            figure_of=lambda p: f"kind look-ups, {p['ranks']} ranks", panel_of=_library,
            x_of=lambda p: p["bytes"], line_of=_line, x_label="bytes per rank",
            panel_order=[f"GPU: {label}" for label in ("Open MPI", "MPICH", "Gloo")], x_bytes=True,
            y=("kind_lookup_us_per_call", "kind look-ups per call"),
            notes=["The µs a call of ddlcomm's device all-reduces spends asking whether its buffers "
                   "are host or device memory: the look-ups a call made times what one takes, timed "
                   "apart after the run on the same buffer (a hit of the cache; with the cache off, "
                   "the CUDA driver asked). Off less on is what the cache saves a call (Awan et al.'s "
                   "small-message figure); the latency half's times include it."])
        links.append(("The buffer-kind cache: look-ups per call", "lookups/index.html"))
    return write_train_report(None, training, out_dir, title=recipe.title, links=links, notes=[
        "Training half: ResNet-50, all-reduce of 25 MiB buckets overlapped with backward, through "
        "each library; DDP (Gloo) beside them at each worker count.",
        "Speed-up N·t_iter(1)/t_iter(N) at a fixed batch per worker against one worker alone.",
        f"One core per worker; this machine has {cores}, so more workers than that share cores.",
    ] + (["GPU training (cuda): ResNet-50 on ranks sharing the GPU; NCCL's all-reduce of the "
          "buckets after backward and overlapped, DDP over NCCL, and ddlcomm's device shm and ring "
          "(GPU reduction, CUDA IPC) over Open MPI after backward."]
         if any(p.get("device") == "cuda" for p in training) else [])
      + [f"Not available here: {v}: {why}" for v, why in missing])


def _library(point) -> str:
    """The panel of a latency point: Open MPI, MPICH or Gloo; on device buffers "GPU: ..."."""
    name = {"gloo": "Gloo", "nccl": "NCCL"}.get(point.get("backend"), str(point.get("library")))
    return f"GPU: {name}" if point.get("memory") == "device" else name


def _line(point) -> str:
    """A latency line: the algorithm (or path), with the kind cache where it was off."""
    how = point.get("algorithm") or "library"
    if point.get("path") not in (None, "host"):
        how = f"{how} {point['path']}"
    return f"{how}, kind cache off" if point.get("kind_cache") == "off" else how


RECIPE = Recipe("awan2019", "awan2019: all-reduce latency and training scaling through MPI and Gloo",
                steps, unavailable, report)
