"""Timing the reduction kernels against NumPy: ``ddlcomm kernels``.

Each (dtype, kernel) reduces two buffers of ``nbytes`` in place,
``reduce(a, b, a)``, once untimed, then once per round; rounds interleave every pair so drift
hits them alike, and the median per pair is reported.  Bandwidth is buffer
bytes per second (one buffer's bytes over one pass's time, as ``np.add``'s
bandwidth is usually quoted); ``vs_reference`` divides it by the bandwidth of
NumPy's float32 ufunc of the same op (``np.add(a, b, out=a)`` for sum, named in
``reference``) measured in the same rounds.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..dtypes import check_whole, get_dtype, get_op
from ..errors import UsageError
from ..units import about_size, format_size
from . import describe, reducer

#: The reference every bandwidth is divided by.
REFERENCE = ("float32", "numpy")


def check_request(dtypes: Sequence[str], nbytes: int, available: int) -> None:
    """Refuse a size that is empty, not whole elements of every dtype, or beyond ``available``
    bytes (two buffers per dtype, the reference's too), before anything is allocated."""
    if nbytes <= 0:
        raise UsageError(f"--size must be above 0 bytes, got {nbytes}", "e.g. --size 256MiB")
    for name in dtypes:
        check_whole(nbytes, get_dtype(name), "--size")
    ref = get_dtype(REFERENCE[0])
    if nbytes % ref.itemsize:               # the ratios compare the same bytes
        raise UsageError(f"--size {format_size(nbytes)} is not whole {ref.name} elements, the "
                         f"reference every kernel is compared with",
                         f"give multiples of {ref.itemsize} B")
    need = 2 * nbytes * len({*dtypes, REFERENCE[0]})
    if need > available:
        raise UsageError(f"--size {format_size(nbytes)} needs about {about_size(need)} of memory "
                         f"(two buffers per dtype), more than the {format_size(available)} available",
                         "use a smaller --size or fewer --dtype")


def measure(dtypes: Sequence[str], nbytes: int, kernels: Sequence[str] = ("numpy", "c"),
            rounds: int = 7, op: str = "sum", progress=None) -> list[dict]:
    """One record per (dtype, kernel), the reference first: median time, GB/s, ratio to the reference."""
    pairs = list(dict.fromkeys([REFERENCE, *((d, k) for d in dtypes for k in kernels)]))
    buffers = {}
    for dname, _ in pairs:
        if dname not in buffers:
            dt = get_dtype(dname)
            n = max(1, nbytes // dt.itemsize)
            buffers[dname] = (np.ones(n, dt.numpy), np.ones(n, dt.numpy))
    fns = {pair: reducer(op, pair[0], pair[1]) for pair in pairs}
    for pair in pairs:          # untimed: the first pass pays for page faults and cold caches
        fns[pair](*buffers[pair[0]], buffers[pair[0]][0])
    times: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    for _ in range(rounds):
        for pair in pairs:
            a, b = buffers[pair[0]]
            a[...] = 1                              # the same values every round
            b[...] = 1
            t0 = time.perf_counter()
            fns[pair](a, b, a)
            times[pair].append(time.perf_counter() - t0)
            if progress is not None:
                progress.update(1)
    ref = float(np.median(times[REFERENCE]))
    reference = f"np.{get_op(op).ufunc.__name__} {REFERENCE[0]}"
    out = []
    for pair in pairs:
        t = float(np.median(times[pair]))
        size = buffers[pair[0]][0].nbytes
        out.append({"dtype": pair[0], "kernel": pair[1], "op": op, "runs_on": describe(fns[pair]),
                    "bytes": size, "t_ms": t * 1e3, "GBps": size / t / 1e9,
                    "vs_reference": (size / t) / (buffers[REFERENCE[0]][0].nbytes / ref),
                    "reference": reference})
    return out
