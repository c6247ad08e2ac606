"""Measured against predicted: feed a configuration's measurements to the S-SGD model.

The inputs are what the run measured (stored with its iteration point): the
mean per-phase times of one worker, the backward time and gradient bytes of
every parameter tensor in the order they became ready, and the cost of
aggregating each bucket measured alone in the same job (``comm=``: bytes ->
seconds).
"""
from __future__ import annotations

from typing import Sequence

from ..model import ssgd
from .phases import comm_function

#: What our --overlap means in the model's terms.
OVERLAP = {False: "none", True: "wfbp"}


def predict(phases_s: dict, layers: Sequence[Sequence[float]], workers: int,
            comm_table: Sequence[Sequence[float]], overlap: bool, fusion: int,
            io_per_node: bool = False) -> dict:
    """The model's prediction for ``workers`` workers as a dict (seconds).

    ``phases_s`` holds io, h2d, forward, backward, update (seconds per
    iteration of one worker); ``layers`` (backward seconds, gradient bytes)
    in ready order; ``comm_table`` measured (bytes, seconds) of the buckets.
    """
    phases = ssgd.Phases(t_io=phases_s["io"], t_h2d=phases_s["h2d"], t_f=phases_s["forward"],
                         t_b=phases_s["backward"], t_u=phases_s["update"],
                         layers=tuple((float(t), int(b)) for t, b in layers))
    cost = comm_function([(int(b), float(t)) for b, t in comm_table])
    pred = ssgd.predict(phases, workers, comm=cost, overlap=OVERLAP[bool(overlap)],
                        io_per_node=io_per_node, fusion_bytes=fusion if fusion > 0 else None)
    return {"t_iter": pred.t_iter, "t_comm": pred.t_comm, "exposed": pred.exposed,
            "hidden": pred.hidden, "speedup": pred.speedup, "efficiency": pred.efficiency,
            "workers": pred.workers}
