"""What one training configuration is, the job a set of ranks runs, and the
checks of ``ddlcomm train``'s options that make them (:func:`plan_jobs`).

Every option is checked here, before any rank starts (UsageError: one line,
exit 2).  ``--device`` defaults to where the backend's buffers live: the CPU
for a backend that takes host memory, the GPU for one that takes device
memory only (nccl); a GPU run with a host-only backend hands it host-staged
copies (:mod:`.wire`).  The configurations of a launch are the product of ``--arch``,
``--overlap``, ``--wait`` and the batch sizes, plus DDP's with ``--peer ddp``.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

from ..bench.plan import (MAX_RANKS_PER_CPU, check_device_algorithm, check_start, mem_available,
                          usable_cpus)
from ..comm import algorithms, registry
from ..errors import UnsupportedError, UsageError
from ..workloads.models import total_parameters
from ..units import (MAX_ITERS, MAX_SEED, counted, format_size, fusion_label, parse_list,
                     parse_positive_int, parse_seconds, parse_size)
from .aggregate import ARCHS
from .data import data_files, data_shape, file_images, label_range, shares
from .device import get_device
from .nets import check_image_size, get_net
from .wire import wire_for

PEERS = ("none", "ddp")
OVERLAP = {"off": (False,), "on": (True,), "both": (False, True)}
WAIT_CHOICES = {"spin": ("spin",), "sleep": ("sleep",), "both": ("spin", "sleep")}


@dataclass(frozen=True)
class TrainConfig:
    """One measured configuration: a network trained one way for ``iters`` iterations."""

    model: str
    arch: str = "allreduce"          # allreduce | ps
    overlap: bool = False
    wait: str = "spin"               # spin | sleep: how all-reduces in flight are waited for
    fusion: int = 25 << 20           # bucket bytes; 0: one bucket per gradient
    batch: int = 128                 # images per worker per iteration
    image_size: int = 32
    iters: int = 20
    warmup: int = 3
    lr: float = 0.02
    seed: int = 1
    threads: int = 1                 # torch intra-op threads per rank
    peer: str = "ddlcomm"            # ddlcomm | ddp (torch DistributedDataParallel, the job's group)
    data: Optional[str] = None       # folder of .npz files; None: synthetic
    prefetch: int = 4
    comm_reps: int = 10
    check: bool = True
    device: str = "cpu"              # cpu | cuda (GPU local_rank % gpus)
    algorithm: str = "library"       # the buckets' all-reduce: the backend's, or ddlcomm's own
    heap: str = "steady"             # the C library's heap in the ranks (memory/heap.py)

    def label(self) -> str:
        if self.peer == "ddp":
            how = f"ddp bucket {fusion_label(self.fusion)}"
        else:
            how = (f"{self.arch}{'' if self.algorithm == 'library' else ' ' + self.algorithm}"
                   f"{' overlap' if self.overlap else ''}"
                   f"{' wait-sleep' if self.wait == 'sleep' else ''} fusion {fusion_label(self.fusion)}")
        return f"{self.model} batch {self.batch} {how}{' on cuda' if self.device == 'cuda' else ''}"

    def with_(self, **changes) -> "TrainConfig":
        return replace(self, **changes)


@dataclass
class TrainJob:
    """What the owner hands every rank of one launch (through the environment, as JSON)."""

    backend: str
    ranks: int
    configs: list[TrainConfig] = field(default_factory=list)
    timeout_s: float = 900.0

    @property
    def needs_gloo(self) -> bool:
        """DDP runs over torch.distributed's default process group: the backend's own where
        it holds that group (gloo, nccl), else a Gloo group started beside it."""
        return any(c.peer == "ddp" for c in self.configs) and \
            registry.get_spec(self.backend).holds != registry.get_spec("gloo").holds

    def to_json(self) -> str:
        return json.dumps({"backend": self.backend, "ranks": self.ranks, "timeout_s": self.timeout_s,
                           "configs": [asdict(c) for c in self.configs]})

    @classmethod
    def from_json(cls, text: str) -> "TrainJob":
        d = json.loads(text)
        return cls(d["backend"], d["ranks"], [TrainConfig(**c) for c in d["configs"]], d["timeout_s"])


# ------------------------------------------------------------------ options
@dataclass(frozen=True)
class TrainOptions:
    """``ddlcomm train``'s options as the user gave them: strings, flags, None when left out."""

    model: str
    backend: str
    arch: str
    fusion: str
    overlap: str
    wait: str
    peer: str
    ranks: Optional[str]
    batch: Optional[str]
    batch_sweep: Optional[str]
    image_size: Optional[str]
    iters: str
    warmup: str
    lr: Optional[str]
    seed: str
    threads: str
    data: Optional[str]
    prefetch: Optional[str]
    comm_reps: str
    check: bool
    timeout: str
    oversubscribe: bool = False
    device: Optional[str] = None
    algorithm: str = "library"
    heap: str = "steady"


def base_config(o: TrainOptions) -> TrainConfig:
    """The configuration every one of the run's starts from (checked)."""
    spec = get_net(o.model)
    image = parse_positive_int(o.image_size, "--image-size") if o.image_size else spec.image_size
    data = None
    if o.prefetch is not None and o.data is None:
        raise UsageError("--prefetch applies to --data runs (synthetic batches are not read)")
    if o.data is not None:
        files = data_files(o.data)
        _, side, _ = data_shape(files)      # refuse a folder it cannot train on now
        if o.image_size and image != side:
            raise UsageError(f"--image-size {image}, but the --data images are {side}x{side}",
                             f"give --image-size {side}, or leave it out")
        if side < spec.min_image_size:
            raise UsageError(f"the --data images are {side}x{side}, too small for {spec.name}",
                             f"its pooling needs at least {spec.min_image_size} pixels")
        lo, hi = label_range(files)
        if lo < 0 or hi >= spec.classes:
            raise UsageError(f"the --data labels run {lo}..{hi}, but {spec.name} has "
                             f"{spec.classes} classes", f"give labels 0..{spec.classes - 1}")
        image = side
        data = str(Path(o.data).expanduser().resolve())
    check_image_size(spec, image)
    lr = spec.lr
    if o.lr is not None:
        try:
            lr = float(o.lr)
        except ValueError:
            raise UsageError(f"--lr must be a number, got {o.lr!r}") from None
        if not 0 < lr < 10:
            raise UsageError(f"--lr must be above 0 and below 10, got {o.lr}")
    fusion = parse_size(o.fusion, "--fusion")
    return TrainConfig(
        model=spec.name, fusion=fusion, batch=spec.batch, image_size=image,
        iters=parse_positive_int(o.iters, "--iters", 1, MAX_ITERS),
        warmup=parse_positive_int(o.warmup, "--warmup", 0, MAX_ITERS), lr=lr,
        seed=parse_positive_int(o.seed, "--seed", 0, MAX_SEED),
        threads=parse_positive_int(o.threads, "--threads", 1,
                                   MAX_RANKS_PER_CPU * usable_cpus()), data=data,
        prefetch=parse_positive_int(o.prefetch or "4", "--prefetch"),
        comm_reps=parse_positive_int(o.comm_reps, "--comm-reps", 1, MAX_ITERS), check=o.check,
        heap=o.heap)


def plan_jobs(o: TrainOptions, launcher_size: Optional[int]) -> list[TrainJob]:
    """Every launch of the run with its configurations (raises UsageError)."""
    base = base_config(o).with_(device=_device(o))
    archs = parse_list(o.arch, "--arch")
    for a in archs:
        if a not in ARCHS:
            raise UsageError(f"unknown --arch {a!r}", f"choose from {', '.join(ARCHS)}")
    overlaps, waits = OVERLAP[o.overlap], WAIT_CHOICES[o.wait]
    if True in overlaps and archs == ["ps"]:
        raise UsageError("--overlap applies to --arch allreduce", "drop --overlap for ps")
    if True in overlaps and _staged(o.backend, base.device):
        raise UnsupportedError(f"--overlap on the GPU starts all-reduces from autograd's GPU "
                               f"thread, and backend {o.backend} is handed host-staged copies "
                               "from the main thread only",
                               "use --backend nccl or gloo, or drop --overlap")
    if "sleep" in waits and archs == ["ps"]:
        raise UsageError("--wait applies to --arch allreduce", "drop --wait for ps")
    _check_algorithm(o, archs, overlaps, waits, base.device)
    batches = _batches(o, base)
    ranks = _ranks(o, launcher_size)
    if launcher_size is None:             # this command starts the ranks: they must fit here
        # Every training rank loads torch, as a gloo rank does, whatever the backend.
        check_start(max(ranks), o.oversubscribe, [o.backend, "gloo"])
        _check_batch_memory(base, max(batches), max(ranks))
    _check_data_shares(base, archs + (["ddp"] if o.peer == "ddp" else []), ranks, max(batches))
    if o.peer == "ddp":
        registry.check("gloo")
    timeout = parse_seconds(o.timeout, "--timeout")
    jobs = []
    for n in ranks:
        if len(ranks) > 1 and n == 1:
            # The weak-scaling baseline: one worker alone, nothing to aggregate, per batch size.
            jobs.append(TrainJob(o.backend, 1, [base.with_(batch=b) for b in batches], timeout))
            continue
        if "ps" in archs and n < 2:
            raise UsageError("--arch ps needs a server and at least one worker", "use --ranks 2 or more")
        # --overlap and --wait shape the all-reduce's configurations; ps runs once per batch
        # beside them, as it runs (blocking, spinning)
        configs = [base.with_(arch=arch, overlap=overlap, wait=wait, batch=batch, algorithm=o.algorithm)
                   for arch in archs
                   for overlap, wait in (itertools.product(overlaps, waits) if arch != "ps"
                                         else [(False, "spin")])
                   for batch in batches]
        if o.peer == "ddp":
            configs += [base.with_(peer="ddp", batch=b) for b in batches]
        jobs.append(TrainJob(o.backend, n, configs, timeout))
    return jobs


def _check_algorithm(o: TrainOptions, archs: list[str], overlaps: tuple, waits: tuple,
                     device: str) -> None:
    """Refuse an ``--algorithm`` that cannot aggregate these configurations' buckets."""
    if "," in o.algorithm:
        raise UsageError(f"train's --algorithm takes one name, got {o.algorithm!r}",
                         "run train once per algorithm")
    algorithms.check("allreduce", o.algorithm)
    if o.algorithm == "library":
        return
    if "ps" in archs:
        raise UsageError("--algorithm applies to --arch allreduce", "drop ps from --arch")
    if True in overlaps or "sleep" in waits:
        raise UnsupportedError("ddlcomm's own all-reduces are blocking calls: --overlap and --wait "
                               "sleep start the backend's non-blocking all-reduce",
                               "drop --overlap and --wait, or use --algorithm library")
    if device != "cpu":
        check_device_algorithm("allreduce", o.algorithm, f"--device {device}")
    if device != "cpu" and "host" not in registry.get_spec(o.backend).memories:
        raise UnsupportedError(f"ddlcomm's own all-reduces do not train over backend {o.backend}: "
                               "ring's and rhd's transports post non-blocking host messages (ipc's "
                               "ready/done headers, staged blocks), which it refuses, and the device "
                               "shm has not been run over it in training",
                               f"use --backend mpi or gloo with --algorithm {o.algorithm}, or "
                               f"--algorithm library with --backend {o.backend}")


def _device(o: TrainOptions) -> str:
    """The training device: ``--device``, else where the backend's buffers live; checked
    against the machine and against what the backend can be handed."""
    spec = registry.get_spec(o.backend)                   # unknown: names the choices
    name = o.device or ("cpu" if "host" in spec.memories else "cuda")
    device = get_device(name)
    wire_for(name, spec.memories, o.backend)              # refuses a pair that cannot meet
    device.check()
    return name


def _staged(backend: str, device: str) -> bool:
    """Whether ``backend`` is handed host copies of training buffers on ``device``."""
    return wire_for(device, registry.get_spec(backend).memories, backend).copies


def _batches(o: TrainOptions, base: TrainConfig) -> list[int]:
    if o.batch_sweep is not None and o.batch is not None:
        raise UsageError("give --batch or --batch-sweep, not both")
    if o.batch_sweep is not None:
        return sorted({parse_positive_int(b, "--batch-sweep")
                       for b in parse_list(o.batch_sweep, "--batch-sweep")})
    return [parse_positive_int(o.batch, "--batch")] if o.batch else [base.batch]


def _check_data_shares(base: TrainConfig, archs: list[str], ranks: list[int], batch: int) -> None:
    """Refuse --data whose share of some worker cannot fill a batch (it failed in the ranks,
    after the start, the error printed twice); ``archs``: ps's workers are the ranks but
    one, the all-reduce's and DDP's (``ddp``, ``--peer ddp``) every rank."""
    if base.data is None:
        return
    counts = file_images(data_files(base.data))
    for n in ranks:
        for workers in {n - 1 if arch == "ps" else n for arch in archs} - {0}:
            smallest = min(shares(counts, workers))
            if smallest < batch:
                raise UsageError(f"at {counted(workers, 'worker')} a worker's share of --data "
                                 f"holds {counted(smallest, 'image')}, fewer than a batch of "
                                 f"{batch}", "give more images, more files, or a smaller --batch")


#: Copies of the network a rank holds in float32: parameters, gradients, SGD's momentum.
STATE_COPIES = 3


def host_bytes(cfg: TrainConfig, batch: Optional[int] = None) -> tuple[int, int]:
    """(a batch's images, float32 with 3 channels; and where the network lives in host memory,
    its parameters, gradients and momentum): what a training rank holds in host memory at
    least, before activations (:mod:`ddlcomm.train.fits` adds those in the ranks)."""
    workload = get_net(cfg.model).workload
    state = STATE_COPIES * 4 * total_parameters(workload) if workload and cfg.device == "cpu" else 0
    return (cfg.batch if batch is None else batch) * 3 * cfg.image_size ** 2 * 4, state


def _check_batch_memory(base: TrainConfig, batch: int, ranks: int) -> None:
    """Refuse runs whose ranks, all started here, cannot hold :func:`host_bytes`: a lower
    bound (activations, checked in the ranks, and torch's own come on top; 16 ranks of
    vgg16 started on 22 GiB)."""
    images, state = host_bytes(base, batch)
    per_rank = images + state
    available = mem_available()
    if per_rank * ranks > available:
        what = f"a batch of {counted(batch, 'image')} of {base.image_size}x{base.image_size}" + (
            f" and {base.model}'s parameters, gradients and momentum need" if state else " needs")
        raise UsageError(f"{what} {format_size(per_rank)} a rank, "
                         f"{format_size(per_rank * ranks)} at {counted(ranks, 'rank')}: more than "
                         f"the {format_size(available)} available",
                         "use a smaller --batch or --image-size, or fewer --ranks")


def _ranks(o: TrainOptions, launcher_size: Optional[int]) -> list[int]:
    """The rank counts, one launch each (1 added as the weak-scaling baseline)."""
    if o.ranks is not None:
        ranks = sorted({parse_positive_int(r, "--ranks") for r in parse_list(o.ranks, "--ranks")})
    else:
        ranks = [launcher_size or (1 if o.batch_sweep else 2)]
    if launcher_size is not None and len(ranks) > 1:
        raise UsageError(f"under a launcher --ranks is one count, the launcher's ({launcher_size})",
                         "start as many ranks as --ranks says, or leave it out")
    # (one count other than the launcher's: the ranks refuse it together, once joined)
    if len(ranks) > 1 and launcher_size is None and 1 not in ranks:
        ranks = [1] + ranks                      # the weak-scaling baseline: one worker alone
    if o.batch_sweep is not None and ranks != [1]:
        raise UsageError("--batch-sweep trains on one worker",
                         "start 1 rank" if launcher_size is not None else "use --ranks 1 (or leave --ranks out)")
    return ranks
