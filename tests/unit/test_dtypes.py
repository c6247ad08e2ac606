"""Tests of element types and reduction ops (ddlcomm.dtypes)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ddlcomm.dtypes import DTYPES, OPS, ByNumpy, dtype_of, get_dtype, get_op
from ddlcomm.errors import UsageError
from test_cli import LAUNCHER_VARS


def test_get_dtype_and_op_by_name_and_by_object():
    f32 = get_dtype("float32")
    assert f32.numpy == np.float32 and f32.itemsize == 4 and f32.is_float
    assert get_dtype(f32) is f32
    assert get_op("sum") is OPS["sum"] and get_op(OPS["max"]) is OPS["max"]


@pytest.mark.parametrize("lookup, name, choices", [
    (get_dtype, "float8", DTYPES), (get_dtype, "", DTYPES),
    (get_op, "xor", OPS), (get_op, "SUM", OPS),
])
def test_unknown_names_list_the_choices(lookup, name, choices):
    with pytest.raises(UsageError) as err:
        lookup(name)
    text = str(err.value)
    assert repr(name) in text
    assert all(choice in text for choice in choices)


@pytest.mark.parametrize("dtype", [d for d in DTYPES.values() if not d.is_float], ids=lambda d: d.name)
def test_avg_refused_for_integer_dtypes(dtype):
    with pytest.raises(UsageError) as err:
        OPS["avg"].check_dtype(dtype)
    assert "avg" in str(err.value) and dtype.name in str(err.value)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [d for d in DTYPES.values() if d.is_float], ids=lambda d: d.name)
def test_every_op_accepts_float_dtypes(op, dtype):
    OPS[op].check_dtype(dtype)


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_other_ops_accept_integer_dtypes(op):
    OPS[op].check_dtype(DTYPES["int32"])


def test_dtype_of():
    assert dtype_of(np.zeros(2, np.int64)) is DTYPES["int64"]
    with pytest.raises(UsageError, match="complex128"):
        dtype_of(np.zeros(2, np.complex128))


ARRAYS = [np.array([1.0, 5.0, 2.0]), np.array([3.0, 4.0, 2.0]), np.array([2.0, 6.0, 1.0])]


@pytest.mark.parametrize("op, want", [
    ("sum", [6.0, 15.0, 5.0]),
    ("prod", [6.0, 120.0, 4.0]),
    ("min", [1.0, 4.0, 1.0]),
    ("max", [3.0, 6.0, 2.0]),
    ("avg", [2.0, 5.0, 5.0 / 3.0]),
])
def test_fold(op, want):
    inputs = [a.copy() for a in ARRAYS]
    out = OPS[op].fold(inputs)
    np.testing.assert_allclose(out, want)
    assert all(np.array_equal(a, b) for a, b in zip(inputs, ARRAYS))   # inputs untouched


@pytest.mark.parametrize("op", list(OPS))
def test_fold_of_one_array_is_that_array(op):
    out = OPS[op].fold([ARRAYS[0]])
    np.testing.assert_array_equal(out, ARRAYS[0])
    assert out is not ARRAYS[0]


def test_avg_fold_keeps_the_dtype():
    out = OPS["avg"].fold([np.array([1, 2], np.float16), np.array([2, 2], np.float16)])
    assert out.dtype == np.float16 and out.tolist() == [1.5, 2.0]


@pytest.mark.parametrize("op, a, b, want", [
    ("sum", 3, 4, 7), ("prod", 3, 4, 12), ("min", 3, 4, 3), ("max", 3, 4, 4),
    ("sum", 1.5, 2, 3.5), ("avg", 3, 4, 7),   # avg combines as sum; the division is finish()'s
])
def test_combine_python_numbers(op, a, b, want):
    assert OPS[op].combine(a, b) == want


@pytest.mark.parametrize("op, want", [
    ("sum", [4, 9]), ("prod", [3, 20]), ("min", [1, 4]), ("max", [3, 5]), ("avg", [4, 9]),
])
def test_combine_arrays(op, want):
    a, b = np.array([1, 5]), np.array([3, 4])
    np.testing.assert_array_equal(OPS[op].combine(a, b), want)
    np.testing.assert_array_equal(OPS[op].combine(a, [3, 4]), want)   # one side an array


@pytest.mark.parametrize("op, want", [
    ("sum", [4, 9]), ("prod", [3, 20]), ("min", [1, 4]), ("max", [3, 5]),
])
def test_combine_tensors_elementwise(op, want):
    """Python's min/max of two tensors asked a tensor's truth: an error, not a fold."""
    torch = pytest.importorskip("torch")
    a, b = torch.tensor([1, 5]), torch.tensor([3, 4])
    assert OPS[op].combine(a, b).tolist() == want
    assert OPS[op].combine(a, 2).tolist() == OPS[op].combine(a, torch.tensor([2, 2])).tolist()


def test_combine_folds_on_the_first_tensors_device():
    """A CUDA tensor another rank pickled arrives on that rank's GPU; the fold runs on the
    first tensor's device (the meta device stands in for a second one here)."""
    torch = pytest.importorskip("torch")
    there = torch.tensor([1, 5], device="meta")
    assert OPS["sum"].combine(there, torch.tensor([3, 4])).device == there.device
    assert OPS["max"].combine(2, there).device == there.device


def test_finish_divides_only_for_avg():
    out = np.array([6.0, 9.0])
    assert OPS["avg"].finish(out, 3).tolist() == [2.0, 3.0]
    assert OPS["sum"].finish(np.array([6.0]), 3).tolist() == [6.0]


def test_ml_dtypes_is_imported_on_first_use_of_bfloat16():
    """ml_dtypes 0.7 takes 0.7 s to import, in every rank: a run without bfloat16 never
    imports it, and a communicator made before it was imported takes bfloat16 after."""
    code = ("import sys, numpy as np, ddlcomm\n"
            "from ddlcomm.cli import main\n"
            "comm = ddlcomm.init('mpi')\n"
            "assert comm.allreduce(np.ones(4, np.float16))[0] == 1\n"
            "assert 'ml_dtypes' not in sys.modules, 'imported without bfloat16'\n"
            "import ml_dtypes\n"
            "x = np.arange(4).astype(ml_dtypes.bfloat16)\n"
            "assert (comm.allreduce(x, op='max') == x).all() and comm.reduce(x).dtype == x.dtype\n"
            "assert ddlcomm.dtypes.dtype_of(x).name == 'bfloat16'\n"
            "comm.close()\n")
    pytest.importorskip("mpi4py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_byte_swapped_arrays_are_not_taken_for_their_namesake():
    with pytest.raises(UsageError, match=">f4"):
        dtype_of(np.ones(2, ">f4"))
    table = ByNumpy(["float32", "bfloat16"], lambda d: d.name)
    assert table[np.dtype(np.float32)] == "float32"
    with pytest.raises(KeyError):
        table[np.dtype(">f4")]
    with pytest.raises(KeyError):               # a ddlcomm dtype, but not one of the table's
        table[np.dtype(np.int32)]
