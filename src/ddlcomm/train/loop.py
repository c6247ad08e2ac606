"""One training configuration inside the ranks: set-up, timed iterations, checks, records.

Per iteration, on every worker, in order (the loop is :mod:`.timed`'s, shared
with DDP): io (the next batch), h2d (moving it to the device: on the CPU
nothing moves, timed all the same), forward (with the loss), backward
(gradients; with overlap also the start of bucket all-reduces), exposed
communication (what aggregation still takes after backward), update (the
optimizer step; for ``ps`` the server's step, which the workers wait for).
Hidden communication is what the same buckets cost alone (timed after
training, outside backward) minus what stayed exposed.  On a GPU
(``--device cuda``) every phase ends with a CUDA synchronisation and the
gradients' ready moments are CUDA events.  The first ``warmup``
iterations are not timed.  Ranks do not meet in a barrier between iterations:
synchronous training needs none.

After training the parameters are copied to the host and compared on every
rank (element-wise max and min over ranks must equal each rank's own), so "the replicas are
identical" is checked, not assumed; BatchNorm running statistics are each
rank's own (as in Horovod) and not part of the check.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Optional

import numpy as np

from ..comm import registry
from ..comm.agree import agree_all
from ..measure.records import make_record
from ..measure.stats import relative_error
from ..memory import heap
from . import phases as ph
from . import predict
from .aggregate import Buckets, make_aggregator, ready_order
from .config import TrainConfig
from .data import FolderData, SyntheticData, data_files
from .device import HOST, Placed, get_device
from .gather import gather_named
from .nets import get_net
from .sgd import SGD
from .timed import Steps, progress, timed_loop
from .wire import wire_for

__all__ = ["run_config", "set_up_rank", "progress", "build", "make_data", "loss_summary",
           "replicas_identical", "ConfigRecords", "ParamBytes", "param_bytes"]

#: Iterations whose loss is averaged at each end of the curve to say whether it fell.
LOSS_WINDOW = 3


def make_data(cfg: TrainConfig, classes: int, rank: int, size: int):
    if cfg.data is not None:
        return FolderData(data_files(cfg.data), cfg.batch, rank, size, cfg.prefetch)
    return SyntheticData(cfg.batch, cfg.image_size, classes, seed=1000 * cfg.seed + rank + 1)


def set_up_rank(cfg: TrainConfig) -> dict:
    """This rank's process as ``cfg`` asks (torch's threads, the C library's heap); what its
    records say of it."""
    import torch        # lazy: torch is an optional dependency (the torch extra)
    torch.set_num_threads(cfg.threads)
    return {"heap": heap.apply(cfg.heap)}


def build(cfg: TrainConfig, place: Placed = HOST):
    """The network, identically initialised on every rank (same seed), on ``place``."""
    import torch        # lazy: torch is an optional dependency (the torch extra)
    torch.manual_seed(cfg.seed)
    model = get_net(cfg.model).build().to(place.target)
    model.train()
    return model


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal(a, b, equal_nan=True)`` for two float arrays of one shape (pure):
    equal, or NaN in both.  NumPy's masks every element (0.56 s for ResNet-50's 25.6 M
    parameters here); this looks only at the elements that differ (0.01 s)."""
    differ = a != b                 # NaN differs from everything, itself included
    if not differ.any():
        return True
    return bool(np.isnan(a[differ]).all() and np.isnan(b[differ]).all())


def replicas_identical(comm, flat: np.ndarray) -> bool:
    """True on every rank when every rank holds exactly the same parameters."""
    hi, lo = flat.copy(), flat.copy()
    comm.allreduce(hi, hi, op="max")
    comm.allreduce(lo, lo, op="min")
    same = same_values(hi, flat) and same_values(lo, flat)
    return agree_all(comm, same)    # NaN everywhere is identical (the loss check fails it)


def check_verdict(check: bool, identical: Optional[bool], loss_last: float) -> str:
    """A configuration's check (ddlcomm's or DDP's): replicas not found to differ and a
    finite last loss; skipped without ``--check``."""
    if not check:
        return "skipped"
    return "passed" if identical is not False and math.isfinite(loss_last) else "failed"


def replicas_word(identical: Optional[bool]) -> str:
    """How the summary line says the replicas' check."""
    return "identical" if identical else "not checked" if identical is None else "DIFFER"


def loss_summary(losses: np.ndarray) -> dict:
    """The loss curve averaged over workers (rows) and whether it fell."""
    with warnings.catch_warnings():           # an iteration whose every loss is NaN stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        curve = np.nanmean(losses, axis=0) if losses.size else np.zeros(0)
    k = min(LOSS_WINDOW, max(1, len(curve) // 2))
    first, last = float(np.mean(curve[:k])), float(np.mean(curve[-k:]))
    return {"loss": [round(float(v), 5) for v in curve], "loss_first": first, "loss_last": last,
            "loss_decreased": bool(last < first)}


def first_pass(model, criterion, x, y) -> list[int]:
    """One untimed forward and backward: the order gradients become ready (a batch that
    leaves BatchNorm one value per channel was refused before: ``fits.check_batch_norm``)."""
    return ready_order(model, lambda: criterion(model(x), y))


@dataclass(frozen=True)
class ParamBytes:
    """The parameters as the stored records give them: dtype name, elements and bytes."""
    dtype: str
    count: int
    nbytes: int


def param_bytes(params: Iterable) -> ParamBytes:
    """Element count and bytes of ``params`` from their own dtypes; the dtype's name as torch
    gives it without ``torch.`` (``"mixed"`` where the parameters differ)."""
    params = list(params)
    names = {str(p.dtype).removeprefix("torch.") for p in params}
    return ParamBytes(names.pop() if len(names) == 1 else "mixed",
                      int(sum(p.numel() for p in params)),
                      int(sum(p.numel() * p.element_size() for p in params)))


@dataclass
class Training:
    """What one ddlcomm configuration trains with on this rank."""
    comm: Any
    cfg: TrainConfig
    model: Any
    data: Any
    criterion: Any
    bk: Buckets
    agg: Any                    # AllreduceAggregator or PSAggregator
    opt: Any                    # the local optimizer (allreduce); None for ps
    place: Placed = HOST
    rank_facts: dict = field(default_factory=dict)      # what set_up_rank set

    @property
    def worker(self) -> bool:
        """False on the parameter server, which computes no gradients."""
        return not (self.cfg.arch == "ps" and self.comm.rank == 0)

    @property
    def workers(self) -> int:
        return self.comm.size - 1 if self.cfg.arch == "ps" else self.comm.size


class AggregatorSteps(Steps):
    """ddlcomm's iteration: the aggregator begins before backward, finishes after it, then steps.

    The parameter server computes nothing; its update happens inside
    ``finish``, so its update phase is the aggregator's apply time and its
    exposed communication the rest.  Sums the per-gradient backward times of
    the timed iterations (``ready_sum``) where every gradient was seen.
    """

    def __init__(self, t: Training) -> None:
        self.t = t
        self.computes = t.worker
        self.ready_sum = np.zeros(len(t.bk.order))
        self.windows: list[float] = []        # per iteration: backward after the first start
        self._start = None
        self._backward: Optional[tuple] = None    # (iteration, start, end, first start stamp)

    def forward(self, x, y):
        return self.t.criterion(self.t.model(x), y)

    def begin(self) -> None:
        self._start = self.t.place.stamp()
        self.t.agg.begin()

    def backward_done(self, iteration: int, start: float, end: float) -> None:
        # the stamps are read in adjust(), once the iteration's clock has stopped: on a GPU
        # each is a CUDA event's elapsed_time, which would count as exposed communication
        self._backward = (iteration, start, end, self.t.agg.started)

    def _read_stamps(self, iteration: int, start: float, end: float, started) -> None:
        """Backward's window after the first all-reduce started, and each gradient's time
        (the aggregator's stamps stay until the next ``begin``)."""
        agg, seconds = self.t.agg, self.t.place.seconds
        self.windows.append(0.0 if started is None else
                            max(0.0, end - seconds([started], self._start, start)[0]))
        if iteration >= self.t.cfg.warmup and len(agg.ready) == len(self.t.bk.order):
            self.ready_sum += ph.layer_times(seconds(agg.ready, self._start, start), start, end)

    def finish(self) -> None:
        self.t.agg.finish()

    def update(self) -> None:
        self.t.agg.step(self.t.opt)

    def adjust(self, seconds: dict[str, float]) -> None:
        if self._backward is not None:
            self._read_stamps(*self._backward)
            self._backward = None
        if not self.computes:                 # the server: its update happened inside finish
            seconds["update"] = self.t.agg.t_apply
            seconds["comm_exposed"] -= self.t.agg.t_apply


def run_config(comm, cfg: TrainConfig, place: Optional[Placed] = None,
               wire: Optional[type] = None) -> list[dict]:
    """Train ``cfg`` on this job; rank 0 returns the records to store.

    ``place`` (default: ``cfg.device`` opened for this rank) and ``wire`` (default: the one
    :func:`~.wire.wire_for` picks for it and the backend) are given by tests that run the
    GPU's plumbing with the CPU standing in.
    """
    import torch        # lazy: torch is an optional dependency (the torch extra)
    rank_facts = set_up_rank(cfg)
    spec = get_net(cfg.model)
    place = place or get_device(cfg.device).open(comm.local_rank)
    model = build(cfg, place)
    # Files are shared among the workers; a parameter server reads one batch (for the
    # untimed first pass) and trains on none.
    shard = (comm.rank, comm.size) if cfg.arch != "ps" else \
        ((comm.rank - 1, comm.size - 1) if comm.rank else (0, 1))
    data = make_data(cfg, spec.classes, *shard)
    criterion = torch.nn.CrossEntropyLoss()
    try:
        x, y = (t.to(place.target) for t in data.next())
        if cfg.arch == "ps" and comm.rank == 0:
            data.close()        # the server's reader would read ahead and poll while it is timed
        order = comm.broadcast_object(first_pass(model, criterion, x, y) if comm.rank == 0
                                      else None, 0)
        bk = Buckets(list(model.parameters()), order, cfg.fusion,
                     wire or wire_for(place.name, comm.memories, comm.name))
        for w in bk.pwires:                         # one starting point, whatever the seed did
            w.push()
            comm.broadcast(w.buf, 0)
            w.pull()
        place.sync()

        def optimizer():
            return SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
        # Backends that hold an MPI handle run MPI at THREAD_FUNNELED: main thread only.
        any_thread = not registry.get_spec(comm.name).mpi_handle
        agg = make_aggregator(cfg.arch, comm, bk, cfg.overlap, optimizer, cfg.wait, place,
                              any_thread, cfg.algorithm)
        opt = optimizer() if cfg.arch == "allreduce" else None
        return _train(Training(comm, cfg, model, data, criterion, bk, agg, opt, place, rank_facts))
    finally:
        data.close()


def _train(t: Training) -> list[dict]:
    """The timed loop, the checks and the buckets alone; rank 0 returns the records."""
    steps = AggregatorSteps(t)
    timings = timed_loop(t.comm, steps, t.data, t.cfg.warmup, t.cfg.iters, t.place)
    if t.cfg.arch == "ps":
        _move_server_update(t, timings.phases)
    identical = replicas_identical(t.comm, t.bk.flat_params()) if t.cfg.check else None
    alone = t.agg.measure_alone(t.cfg.comm_reps)    # ((bytes, s) per bucket and rep, total s)
    if t.cfg.overlap:
        timings.phases["comm_hidden"] = [ph.hidden(alone[1], e, w) for e, w in
                                         zip(timings.phases["comm_exposed"], steps.windows)]
    w = t.cfg.warmup
    gathered = gather_named(t.comm, {"phases": timings.phases.table[w:], "t_iter": timings.t_iter[w:],
                                     "loss": timings.losses,
                                     "layers": steps.ready_sum / max(1, t.cfg.iters),
                                     "gpu": np.array([t.place.gpu])})
    t.agg.close()
    if gathered is None:
        return []
    keep = slice(1, None) if t.cfg.arch == "ps" else slice(None)     # workers only
    workers_only = {name: a[keep] for name, a in gathered.items()}
    iteration = _iteration_fields(t, workers_only, identical, alone, timings.wall_s)
    check = check_verdict(t.cfg.check, identical, iteration["loss_last"])
    out = ConfigRecords(t.comm, t.cfg, check, t.workers, param_bytes(t.bk.params),
                        {**device_facts(t.place, gathered["gpu"]), **t.rank_facts}).records(
        workers_only["phases"], workers_only["t_iter"], iteration)
    _print_summary(t.comm.rank, iteration)
    return out


def _move_server_update(t: Training, phases: ph.PhaseTimes) -> None:
    """Workers waited for the server's update inside their exposed communication: move it."""
    apply_s = phases["update"].copy() if t.comm.rank == 0 else np.zeros(len(phases.table))
    t.comm.broadcast(apply_s, 0)
    if t.worker:                      # the server's update, then the worker's own zeroing
        phases["comm_exposed"] = np.maximum(0.0, phases["comm_exposed"] - apply_s)
        phases["update"] += apply_s


def _iteration_fields(t: Training, g: dict[str, np.ndarray], identical, alone: tuple,
                      wall_s: float) -> dict:
    """The iteration record's own fields from the workers' gathered arrays (rank 0);
    ``alone``: the buckets' cost alone, as :meth:`measure_alone` gives it."""
    comm_table, t_alone = alone
    summary = loss_summary(g["loss"])
    means = ph.mean_phases(g["phases"])
    critical = ph.critical_phases(g["phases"])
    sizes = [p.numel() * p.element_size() for p in (t.bk.params[i] for i in t.bk.order)]
    layer_means = g["layers"].mean(axis=0)
    layers = [[s, int(b)] for s, b in zip(ph.scale_to(layer_means, critical["backward"]), sizes)]
    comm_table = [[int(b), float(s)] for b, s in comm_table]
    pred = predict.predict(critical, layers, t.workers, comm_table, t.cfg.overlap, t.cfg.fusion)
    measured_t_iter = wall_s / t.cfg.iters
    return {
        **summary, "replicas_identical": identical, "workers": t.workers,
        "images_per_s": ph.images_per_s(t.workers, t.cfg.batch, measured_t_iter),
        "t_iter_s": measured_t_iter, "phases_s": critical, "phases_mean_s": means,
        "t_comm_alone_s": t_alone,
        "comm_table": comm_table, "layers": layers, "buckets": len(t.bk.gbufs),
        "bucket_bytes": t.bk.nbytes,
        "t_iter_predicted_s": pred["t_iter"],
        "predicted": pred, "predicted_error": relative_error(measured_t_iter, pred["t_iter"]),
        **t.agg.facts(),
        "wire": t.bk.wire.kind,
    }


def _print_summary(rank: int, it: dict) -> None:
    critical, pred, identical = it["phases_s"], it["predicted"], it["replicas_identical"]
    progress(rank, f"  {it['t_iter_s']:.3f} s/iter, {it['images_per_s']:.1f} images/s, "
                   f"exposed comm {critical['comm_exposed'] * 1e3:.1f} ms, "
                   f"hidden {critical['comm_hidden'] * 1e3:.1f} ms, loss {it['loss_first']:.3f}"
                   f" -> {it['loss_last']:.3f}, replicas {replicas_word(identical)}"
                   + f", predicted {pred['t_iter']:.3f} s ({it['predicted_error']:+.1%})")


def base_extra(cfg: TrainConfig, workers: int, phase: str) -> dict:
    return {"workload": "train", "phase": phase, "model": cfg.model, "arch": cfg.arch,
            "peer": cfg.peer, "overlap": cfg.overlap, "wait": cfg.wait, "fusion": cfg.fusion,
            "batch": cfg.batch, "device": cfg.device,
            "image_size": cfg.image_size, "workers": workers, "threads": cfg.threads,
            "data": "synthetic" if cfg.data is None else "files"}


def device_facts(place: Placed, gpus: np.ndarray) -> dict:
    """Where a configuration trained, for its records: rank 0's device facts, and on a GPU
    every rank's GPU (``gpus``: one row per rank) and how many ranks shared each."""
    facts = dict(place.facts)
    if place.on_gpu:
        per_rank = [int(g) for g in np.asarray(gpus).reshape(-1)]
        facts.update(gpu=per_rank, ranks_per_gpu=[per_rank.count(g) for g in per_rank])
    return facts


@dataclass(frozen=True)
class ConfigRecords:
    """The stored records of one configuration: what they share, and how each is made."""
    comm: Any
    cfg: TrainConfig
    check: str                  # passed | failed | skipped
    workers: int
    params: ParamBytes
    facts: dict = field(default_factory=dict)    # where and how: device_facts, set_up_rank's

    def records(self, table3: np.ndarray, iters_t: np.ndarray, iteration: dict,
                phase_names: Collection[str] = ph.PHASES) -> list[dict]:
        """One record per phase and one for the whole iteration (times: workers x iterations)."""
        out = [self.record(table3[:, :, ph.phase_index(phase)], phase, {})
               for phase in ph.PHASES if phase in phase_names]
        out.append(self.record(iters_t, "iteration", iteration))
        return out

    def record(self, times: np.ndarray, phase: str, more: dict) -> dict:
        cfg = self.cfg
        return make_record(
            self.comm, collective="train", form="buffer", dtype=self.params.dtype, op="avg",
            nbytes=self.params.nbytes, count=self.params.count, root=0, in_place=True,
            iterations=cfg.iters, warmup=cfg.warmup, times=times, algbw_bytes=None, busbw_factor=1.0,
            check=self.check, algorithm=cfg.algorithm,
            extra={**base_extra(cfg, self.workers, phase), **self.facts, **more})
