"""The peer users would pick: torch DistributedDataParallel over Gloo, in the same job.

The same network, seed, data, batch, optimizer and iterations as ddlcomm's
own configuration; DDP's buckets are ``--fusion`` bytes (``bucket_cap_mb``)
and its all-reduces overlap backward by its own design, so its communication
is inside the backward phase and not timed apart.  Phases: io, h2d, forward,
backward (with DDP's communication), update.  The replicas are checked the
same way.
"""
from __future__ import annotations

import math

import numpy as np

from ..measure.timing import agree_max
from . import phases as ph
from .config import TrainConfig
from .loop import _records, build, clock, loss_summary, make_data, progress, replicas_identical
from .nets import get_net

PHASES = ("io", "h2d", "forward", "backward", "update")


def run_ddp(comm, gloo_comm, cfg: TrainConfig) -> list[dict]:
    """Train ``cfg`` with DDP over the default (Gloo) process group; rank 0 returns records."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(cfg.threads)
    spec = get_net(cfg.model)
    model = build(cfg)
    ddp = DDP(model, bucket_cap_mb=max(cfg.fusion, 1) / (1 << 20))
    data = make_data(cfg, spec.classes, comm.rank, comm.size)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    total = cfg.warmup + cfg.iters
    rows = np.zeros((total, len(ph.PHASES)))
    t_iter = np.zeros(total)
    losses = np.full(total, np.nan)
    every = max(1, total // 5)
    try:
        comm.barrier()
        t_start = clock()
        for i in range(total):
            if i == cfg.warmup:
                comm.barrier()
                t_start = clock()
            t0 = clock()
            x, y = data.next()
            t1 = clock()
            x, y = x.to("cpu", non_blocking=True), y.to("cpu", non_blocking=True)
            t2 = clock()
            loss = criterion(ddp(x), y)
            losses[i] = loss.item()
            t3 = clock()
            loss.backward()
            t4 = clock()
            opt.step()
            opt.zero_grad()
            t5 = clock()
            rows[i, :5] = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
            t_iter[i] = t5 - t0
            if (i + 1) % every == 0 or i + 1 == total:
                progress(comm.rank, f"  iter {i + 1}/{total}  {t_iter[i]:.3f} s  loss {losses[i]:.4f}")
        wall = agree_max(comm, clock() - t_start)
    finally:
        data.close()
    identical = None
    if cfg.check:
        flat = np.concatenate([p.detach().reshape(-1).numpy() for p in model.parameters()])
        identical = replicas_identical(comm, flat.astype(np.float32))
    gathered = comm.gather(np.concatenate([rows[cfg.warmup:].reshape(-1), t_iter[cfg.warmup:], losses]),
                           root=0)
    if comm.rank != 0:
        return []
    n, k = cfg.iters, len(ph.PHASES)
    per_rank = gathered.reshape(comm.size, -1)
    table3 = per_rank[:, :n * k].reshape(-1, n, k)
    summary = loss_summary(per_rank[:, n * k + n:])
    check = "skipped"
    if cfg.check:
        check = "passed" if identical and math.isfinite(summary["loss_last"]) else "failed"
    means = {name: v for name, v in ph.mean_phases(table3).items() if name in PHASES}
    critical = {name: v for name, v in ph.critical_phases(table3).items() if name in PHASES}
    t_it = wall / n
    nparams = sum(p.numel() for p in model.parameters())
    iteration = {**summary, "replicas_identical": identical, "workers": comm.size,
                 "images_per_s": ph.images_per_s(comm.size, cfg.batch, t_it), "t_iter_s": t_it,
                 "phases_s": critical, "phases_mean_s": means, "comm_in_backward": True}
    progress(comm.rank, f"  {t_it:.3f} s/iter, {iteration['images_per_s']:.1f} images/s (DDP), loss "
                        f"{summary['loss_first']:.3f} -> {summary['loss_last']:.3f}, replicas "
                        f"{'identical' if identical else 'not checked' if identical is None else 'DIFFER'}")
    return _records(gloo_comm, cfg, table3, per_rank[:, n * k:n * k + n], check, comm.size, nparams,
                    iteration, phase_names=PHASES)
