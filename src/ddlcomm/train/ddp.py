"""The peer users would pick: torch DistributedDataParallel, in the same job.

DDP runs over torch.distributed's default process group: the job's backend
where it holds that group (gloo; nccl on the GPU), else a Gloo group started
beside it (under ``--backend mpi``).  On a GPU (``--device cuda``) the model
is on the rank's GPU and DDP is given it as its device.

The same network, seed, data, batch, optimizer and iterations as ddlcomm's
own configuration, through the same timed loop (:mod:`.timed`); DDP's buckets
are ``--fusion`` bytes (``bucket_cap_mb``) and its all-reduces overlap
backward by its own design, so its communication is inside the backward phase
and not timed apart; it does not broadcast module buffers (BatchNorm's statistics) before
each forward, as ddlcomm's own configuration keeps each rank's.  Phases: io, h2d, forward, backward (with DDP's
communication), update.  The replicas are checked the same way.
"""
from __future__ import annotations

import numpy as np

from . import phases as ph
from .config import TrainConfig
from .gather import gather_named
from .device import get_device
from .loop import (ConfigRecords, build, check_verdict, device_facts, loss_summary, make_data,
                   param_bytes, replicas_identical, replicas_word, set_up_rank)
from .nets import get_net
from .sgd import SGD
from .timed import Steps, progress, timed_loop

#: DDP's phases: its communication is inside backward, so none is timed apart.
PHASES = ph.WORK


class DDPSteps(Steps):
    """DDP's iteration: forward through the DDP module; backward communicates; step and zero."""

    comm_after_backward = False

    def __init__(self, ddp, criterion, opt) -> None:
        self.ddp, self.criterion, self.opt = ddp, criterion, opt

    def forward(self, x, y):
        return self.criterion(self.ddp(x), y)

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad()


def run_ddp(comm, gloo_comm, cfg: TrainConfig) -> list[dict]:
    """Train ``cfg`` with DDP over the default process group (``gloo_comm``'s: Gloo, or the
    job's nccl); rank 0 returns records."""
    import torch        # lazy: torch is an optional dependency (the torch extra)
    from torch.nn.parallel import DistributedDataParallel as DDP  # torch is optional (as above)
    rank_facts = set_up_rank(cfg)
    spec = get_net(cfg.model)
    place = get_device(cfg.device).open(comm.local_rank)
    model = build(cfg, place)
    # broadcast_buffers off: ddlcomm's own configuration keeps each rank's BatchNorm statistics,
    # and DDP's broadcast of them from rank 0 before every forward put a collective (and a
    # wait for rank 0) in its timed forward phase
    ddp = DDP(model, device_ids=[place.gpu] if place.on_gpu else None,
              bucket_cap_mb=max(cfg.fusion, 1) / (1 << 20), broadcast_buffers=False)
    data = make_data(cfg, spec.classes, comm.rank, comm.size)
    opt = SGD(ddp.parameters(), lr=cfg.lr, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    try:
        data.next()         # the batch ddlcomm's untimed first pass takes: both train on the same
        timings = timed_loop(comm, DDPSteps(ddp, criterion, opt), data, cfg.warmup, cfg.iters,
                             place)
    finally:
        data.close()
    identical = None
    if cfg.check:
        flat = np.concatenate([p.detach().reshape(-1).cpu().numpy() for p in model.parameters()])
        identical = replicas_identical(comm, flat)
    w = cfg.warmup
    gathered = gather_named(comm, {"phases": timings.phases.table[w:], "t_iter": timings.t_iter[w:],
                                   "loss": timings.losses, "gpu": np.array([place.gpu])})
    if gathered is None:
        return []
    iteration = _iteration_fields(cfg, comm.size, gathered, identical, timings.wall_s)
    check = check_verdict(cfg.check, identical, iteration["loss_last"])
    progress(comm.rank, f"  {iteration['t_iter_s']:.3f} s/iter, {iteration['images_per_s']:.1f} images/s "
                        f"(DDP), loss {iteration['loss_first']:.3f} -> {iteration['loss_last']:.3f}, "
                        f"replicas {replicas_word(identical)}")
    return ConfigRecords(gloo_comm, cfg, check, comm.size, param_bytes(model.parameters()),
                         {**device_facts(place, gathered["gpu"]), **rank_facts}).records(
        gathered["phases"], gathered["t_iter"], iteration, phase_names=PHASES)


def _iteration_fields(cfg: TrainConfig, workers: int, gathered: dict, identical,
                      wall_s: float) -> dict:
    """The iteration record's own fields from every rank's gathered arrays (rank 0)."""
    table3 = gathered["phases"]
    means = {name: v for name, v in ph.mean_phases(table3).items() if name in PHASES}
    critical = {name: v for name, v in ph.critical_phases(table3).items() if name in PHASES}
    t_it = wall_s / cfg.iters
    return {**loss_summary(gathered["loss"]), "replicas_identical": identical, "workers": workers,
            "images_per_s": ph.images_per_s(workers, cfg.batch, t_it), "t_iter_s": t_it,
            "phases_s": critical, "phases_mean_s": means, "comm_in_backward": True}
