"""Weak-scaling points of a run: speed-up and efficiency against one worker (pure).

For every configuration measured at several worker counts, the baseline is
the same network and batch trained by one worker alone, through the same backend and library (the one-rank
``allreduce`` configuration without overlap: no communication to speak of); for DDP,
which runs over its own process group (Gloo beside ``mpi``), its own job's.
Speed-up is ``N * t_iter(1) / t_iter(N)`` (fixed batch per worker),
efficiency is speed-up / N; the model's are computed from the *baseline's*
phases with the communication measured at N, which is the S-SGD model's
question: knowing one worker and the network, how does it scale?
"""
from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping, Optional

from . import phases as ph
from . import predict

Point = Mapping[str, Any]


def extra(p: Point) -> dict:
    return p.get("extra") or {}


def iteration_points(points: Iterable[Point]) -> list[Point]:
    return [p for p in points if p.get("collective") == "train" and extra(p).get("phase") == "iteration"]


def _baseline(iters: list[Point], p: Point) -> Optional[Point]:
    e = extra(p)
    ddp = e.get("peer") == "ddp"        # its points name its group's backend (Gloo beside mpi)
    for q in iters:
        f = extra(q)
        same = q.get("run_id") == p.get("run_id") if ddp else \
            (q.get("backend"), q.get("library")) == (p.get("backend"), p.get("library"))
        if (f.get("workers") == 1 and q.get("ranks") == 1 and f.get("model") == e.get("model")
                and same and f.get("batch") == e.get("batch")
                and f.get("image_size") == e.get("image_size")
                and f.get("peer") == "ddlcomm" and f.get("arch") == "allreduce" and not f.get("overlap")):
            return q
    return None


def scaling_points(points: Iterable[Point]) -> list[dict]:
    """One ``scaling`` point per measured configuration that has a one-worker baseline."""
    iters = iteration_points(points)
    out = []
    for p in iters:
        base = _baseline(iters, p)
        if base is None:
            continue
        e, b = extra(p), extra(base)
        n, t1, tn = e["workers"], b["t_iter_s"], e["t_iter_s"]
        pred = None
        if e.get("comm_table") and b.get("phases_s") and b.get("layers") is not None:
            pred = predict.predict(b["phases_s"], b["layers"], n, e["comm_table"],
                                   bool(e.get("overlap")), int(e.get("fusion") or 0))
        rec = {k: copy.deepcopy(v) for k, v in p.items() if k not in ("run_id", "extra")}
        rec["extra"] = {
            **{k: e[k] for k in ("workload", "model", "arch", "peer", "overlap", "wait", "fusion",
                                 "batch", "image_size", "workers", "threads", "heap", "data", "device",
                                 "sync", "gpu", "ranks_per_gpu", "gpu_name", "gpus")
               if k in e},
            "phase": "scaling", "t_iter_s": tn, "baseline_t_iter_s": t1,
            "images_per_s": e.get("images_per_s"),
            "speedup": ph.speedup(n, t1, tn), "efficiency": ph.efficiency(n, t1, tn),
            "speedup_predicted": pred["speedup"] if pred else None,
            "efficiency_predicted": pred["efficiency"] if pred else None,
            "t_iter_predicted_from_1_s": pred["t_iter"] if pred else None,
        }
        out.append(rec)
    return out
