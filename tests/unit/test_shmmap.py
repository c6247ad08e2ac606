"""The mapped shm all-reduce (ddlcomm.comm._shmmap, shm_mapped's pure parts), without MPI.

As for the pipelined engine (test_shmpipe.py), p threads of one process are p
real ranks to it: it releases the GIL for a whole call and its ranks meet only
through counters in the control segment.  Every rank's buffers are plain arrays
here, all mapped already (one address space).  Under real ranks, with pages moved
into shared memory: tests/mpi/test_shm.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from ddlcomm.comm import shm_mapped
from ddlcomm.dtypes import DTYPES
from ddlcomm.kernels import available, reducer
from thread_ranks import run_as_ranks

pytestmark = pytest.mark.skipif(shm_mapped._shmmap is None or available()["c"].startswith("missing"),
                                reason="the C kernel or the mapped engine is not built")
EDGE = shm_mapped._shmmap.EDGE_BYTES if shm_mapped._shmmap is not None else 0


def run_ranks(inputs, outputs, red, lo, hi, piece=128, calls=1, stream_min=-1):
    """Every rank (a thread) runs ``calls`` all-reduces; their errors, if any."""
    p = len(inputs)
    ctl = np.zeros(shm_mapped._shmmap.control_bytes(p), np.uint8)
    sends = tuple(x.view(np.uint8)[lo:hi] for x in inputs)
    recvs = tuple(x.view(np.uint8)[lo:hi] for x in outputs)

    def rank(r):
        call = 0
        for _ in range(calls):
            call = shm_mapped._shmmap.allreduce(ctl, sends, recvs, inputs[r], outputs[r], lo, hi, red, r, p,
                                                piece, call, 1.0, stream_min)
    return run_as_ranks(p, rank)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("dname", sorted(DTYPES))
@pytest.mark.parametrize("opname", ["sum", "max", "prod"])
def test_every_dtype_and_op_with_edges(p, dname, opname):
    dt = DTYPES[dname]
    n = 3001                                   # not a whole number of lines or pieces
    hi_limit = 3 if opname == "prod" else 20
    inputs = [np.random.default_rng(q).integers(1, hi_limit, n).astype(dt.numpy) for q in range(p)]
    outputs = [np.zeros(n, dt.numpy) for _ in range(p)]
    ref = np.stack(inputs).astype(np.float64 if dt.is_float else np.int64)
    want = {"sum": ref.sum(0), "max": ref.max(0), "prod": ref.prod(0)}[opname].astype(dt.numpy)
    lo, hi = 7 * dt.itemsize, (n - 5) * dt.itemsize          # both edges in the slots
    assert run_ranks(inputs, outputs, reducer(opname, dt), lo, hi) == []
    for got in outputs:
        if dt.is_float:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=8 * dt.eps)
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("stream_min", [-1, 0])
def test_in_place_repeated_calls_and_only_edges(stream_min):
    """In place the engine never streams (the lines it writes were just read: in the caches,
    16 MiB at 2 ranks took 2.1 ms streamed against 0.9 ms not), whatever stream_min says."""
    p, n = 3, 20000
    inputs = [np.full(n, q + 1, np.float32) for q in range(p)]
    assert run_ranks(inputs, inputs, reducer("sum", "float32"), 64, n * 4 - 64, calls=3,
                     stream_min=stream_min) == []
    for got in inputs:                         # in place, three calls: (1+2+3), then x3, x3
        assert (got == 54).all()
    small = [np.full(10, q + 1, np.int32) for q in range(p)]
    out = [np.zeros(10, np.int32) for _ in range(p)]
    assert run_ranks(small, out, reducer("sum", "int32"), 40, 40) == []    # nothing mapped
    assert all((o == 6).all() for o in out)


def test_streaming_copies_out_of_place():
    p, n = 3, 50000
    inputs = [np.full(n, q + 1, np.float64) for q in range(p)]
    outputs = [np.zeros(n, np.float64) for _ in range(p)]
    assert run_ranks(inputs, outputs, reducer("sum", "float64"), 0, n * 8, piece=4096, calls=2,
                     stream_min=0) == []
    assert all((o == 6).all() for o in outputs) and (inputs[2] == 3).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"lo": 3}, "whole elements"),
    ({"lo": 8, "hi": 4}, "whole elements"),
    ({"lo": EDGE, "hi": EDGE + 64}, "edge slot"),
    ({"piece": 100}, "multiple of 64"),
    ({"parts": 1}, "one buffer per rank"),
    ({"ctl": 64}, "control segment"),
])
def test_refusals(kwargs, match):
    p, n = 2, 8192
    x = [np.ones(n, np.float32) for _ in range(p)]
    lo, hi = kwargs.get("lo", 0), kwargs.get("hi", n * 4)
    parts = tuple(a.view(np.uint8)[lo:hi] for a in x)[:kwargs.get("parts", p)]
    ctl = np.zeros(kwargs.get("ctl", shm_mapped._shmmap.control_bytes(p)), np.uint8)
    with pytest.raises(ValueError, match=match):
        shm_mapped._shmmap.allreduce(ctl, parts, parts, x[0], x[0], lo, hi, reducer("sum", "float32"), 0, p,
                                     kwargs.get("piece", 128), 0, 1.0, -1)


def test_span_is_what_every_rank_maps_in_whole_elements():
    # (name, first byte in shared memory, end byte, offset in the segment) per rank and buffer
    wheres = [("a", 16, 8000, 0), ("b", 100, 8190, 0), ("c", 0, 8192, 0), ("d", 4, 8100, 0)]
    assert shm_mapped._span(wheres, 8192, 8) == (104, 8000)
    assert shm_mapped._span(wheres[:2] + [None, wheres[3]], 8192, 4) == (8192, 8192)
    assert shm_mapped._span([("a", 4000, 4100, 0), ("b", 4096, 4096, 0)], 4200, 4) == (4200, 4200)
