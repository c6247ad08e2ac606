"""One training configuration inside the ranks: set-up, timed iterations, checks, records.

Per iteration, on every worker, in order: io (the next batch), h2d (moving it
to the device: the CPU here, so nothing moves, timed all the same), forward
(with the loss), backward (gradients; with overlap also the start of bucket
all-reduces), exposed communication (what aggregation still takes after
backward), update (the optimizer step; for ``ps`` the server's step, which the
workers wait for).  Hidden communication is what the same buckets cost alone
(timed after training, outside backward) minus what stayed exposed.  The
first ``warmup`` iterations are not timed.  Ranks do not meet in a barrier
between iterations: synchronous training needs none.

After training the parameters are compared on every rank (element-wise max
and min over ranks must equal each rank's own), so "the replicas are
identical" is checked, not assumed; BatchNorm running statistics are each
rank's own (as in Horovod) and not part of the check.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from ..measure.checks import agree_all
from ..measure.records import make_record
from ..measure.timing import agree_max
from ..errors import UsageError
from . import phases as ph
from .aggregate import Buckets, make_aggregator, ready_order
from .config import TrainConfig
from .data import FolderData, SyntheticData, data_files
from .nets import get_net

clock = time.perf_counter
#: Iterations whose loss is averaged at each end of the curve to say whether it fell.
LOSS_WINDOW = 3


def make_data(cfg: TrainConfig, classes: int, rank: int, size: int):
    if cfg.data is not None:
        return FolderData(data_files(cfg.data), cfg.batch, classes, rank, size, cfg.prefetch)
    return SyntheticData(cfg.batch, cfg.image_size, classes, seed=1000 * cfg.seed + rank + 1)


def build(cfg: TrainConfig):
    """The network, identically initialised on every rank (same seed)."""
    import torch
    torch.manual_seed(cfg.seed)
    model = get_net(cfg.model).build()
    model.train()
    return model


def replicas_identical(comm, flat: np.ndarray) -> bool:
    """True on every rank when every rank holds exactly the same parameters."""
    hi, lo = flat.copy(), flat.copy()
    comm.allreduce(hi, hi, op="max")
    comm.allreduce(lo, lo, op="min")
    return agree_all(comm, bool(np.array_equal(hi, flat) and np.array_equal(lo, flat)))


def loss_summary(losses: np.ndarray) -> dict:
    """The loss curve averaged over workers (rows) and whether it fell."""
    curve = np.nanmean(losses, axis=0) if losses.size else np.zeros(0)
    k = min(LOSS_WINDOW, max(1, len(curve) // 2))
    first, last = float(np.mean(curve[:k])), float(np.mean(curve[-k:]))
    return {"loss": [round(float(v), 5) for v in curve], "loss_first": first, "loss_last": last,
            "loss_decreased": bool(last < first)}


def progress(rank: int, text: str) -> None:
    if rank == 0:
        print(text, file=sys.stderr, flush=True)


def first_pass(model, criterion, x, y, cfg: TrainConfig) -> list[int]:
    """One untimed forward and backward: the order gradients become ready (a clear
    error where the batch and image size leave BatchNorm a single value per channel)."""
    try:
        return ready_order(model, lambda: criterion(model(x), y))
    except ValueError as exc:
        if "value per channel" not in str(exc):
            raise
        raise UsageError(f"{cfg.model} at batch {cfg.batch} and {cfg.image_size}x{cfg.image_size} "
                         "leaves BatchNorm one value per channel",
                         "use --batch 2 or more, or a larger --image-size") from None


def run_config(comm, cfg: TrainConfig) -> list[dict]:
    """Train ``cfg`` on this job; rank 0 returns the records to store."""
    import torch
    torch.set_num_threads(cfg.threads)
    spec = get_net(cfg.model)
    model = build(cfg)
    # Files are shared among the workers; a parameter server reads one batch (for the
    # untimed first pass) and trains on none.
    shard = (comm.rank, comm.size) if cfg.arch != "ps" else \
        ((comm.rank - 1, comm.size - 1) if comm.rank else (0, 1))
    data = make_data(cfg, spec.classes, *shard)
    criterion = torch.nn.CrossEntropyLoss()
    try:
        x, y = data.next()
        order = comm.broadcast_object(first_pass(model, criterion, x, y, cfg) if comm.rank == 0
                                      else None, 0)
        bk = Buckets(list(model.parameters()), order, cfg.fusion)
        for pbuf in bk.pbufs:                       # one starting point, whatever the seed did
            comm.broadcast(pbuf, 0)

        def optimizer():
            return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
        agg = make_aggregator(cfg.arch, comm, bk, cfg.overlap, optimizer, cfg.wait)
        opt = optimizer() if cfg.arch == "allreduce" else None
        worker = not (cfg.arch == "ps" and comm.rank == 0)
        workers = comm.size - 1 if cfg.arch == "ps" else comm.size
        return _train(comm, cfg, model, data, criterion, bk, agg, opt, worker, workers)
    finally:
        data.close()


def _train(comm, cfg, model, data, criterion, bk, agg, opt, worker, workers) -> list[dict]:
    total = cfg.warmup + cfg.iters
    rows = np.zeros((total, len(ph.PHASES)))
    t_iter = np.zeros(total)
    losses = np.full(total, np.nan)
    ready_sum = np.zeros(len(bk.order))
    every = max(1, total // 5)
    comm.barrier()
    t_start = clock()
    for i in range(total):
        if i == cfg.warmup:
            comm.barrier()
            t_start = clock()
        t0 = clock()
        if worker:
            x, y = data.next()
            t1 = clock()
            x, y = x.to("cpu", non_blocking=True), y.to("cpu", non_blocking=True)
            t2 = clock()
            loss = criterion(model(x), y)
            losses[i] = loss.item()
            t3 = clock()
            agg.begin()
            loss.backward()
            t4 = clock()
            if i >= cfg.warmup and len(agg.ready) == len(bk.order):
                ready_sum += ph.layer_times(agg.ready, t3, t4)
        else:
            t1 = t2 = t3 = t4 = t0
            agg.begin()
        agg.finish()
        t5 = clock()
        agg.step(opt)
        t6 = clock()
        rows[i, :6] = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t6 - t5, t5 - t4)
        if not worker:                                # the server: its update happened inside finish
            rows[i, 4], rows[i, 5] = agg.t_apply, t5 - t4 - agg.t_apply
        t_iter[i] = t6 - t0
        if (i + 1) % every == 0 or i + 1 == total:
            progress(comm.rank, f"  iter {i + 1}/{total}  {t_iter[i]:.3f} s"
                                f"{f'  loss {losses[i]:.4f}' if worker else ''}")
    wall = agree_max(comm, clock() - t_start)
    if cfg.arch == "ps":
        # Workers waited for the server's update inside their exposed communication: move it.
        apply_s = rows[:, 4].copy() if comm.rank == 0 else np.zeros(total)
        comm.broadcast(apply_s, 0)
        if worker:                      # the server's update, then the worker's own zeroing
            rows[:, 5] = np.maximum(0.0, rows[:, 5] - apply_s)
            rows[:, 4] += apply_s
    check, identical = "skipped", None
    if cfg.check:
        identical = replicas_identical(comm, bk.flat_params())
    table, t_alone = agg.measure_alone(cfg.comm_reps)
    if cfg.overlap:
        rows[:, 6] = [ph.hidden(t_alone, e) for e in rows[:, 5]]
    layers_s = ready_sum / max(1, cfg.iters)
    gathered = comm.gather(np.concatenate([rows[cfg.warmup:].reshape(-1), t_iter[cfg.warmup:],
                                           losses, layers_s]), root=0)
    agg.close()
    if comm.rank != 0:
        return []
    n, k = cfg.iters, len(ph.PHASES)
    per_rank = gathered.reshape(comm.size, -1)
    keep = slice(1, None) if cfg.arch == "ps" else slice(None)     # workers only
    per_rank = per_rank[keep]
    table3 = per_rank[:, :n * k].reshape(-1, n, k)
    iters_t = per_rank[:, n * k:n * k + n]
    loss_rows = per_rank[:, n * k + n:n * k + n + total]
    layer_means = per_rank[:, n * k + n + total:].mean(axis=0)
    summary = loss_summary(loss_rows)
    ok = identical is not False and math.isfinite(summary["loss_last"])
    if cfg.check:
        check = "passed" if ok else "failed"
    means = ph.mean_phases(table3)
    critical = ph.critical_phases(table3)
    sizes = [bk.params[i].numel() * 4 for i in bk.order]
    layers = [[t, int(b)] for t, b in zip(ph.scale_to(layer_means, critical["backward"]), sizes)]
    comm_table = [[int(b), float(t)] for b, t in table]
    from . import predict
    pred = predict.predict(critical, layers, workers, comm_table, cfg.overlap, cfg.fusion)
    measured_t_iter = wall / n
    iteration = {
        **summary, "replicas_identical": identical, "workers": workers,
        "images_per_s": ph.images_per_s(workers, cfg.batch, measured_t_iter),
        "t_iter_s": measured_t_iter, "phases_s": critical, "phases_mean_s": means,
        "t_comm_alone_s": t_alone,
        "comm_table": comm_table, "layers": layers, "buckets": len(bk.gbufs),
        "bucket_bytes": bk.nbytes,
        "t_iter_predicted_s": pred["t_iter"] if pred else None,
        "predicted": pred, "predicted_error": predict.error(measured_t_iter, pred and pred["t_iter"]),
        "model_available": pred is not None,
        # Autograd runs CPU backward on the calling thread, so the hooks that start
        # MPI calls run on the main thread (MPI is at THREAD_FUNNELED): checked every hook.
        "hooks_on_main_thread": agg.hooks_off_main == 0,
    }
    nparams = sum(p.numel() for p in bk.params)
    records = _records(comm, cfg, table3, iters_t, check, workers, nparams, iteration)
    err = iteration["predicted_error"]
    progress(comm.rank, f"  {measured_t_iter:.3f} s/iter, {iteration['images_per_s']:.1f} images/s, "
                        f"exposed comm {critical['comm_exposed'] * 1e3:.1f} ms, "
                        f"hidden {critical['comm_hidden'] * 1e3:.1f} ms, loss {summary['loss_first']:.3f}"
                        f" -> {summary['loss_last']:.3f}, replicas "
                        f"{'identical' if identical else 'not checked' if identical is None else 'DIFFER'}"
                        + (f", predicted {pred['t_iter']:.3f} s ({err:+.1%})" if pred else
                           ", no S-SGD model installed"))
    return records


def base_extra(cfg: TrainConfig, workers: int, phase: str) -> dict:
    return {"workload": "train", "phase": phase, "model": cfg.model, "arch": cfg.arch,
            "peer": cfg.peer, "overlap": cfg.overlap, "wait": cfg.wait, "fusion": cfg.fusion,
            "batch": cfg.batch,
            "image_size": cfg.image_size, "workers": workers, "threads": cfg.threads,
            "data": "synthetic" if cfg.data is None else "files"}


def _records(comm, cfg, table3, iters_t, check, workers, nparams: int, iteration: dict,
             phase_names=ph.PHASES) -> list[dict]:
    """One record per phase and one for the whole iteration (times: workers x iterations)."""
    out = []
    for k, phase in enumerate(ph.PHASES):
        if phase not in phase_names:
            continue
        out.append(_record(comm, cfg, table3[:, :, k], check, workers, nparams, phase, {}))
    out.append(_record(comm, cfg, iters_t, check, workers, nparams, "iteration", iteration))
    return out


def _record(comm, cfg, times, check, workers, nparams, phase, more) -> dict:
    return make_record(
        comm, collective="train", form="buffer", dtype="float32", op="avg",
        nbytes=int(nparams) * 4, count=int(nparams), root=0, in_place=True,
        iterations=cfg.iters, warmup=cfg.warmup, times=times, algbw_bytes=0, busbw_factor=1.0,
        check=check, extra={**base_extra(cfg, workers, phase), **more})
