"""ddlcomm's native algorithms (ddlcomm.comm.native) on real ranks, and their cost schedules.

The rank-side suite ``native_suite.py`` checks every (collective, algorithm)
× dtype × op × count × root against NumPy.  It runs at 1 to 5 ranks (1, a
prime, powers of two and not) under Open MPI and MPICH through the ``mpi``
fixture, and at 1 to 4 ranks over Gloo (torch.distributed's isend/irecv),
started as torchrun would by test_gloo's spawner, with ``--thin`` (every dtype
with sum, every op with float32: Gloo carries the bytes, the reductions are
the kernels checked whole under the MPIs); every launch ends within a timeout.
The schedules (pure functions) are checked against the cost formulas of SPEC §3
without any rank.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from ddlcomm.comm import native
from ddlcomm.errors import UsageError
from test_gloo import gloo, gloo_suite     # noqa: F401 (gloo: a fixture); tests/mpi is on sys.path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "native_suite.py"


# ------------------------------------------------------------------ real ranks
@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5])
def test_native_suite_under_mpi(mpi, nranks):
    res = mpi.mpirun(nranks, [mpi.python, SUITE], timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    assert f"{nranks} ranks, 0 failures" in res.stdout, res.stdout


@pytest.mark.long
@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])  # 5 ranks: under MPI (above)
def test_native_suite_over_gloo(gloo, nranks, tmp_path):
    out = gloo_suite(gloo, nranks, SUITE, tmp_path, 240, mpich_ranks=(2,), args=("--thin",))
    assert f"{nranks} ranks, 0 failures" in out and out.startswith("Gloo torch "), out


# ------------------------------------------------------------------ registry
def test_registry_lists_and_loads_every_algorithm():
    assert native.algorithms_for("allreduce") == ["ring", "rhd"]
    assert native.algorithms_for("bcast") == native.algorithms_for("broadcast") \
        == ["binomial", "pipelined"]
    assert native.algorithms_for("reduce") == ["binomial"]
    assert native.algorithms_for("gather") == ["linear", "binomial"]
    assert native.algorithms_for("alltoall") == []
    for (collective, algorithm), target in native.ALGORITHMS.items():
        fn = native.get(collective, algorithm)
        assert callable(fn) and target.endswith(":" + fn.__name__)
        module = target.partition(":")[0].rpartition(".")[2]
        short = {"broadcast": "bcast"}.get(collective, collective)
        assert module == f"{short}_{algorithm}"          # one algorithm per file, named so


@pytest.mark.parametrize("collective, algorithm, message", [
    ("allreduce", "tree", "unknown allreduce algorithm 'tree' (choose from ring, rhd)"),
    ("alltoall", "ring", "no native algorithm for collective 'alltoall' "
                         "(native algorithms exist for allreduce, broadcast, reduce, gather)"),
])
def test_unknown_algorithm_lists_the_choices(collective, algorithm, message):
    with pytest.raises(UsageError) as err:
        native.get(collective, algorithm)
    assert str(err.value) == message


# ------------------------------------------------------------------ schedules (SPEC §3)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8, 1000, 65536])
def test_schedules_follow_the_cost_formulas(p):
    n = 64 * 2**20
    log2 = (p - 1).bit_length()                              # ceil(log2 p)
    ring = native.schedule("allreduce", "ring", p, n)
    assert (ring.rounds, ring.bytes, ring.reduced_bytes) == \
        (2 * (p - 1), pytest.approx(2 * (p - 1) / p * n), pytest.approx((p - 1) / p * n))
    rhd = native.schedule("allreduce", "rhd", p, n)
    if p & (p - 1) == 0:
        assert (rhd.rounds, rhd.bytes, rhd.reduced_bytes) == \
            (2 * log2, pytest.approx(2 * (p - 1) / p * n), pytest.approx((p - 1) / p * n))
    else:                                                    # fold in, fold out
        core = 2 ** (p.bit_length() - 1)
        assert rhd.rounds == 2 * int(math.log2(core)) + 2
        assert rhd.bytes == pytest.approx(2 * (core - 1) / core * n + 2 * n)
    bcast = native.schedule("bcast", "binomial", p, n)
    assert (bcast.rounds, bcast.bytes) == (log2, log2 * n)
    assert native.schedule("reduce", "binomial", p, n).reduced_bytes == log2 * n
    linear = native.schedule("gather", "linear", p, n)
    assert (linear.rounds, linear.bytes) == (p - 1, (p - 1) * n)
    assert native.schedule("gather", "binomial", p, n).rounds == log2


def test_pipelined_broadcast_schedule_and_time():
    s = native.schedule("bcast", "pipelined", 4, 4 * 2**20, chunk_bytes=2**20)
    assert (s.rounds, s.bytes) == (4 - 2 + 4, 6 * 2**20)
    assert s.time(1e-6, 1e-9) == pytest.approx(6e-6 + 6 * 2**20 * 1e-9)
    # Chunking a ring step adds latency, not bandwidth.
    plain = native.schedule("allreduce", "ring", 4, 2**20)
    piped = native.schedule("allreduce", "ring", 4, 2**20, chunk_bytes=2**16)
    assert piped.bytes == plain.bytes and piped.rounds == 3 * 4 + 3


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_schedule_rejects_bad_rank_counts(bad):
    with pytest.raises(UsageError):
        native.schedule("allreduce", "ring", bad, 100)


def test_blocks_cover_any_count_exactly():
    from ddlcomm.comm.native._common import blocks, pieces
    for count in (0, 1, 2, 7, 13, 1000003):
        for parts in (1, 2, 3, 4, 5, 8):
            off = blocks(count, parts)
            sizes = [b - a for a, b in zip(off, off[1:])]
            assert off[0] == 0 and off[-1] == count and len(sizes) == parts
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert pieces(0, 4) == [] and pieces(3, None) == [(0, 3)]
    assert pieces(10, 4) == [(0, 4), (4, 8), (8, 10)]
