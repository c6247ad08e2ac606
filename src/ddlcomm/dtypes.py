"""Element types and reduction operations, each described once.

Backends map these names to their own types; the harness and the validator
use the NumPy view given here.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property
from importlib import import_module
from importlib.util import find_spec
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .errors import UsageError
from .units import typed_size


@dataclass(frozen=True)
class DType:
    """An element type: its name on the command line, and where its NumPy scalar type lives.

    ``source`` is the module holding the scalar type of that name: NumPy, or ml_dtypes for
    bfloat16 (NumPy has none).  That module is imported when the dtype is first used
    (:attr:`numpy`): ml_dtypes 0.7 takes 0.7 s to import, in every rank, and most runs never
    touch bfloat16.
    """

    name: str
    is_float: bool
    source: str = "numpy"

    @cached_property
    def numpy(self) -> np.dtype:
        # ml_dtypes on first use of its dtype (see the class): NumPy's are loaded already
        return np.dtype(getattr(import_module(self.source), self.name))

    @property
    def loaded(self) -> bool:
        """Whether its module is imported: no array of it can exist before."""
        return self.source in sys.modules

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def eps(self) -> float:
        """Machine epsilon of a float type (each module has its ``finfo``: NumPy's cannot see
        bfloat16)."""
        return float(import_module(self.source).finfo(self.numpy).eps)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float16", True),
        # without ml_dtypes installed, ddlcomm has no bfloat16
        *([DType("bfloat16", True, "ml_dtypes")] if find_spec("ml_dtypes") is not None else []),
        DType("float32", True),
        DType("float64", True),
        DType("int32", False),
        DType("int64", False),
        DType("uint8", False),
    )
}


def from_numpy(key: Any) -> DType | None:
    """The DType whose NumPy dtype ``key`` is (by name, then checked: a byte-swapped
    float32 is named float32 too), or None."""
    found = DTYPES.get(getattr(key, "name", None))
    return found if found is not None and found.numpy == key else None


class ByNumpy(dict):
    """NumPy dtype -> value for some of ddlcomm's dtypes, in one dict look-up (hot paths key on
    ``array.dtype``: ``dtype.name`` costs 3.5 us a call).  It starts with the dtypes whose
    module is imported; another (bfloat16 before ml_dtypes is) joins on its first look-up,
    which cannot come before an array of it exists.  ``value(dtype)`` makes an entry."""

    def __init__(self, names: Iterable[str], value: Callable[[DType], Any]) -> None:
        super().__init__()
        self._names, self._value = frozenset(names), value
        self.update((d.numpy, value(d)) for d in map(DTYPES.get, self._names)
                    if d is not None and d.loaded)

    def __missing__(self, key: Any) -> Any:
        found = from_numpy(key)
        if found is None or found.name not in self._names:
            raise KeyError(key)
        self[key] = entry = self._value(found)
        return entry


def get_dtype(name: str | DType) -> DType:
    """Look up a dtype by name; raise a :class:`UsageError` naming the choices."""
    if isinstance(name, DType):
        return name
    try:
        return DTYPES[name]
    except (KeyError, TypeError):               # TypeError: an unhashable name
        raise UsageError(f"unknown dtype {name!r}",
                         f"choose one of {', '.join(DTYPES)}") from None


def check_whole(nbytes: int, dtype: DType, flag: str) -> None:
    """Refuse ``nbytes`` (given as ``flag``) that is not a whole number of ``dtype`` elements."""
    if nbytes % dtype.itemsize:
        size = dtype.itemsize
        raise UsageError(f"{flag} {typed_size(nbytes)} is not a whole number of {dtype.name} "
                         f"elements ({size} bytes each)",
                         f"give multiples of {size} B, e.g. {typed_size(max(size, nbytes - nbytes % size))}")


def dtype_of(array: np.ndarray) -> DType:
    """The :class:`DType` of a NumPy array, or a UsageError if ddlcomm has none."""
    found = from_numpy(array.dtype)
    if found is not None:
        return found
    raise UsageError(f"arrays of dtype {array.dtype} are not supported",
                     f"use one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class ReduceOp:
    """A reduction: a NumPy ufunc that folds two arrays, and an optional finish.

    ``avg`` is ``sum`` followed by a division by the number of ranks, as
    gradient averaging does; it needs a floating-point dtype.
    """

    name: str
    ufunc: np.ufunc
    floats_only: bool = False
    divide_by_ranks: bool = False

    def check_dtype(self, dtype: DType) -> None:
        if self.floats_only and not dtype.is_float:
            raise UsageError(f"op {self.name} needs a floating-point dtype, not {dtype.name}",
                             "use sum, prod, min or max with an integer dtype, or a float dtype")

    def fold(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Reference reduction of equal-shaped arrays in rank order (NumPy)."""
        out = np.array(arrays[0], copy=True)
        for a in arrays[1:]:
            self.ufunc(out, a, out=out)
        return self.finish(out, len(arrays))

    def finish(self, out: np.ndarray, nranks: int) -> np.ndarray:
        """Apply the op's last step in place (the division of ``avg``); ``out`` is a NumPy
        array or a torch tensor (divided on its own device)."""
        if self.divide_by_ranks and nranks > 1:
            if isinstance(out, np.ndarray):
                np.divide(out, nranks, out=out, casting="unsafe")
            else:
                out.div_(nranks)
        return out

    def combine(self, a: object, b: object) -> object:
        """Fold two Python objects (used by object-form reductions)."""
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return self.ufunc(a, b)
        if _is_tensor(a) or _is_tensor(b):           # torch's elementwise op of the same name
            return _torch_combine(self.ufunc.__name__, a, b)
        return _PY_COMBINE[self.ufunc.__name__](a, b)


def _is_tensor(obj: object) -> bool:
    """Whether ``obj`` looks like a torch tensor (duck typing: this module needs no torch)."""
    return hasattr(obj, "is_cuda") and hasattr(obj, "numel")


def _torch_combine(name: str, a: object, b: object) -> object:
    """Tensors folded elementwise (Python's min/max ask a tensor's truth, an error), on the
    first tensor's device: a CUDA tensor pickled by a rank on another GPU arrives there."""
    import torch        # lazy: only here when a tensor came
    device = (a if _is_tensor(a) else b).device
    return getattr(torch, name)(torch.as_tensor(a, device=device), torch.as_tensor(b, device=device))


_PY_COMBINE: dict[str, Callable[[object, object], object]] = {
    "add": lambda a, b: a + b,
    "multiply": lambda a, b: a * b,
    "minimum": min,
    "maximum": max,
}

OPS: dict[str, ReduceOp] = {
    op.name: op
    for op in (
        ReduceOp("sum", np.add),
        ReduceOp("prod", np.multiply),
        ReduceOp("min", np.minimum),
        ReduceOp("max", np.maximum),
        ReduceOp("avg", np.add, floats_only=True, divide_by_ranks=True),
    )
}


def get_op(name: str | ReduceOp) -> ReduceOp:
    """Look up a reduction op by name; raise a :class:`UsageError` naming the choices."""
    found = OPS.get(name) if isinstance(name, str) else None
    if found is not None:
        return found
    if isinstance(name, ReduceOp):
        return name
    try:
        return OPS[name]
    except (KeyError, TypeError):               # TypeError: an unhashable name
        raise UsageError(f"unknown op {name!r}", f"choose one of {', '.join(OPS)}") from None
