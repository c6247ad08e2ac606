"""Tests of the collective descriptions (ddlcomm.collectives), without MPI."""
from __future__ import annotations

import numpy as np
import pytest

from ddlcomm.collectives import (COLLECTIVES, PERIOD, ROW_ELEMENTS, check_in_place, cleared, fill,
                                 get_collective, repeat)
from ddlcomm.dtypes import DTYPES, OPS
from ddlcomm.errors import UsageError

F16, F32, F64, I32 = (DTYPES[n] for n in ("float16", "float32", "float64", "int32"))
ALL = list(COLLECTIVES)
DIVISIBLE = {"reduce_scatter", "alltoall"}
GATHERS = {"gather", "allgather"}


def busbw_factor(name: str, p: int) -> float:
    return {"allreduce": 2 * (p - 1) / p, "broadcast": 1.0, "reduce": 1.0,
            "barrier": 0.0}.get(name, (p - 1) / p)


def test_names_and_lookup():
    assert set(ALL) == {"broadcast", "reduce", "allreduce", "gather", "allgather",
                        "reduce_scatter", "alltoall", "barrier"}
    assert get_collective("gather") is COLLECTIVES["gather"]
    with pytest.raises(UsageError) as err:
        get_collective("nope")
    assert "'nope'" in str(err.value) and all(n in str(err.value) for n in ALL)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("name", ALL)
def test_busbw_factor(name, p):
    assert COLLECTIVES[name].busbw_factor(p) == pytest.approx(busbw_factor(name, p))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_count_for(name, p):
    coll = COLLECTIVES[name]
    count = coll.count_for(40, F32, p)
    if name == "barrier":
        assert count == 0
    elif name in DIVISIBLE:
        assert count == 10 - 10 % p and count % p == 0
    else:
        assert count == 10
    assert coll.count_for(4, F64, p) == 0        # less than one element
    assert coll.count_for(2, F16, p) == (0 if name == "barrier" or
                                         (name in DIVISIBLE and p > 1) else 1)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("p", [1, 3, 4])
def test_algbw_and_receiver_bytes(name, p):
    coll = COLLECTIVES[name]
    nbytes = 1200
    assert coll.algbw_bytes(nbytes, p) == (p * nbytes if name in GATHERS else nbytes)
    want = {"barrier": 0, "reduce_scatter": nbytes // p}.get(name, nbytes)
    assert coll.receiver_bytes(nbytes, p) == (p * nbytes if name in GATHERS else want)


@pytest.mark.parametrize("name, recv", [
    ("gather", 48), ("allgather", 48), ("reduce_scatter", 3), ("alltoall", 12),
    ("allreduce", 12), ("reduce", 12), ("broadcast", 12),
])
def test_recv_count(name, recv):
    assert COLLECTIVES[name].recv_count(12, 4) == recv


# ------------------------------------------------------------------ fill
@pytest.mark.parametrize("op", [None, "prod"])           # sum's pattern is None's
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=lambda d: d.name)
def test_fill_differs_per_rank_and_is_small(dtype, op):
    rop = OPS[op] if op else None
    inputs = [fill(dtype, 50, r, rop) for r in range(23)]
    assert all(a.dtype == dtype.numpy and a.shape == (50,) for a in inputs)
    # every pair of ranks differs (prod's 1/2 pattern has period 2, so only neighbours do)
    pairs = [(r, r + 1) for r in range(22)] if op == "prod" else \
        [(r, s) for r in range(23) for s in range(r)]
    assert not any(np.array_equal(inputs[r], inputs[s]) for r, s in pairs)
    stacked = np.stack(inputs).astype(np.int64)
    assert stacked.min() >= 1 and stacked.max() <= (2 if op == "prod" else 23)
    np.testing.assert_array_equal(fill(dtype, 50, 3, rop), inputs[3])   # deterministic
    assert fill(dtype, 0, 3, rop).shape == (0,)


@pytest.mark.parametrize("op", [None, "prod"])
def test_fill_is_its_formula_along_many_rows(op):
    """fill computes one row and copies it along: the values are the formula's at every index."""
    rop = OPS[op] if op else None
    count = 3 * ROW_ELEMENTS + 17
    i = np.arange(count)
    for rank in (0, 5):
        want = 1 + (i + rank) % 2 if op else 1 + ((i % 11) + 3 * rank) % 23
        np.testing.assert_array_equal(fill(F32, count, rank, rop), want.astype(np.float32))
    assert ROW_ELEMENTS % PERIOD == 0


@pytest.mark.parametrize("start, count", [(0, 0), (0, 5), (3, 40), (37, 1000), (7, 22)])
def test_repeat_continues_the_row_from_start(start, count):
    row = np.arange(11, dtype=np.int32)
    want = np.resize(np.roll(row, -start), count)
    np.testing.assert_array_equal(repeat(row, count, start), want)
    out = np.full(count, -1, np.int32)
    assert repeat(row, count, start, out) is out
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("name", [n for n in ALL if n != "barrier"])
def test_expected_matches_numpy_along_many_rows(name):
    """Results built from one row (and one folded row) are right past the first row, and
    each rank's block of a scatter starts where its block starts."""
    coll, op = COLLECTIVES[name], ("sum" if COLLECTIVES[name].reduces else None)
    count = 2 * ROW_ELEMENTS + 20             # a multiple of P, not of the row
    inputs = [fill(I32, count, r, OPS[op] if op else None) for r in range(P)]
    for rank in range(P):
        want = reference(name, inputs, rank, 1, op)
        got = coll.expected(I32, count, rank, P, OPS[op] if op else None, 1)
        if want is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got, want)


def test_sum_of_64_ranks_is_exact_in_float16():
    inputs = [fill(F16, 257, r, OPS["sum"]) for r in range(64)]
    exact = np.sum([a.astype(np.int64) for a in inputs], axis=0)
    assert exact.max() <= 2048                  # float16 holds every integer up to 2048
    np.testing.assert_array_equal(OPS["sum"].fold(inputs).astype(np.int64), exact)
    np.testing.assert_array_equal(OPS["sum"].fold(inputs[::-1]).astype(np.int64), exact)


def test_cleared_holds_the_sentinel():
    assert np.isnan(cleared(F32, 5)).all()
    assert (cleared(I32, 5) == -1).all()
    assert (cleared(DTYPES["uint8"], 5) == 0xFF).all()


# ------------------------------------------------------------------ expected
P = 3


def reference(name: str, inputs: list[np.ndarray], rank: int, root: int, op: str | None):
    """What ``rank`` holds after ``name``, computed directly with NumPy."""
    stack = np.stack(inputs)
    if name == "barrier" or (name in ("reduce", "gather") and rank != root):
        return None
    if name == "broadcast":
        return stack[root]
    if name in GATHERS:
        return stack.reshape(-1)
    if name == "alltoall":
        return stack.reshape(P, P, -1)[:, rank, :].reshape(-1)
    dt = stack.dtype
    total = {"sum": lambda: stack.sum(axis=0, dtype=dt), "prod": lambda: stack.prod(axis=0, dtype=dt),
             "min": lambda: stack.min(axis=0), "max": lambda: stack.max(axis=0),
             "avg": lambda: (stack.astype(np.float64).sum(axis=0) / P).astype(dt)}[op]()
    if name == "reduce_scatter":
        return total.reshape(P, -1)[rank]
    return total


def cases(dtypes, names=ALL):
    """(collective, op, dtype) for every op the collective takes and the dtype allows."""
    return [pytest.param(name, op, dt, id=f"{name}-{op}-{dt.name}")
            for name in names for dt in dtypes
            for op in (list(OPS) if COLLECTIVES[name].reduces else [None])
            if op != "avg" or dt.is_float]


@pytest.mark.parametrize("name, op, dtype", cases([F16, F32, I32]))
@pytest.mark.parametrize("root", [0, 1, 2])
def test_expected_matches_numpy(name, op, dtype, root):
    coll, rop = COLLECTIVES[name], OPS[op] if op else None
    count = 12 if coll.divisible else 7
    inputs = [fill(dtype, count, r, rop) for r in range(P)]
    for rank in range(P):
        got = coll.expected(dtype, count, rank, P, rop, root)
        want = reference(name, inputs, rank, root, op)
        if want is None:
            assert got is None
            continue
        assert got.dtype == dtype.numpy
        if dtype.is_float:
            np.testing.assert_allclose(got, want, rtol=2 * np.finfo(dtype.numpy).eps)
        else:
            np.testing.assert_array_equal(got, want)
        assert coll.verify(want, got, dtype)


@pytest.mark.parametrize("name, op, dtype",
                         cases([F16, F32, I32, DTYPES["uint8"]], [n for n in ALL if n != "barrier"]))
def test_verify_rejects_untouched_and_wrong_shaped_results(name, op, dtype):
    coll, rop = COLLECTIVES[name], OPS[op] if op else None
    want = coll.expected(dtype, 6, 0, P, rop, 0)
    assert coll.verify(want.copy(), want, dtype)
    assert not coll.verify(cleared(dtype, want.size), want, dtype)
    assert not coll.verify(want[:-1], want, dtype)
    assert not coll.verify(np.concatenate([want, want[:1]]), want, dtype)
    wrong = want.copy()
    wrong[-1] += 1
    assert not coll.verify(wrong, want, dtype)


def test_verify_object_form_and_nothing_expected():
    coll = COLLECTIVES["gather"]
    want = coll.expected(F32, 4, 0, P, None, 0)
    assert coll.verify([fill(F32, 4, r, None) for r in range(P)], want, F32)
    assert not coll.verify([fill(F32, 4, r, None) for r in (0, 2, 1)], want, F32)
    assert coll.verify("anything", None, F32)          # a rank that receives nothing


@pytest.mark.parametrize("name", ALL)
def test_check_in_place(name):
    coll = COLLECTIVES[name]
    if name in ("allreduce", "reduce"):
        check_in_place([coll])
        return
    with pytest.raises(UsageError) as err:
        check_in_place([coll])
    assert f"--in-place does not apply to {name}" in str(err.value)
    check_in_place([coll, COLLECTIVES["allreduce"]])     # a mix runs; points say which way


@pytest.mark.parametrize("name", ALL)
def test_check_request_avg_on_integers(name):
    coll = COLLECTIVES[name]
    if coll.reduces:
        with pytest.raises(UsageError, match="avg"):
            coll.check_request(op=OPS["avg"], dtype=I32)
    else:
        coll.check_request(op=OPS["avg"], dtype=I32)   # op unused
