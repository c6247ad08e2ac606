"""The pipelined shm all-reduce's C engine (ddlcomm.comm._shmpipe), without MPI.

The engine releases the GIL for a whole call and its ranks meet only through
counters in the segment, so p threads of one process sharing one segment
are p real ranks to it: these tests run it that way (every dtype and op, many
chunks and window reuse, in place, repeated calls, streaming stores), and
check its refusals.  The same engine under real ranks: tests/mpi/test_shm.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from ddlcomm.comm import shm
from ddlcomm.dtypes import DTYPES, OPS
from ddlcomm.kernels import available, reducer
from thread_ranks import run_as_ranks

pytestmark = pytest.mark.skipif(shm._shmpipe is None or available()["c"].startswith("missing"),
                                reason="the C kernel or the shm engine is not built")


def run_ranks(p, inputs, outputs, red, chunk, windows=shm.PIPE_WINDOWS, calls=1, stream_min=-1, phases=None):
    """Every rank (a thread) runs `calls` all-reduces on one segment; their errors, if any.
    ``phases``: one buffer per rank that the calls add their phases' nanoseconds to."""
    seg = np.zeros(shm._shmpipe.segment_bytes(p, chunk, windows), np.uint8)

    def rank(r):
        base = 0
        for _ in range(calls):
            base = shm._shmpipe.allreduce(seg, inputs[r], outputs[r], red, r, p, chunk, windows, base,
                                          1.0, stream_min, None if phases is None else phases[r])
    return run_as_ranks(p, rank)


def want(inputs, opname, dt):
    ref = np.stack(inputs).astype(np.float64 if dt.is_float else np.int64)
    return {"sum": ref.sum(0), "prod": ref.prod(0), "min": ref.min(0), "max": ref.max(0)}[opname]


def check(got, expected, dt):
    if dt.is_float:
        assert np.allclose(got.astype(np.float64), expected, rtol=8 * dt.eps, atol=0)
    else:
        assert np.array_equal(got.astype(np.int64), expected.astype(dt.numpy).astype(np.int64))


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("opname", ["sum", "prod", "min", "max"])
def test_every_dtype_and_op_over_many_chunks(p, dname, opname):
    dt = DTYPES[dname]
    if OPS[opname].floats_only and not dt.is_float:
        pytest.skip("a float-only op")
    rng = np.random.default_rng(p)
    for n in (0, 1, 13, 1001):           # 1001 elements: up to 63 chunks of 128 bytes
        inputs = [rng.integers(1, 3 if opname == "prod" else 20, n).astype(dt.numpy) for _ in range(p)]
        outputs = [np.zeros(n, dt.numpy) for _ in range(p)]
        assert not run_ranks(p, inputs, outputs, reducer(opname, dt), chunk=128, calls=2)
        for out in outputs:
            check(out, want(inputs, opname, dt), dt)


@pytest.mark.parametrize("windows", [3, 4, 7])
@pytest.mark.parametrize("stream_min", [-1, 0])
def test_in_place_repeated_calls_and_streaming(windows, stream_min):
    p, n = 3, 50_003
    rng = np.random.default_rng(windows)
    mine = [rng.integers(1, 20, n).astype(np.float32) for _ in range(p)]
    expected = want(mine, "sum", DTYPES["float32"])
    bufs = [m.copy() for m in mine]
    assert not run_ranks(p, bufs, bufs, reducer("sum", "float32"), chunk=4096, windows=windows)
    for b in bufs:
        check(b, expected, DTYPES["float32"])
    outs = [np.zeros(n, np.float32) for _ in range(p)]
    assert not run_ranks(p, mine, outs, reducer("sum", "float32"), chunk=4096, windows=windows, calls=5,
                         stream_min=stream_min)
    for out in outs:
        check(out, expected, DTYPES["float32"])


def test_phases_are_timed_where_asked():
    p, n = 3, 200_000
    rng = np.random.default_rng(5)
    mine = [rng.integers(1, 20, n).astype(np.float32) for _ in range(p)]
    outs = [np.zeros(n, np.float32) for _ in range(p)]
    phases = [np.zeros(shm._shmpipe.N_PHASES, np.int64) for _ in range(p)]
    assert len(shm.PIPE_PHASES) == shm._shmpipe.N_PHASES == 6
    assert not run_ranks(p, mine, outs, reducer("sum", "float32"), chunk=4096, calls=3, phases=phases)
    for out, ns in zip(outs, phases):
        check(out, want(mine, "sum", DTYPES["float32"]), DTYPES["float32"])
        took = dict(zip(shm.PIPE_PHASES, ns))
        assert all(t >= 0 for t in ns) and took["stage"] > 0 and took["reduce"] > 0 and took["unstage"] > 0
    again = phases[0].copy()                 # the calls add: never reset, never lost
    assert not run_ranks(1, mine[:1], outs[:1], reducer("sum", "float32"), chunk=4096, phases=phases[:1])
    assert (phases[0] >= again).all() and phases[0].sum() > again.sum()


def test_phases_us_is_the_mean_after_the_first_call():
    first, rest = np.array([9000, 0, 0, 0, 0, 0]), np.array([2000, 4000, 0, 6000, 0, 8000])
    assert shm.phases_us(first, rest, 3) == dict(zip(shm.PIPE_PHASES, [1.0, 2.0, 0.0, 3.0, 0.0, 4.0]))
    assert shm.phases_us(first, rest, 1)["wait_free"] == 9.0


def test_segment_bytes_and_chunks():
    assert shm._shmpipe.segment_bytes(2, 1024, 4) == 4096 + 4 * 3 * 1024
    assert shm._shmpipe.segment_bytes(100, 64, 3) == 3 * 100 * 64 // 4096 * 4096 + 4096 + 3 * 101 * 64
    assert shm.pipe_chunk(2, 1 << 30) == shm.PIPE_CHUNK_MAX
    assert shm.pipe_chunk(1024, 1 << 30) == shm.PIPE_CHUNK_MIN
    assert shm.pipe_chunk(2, 4) == 64 and shm.pipe_chunk(16, 1 << 30) % 64 == 0
    # shm@SIZE: as asked, but never more than the message in whole lines (shm@64GiB on 1 MiB
    # had asked /dev/shm for 768 GiB of windows mid-run)
    assert shm.pipe_chunk(2, 1 << 20, 128 << 10) == 128 << 10
    assert shm.pipe_chunk(2, 1 << 20, 64 << 30) == 1 << 20 and shm.pipe_chunk(2, 100, 1 << 30) == 128


@pytest.mark.parametrize("args, match", [
    (dict(chunk=100), "multiple of 64"),
    (dict(windows=2), "at least 3"),
    (dict(rank=2), "out of range"),
    (dict(recv=np.zeros(9, np.float32)), "differ in size"),
    (dict(send=np.zeros(12, np.uint8), recv=np.zeros(12, np.uint8)), "whole number of elements"),
    (dict(seg=np.zeros(64, np.uint8)), "smaller than segment_bytes"),
    (dict(overlap=True), "overlap"),
    (dict(phases=np.zeros(5, np.int64)), "N_PHASES int64"),
])
def test_refusals(args, match):
    red = reducer("sum", "float64")
    seg = args.get("seg", np.zeros(shm._shmpipe.segment_bytes(2, 128, 4), np.uint8))
    send = args.get("send", np.zeros(8, np.float32))
    recv = args.get("recv", np.zeros(8, np.float32))
    if args.get("overlap"):
        both = np.zeros(12, np.float64)
        send, recv = both[:8], both[4:]
    with pytest.raises(ValueError, match=match):
        shm._shmpipe.allreduce(seg, send, recv, red, args.get("rank", 0), 2, args.get("chunk", 128),
                               args.get("windows", 4), 0, 1.0, -1, args.get("phases"))


def test_a_reducer_hands_its_loop_over():
    red = reducer("max", "bfloat16")
    assert red.itemsize == 2 and type(red.loop).__name__ == "PyCapsule"
    assert shm.pipelines(red) and not shm.pipelines(reducer("max", "bfloat16", "numpy"))


@pytest.mark.parametrize("nranks, cpu_sets, spins", [
    (2, [[0, 1, 2, 3], [0, 1, 2, 3]], True),     # unbound
    (4, [[0], [1], [2], [3]], True),             # bound one to a CPU each
    (4, [[0], [0], [0], [0]], False),            # bound to one CPU together
    (3, [[0, 1], [0, 1], [0, 1]], False),        # more ranks than CPUs
    (2, [[0], [0, 1]], True),
])
def test_the_engines_spin_while_the_ranks_have_cpus_enough_together(nranks, cpu_sets, spins):
    from ddlcomm.comm import nodes
    assert nodes.spin_for(nranks, cpu_sets) == (nodes.SPIN_US if spins else 0.0)
