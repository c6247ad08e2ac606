"""The stored record of one measured point (the fields README documents)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..collectives import Collective
from ..dtypes import DType, ReduceOp
from . import stats


def make_record(comm, *, collective: str, form: str, dtype: str, op: Optional[str],
                nbytes: int, count: int, root: int, in_place: bool, iterations: int,
                warmup: int, times: np.ndarray, algbw_bytes: Optional[int], busbw_factor: float,
                check: str, algorithm: str = "library", extra: Optional[dict] = None) -> dict:
    """The record of one point from its (ranks x iterations) matrix of times in seconds
    (``algbw_bytes`` None: a time that is no transfer, stored without a bandwidth).  The
    bandwidth divides by the ranks' mean time, as nccl-tests does, or by the time
    ``extra["bandwidth_time"]`` names (a copy phase: ``t_max_us``, its slowest copier's,
    where the ranks that copy nothing record about 0 s)."""
    summary = stats.summarize(times)
    on = (extra or {}).get("bandwidth_time", "t_avg_us")
    algbw, busbw = (None, None) if algbw_bytes is None else \
        stats.bandwidth(algbw_bytes, summary[on], busbw_factor)
    return {
        "backend": comm.name, "library": comm.library, "library_version": comm.library_version,
        "collective": collective, "form": form, "algorithm": algorithm,
        "dtype": dtype, "op": op, "bytes": nbytes, "count": count, "ranks": comm.size,
        "root": root, "in_place": in_place, "iterations": iterations, "warmup": warmup,
        **summary, "algbw_GBps": algbw, "busbw_GBps": busbw,
        "check": check, "error": None, "extra": extra or {},
    }


def collective_records(comm, coll: Collective, dtype: DType, op: Optional[ReduceOp], count: int,
                       times: np.ndarray, *, form: str, root: int, in_place: bool,
                       iterations: int, warmup: int, check: str, algorithm: str = "library",
                       extra: Optional[dict] = None) -> list[dict]:
    """Gather every rank's per-call ``times`` of one collective point to rank 0, which
    returns its record (the others an empty list)."""
    gathered = comm.gather(times, root=0)
    if comm.rank != 0:
        return []
    moved = count * dtype.itemsize
    return [make_record(
        comm, collective=coll.name, form=form, dtype=dtype.name,
        op=op.name if op else None, nbytes=moved, count=count, root=root,
        in_place=in_place, iterations=iterations, warmup=warmup,
        times=gathered.reshape(comm.size, iterations),
        algbw_bytes=coll.algbw_bytes(moved, comm.size),
        busbw_factor=coll.busbw_factor(comm.size), check=check, algorithm=algorithm,
        extra=extra)]


def backend_facts(comm) -> dict:
    """What every rank's backend says about the point just measured (``point_facts``),
    merged at rank 0 (:func:`facts_at_root`)."""
    return facts_at_root(comm, comm.point_facts())


def facts_at_root(comm, facts: dict) -> dict:
    """Every rank's ``facts`` gathered and merged at rank 0 by :func:`merge_facts` (the
    others get {})."""
    said = comm.gather_object(facts, root=0)
    return merge_facts(said) if comm.rank == 0 else {}


def merge_facts(said: list[dict]) -> dict:
    """Every rank's facts as one (pure): a table (NCCL's transports per pair) joins every
    rank's entries, a list is their union; anything else is the first rank's."""
    merged: dict = {}
    for facts in said:
        for key, value in facts.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            elif isinstance(value, list) and isinstance(merged.get(key), list):
                merged[key] = sorted(set(merged[key]) | set(value))
            else:
                merged.setdefault(key, value)
    return merged
