"""Reduction kernels: ``out = a (op) b`` over whole buffers, in one pass.

Two implementations, chosen per (op, dtype) by :func:`reducer`:

- ``numpy``: the ufunc with ``out=`` (bfloat16: ml_dtypes' ufunc loops,
  which compute in float32 and round to nearest even, element by element);
- ``c``: ddlcomm's compiled kernel (``_reduce.c``), SIMD loops for AVX2+F16C,
  AVX-512F and AVX512-BF16 chosen at import from what the CPU supports, with a
  portable C loop everywhere else.  It reduces float16 and bfloat16 at memory
  speed, where NumPy converts half floats one element at a time.

Every kernel gives the same answers: for float16 and bfloat16, the float32
result rounded to nearest, ties to even (which for these ops is the correctly
rounded result); min and max return NaN when either input is NaN, as NumPy's
do (of -0.0 and +0.0 either zero may come back: IEEE 754 leaves it open, and
NumPy's own float16 and float32 loops differ there); integers wrap around.

The C kernel's ISA is the best the CPU runs unless the environment variable
``DDLCOMM_KERNEL_ISA`` (read at import) names another: ``portable``, ``avx2``,
``avx512`` or ``avx512bf16``; one the CPU cannot run falls back to the best it
can, with a warning.  :func:`reducer` also takes ``isa=`` per call.
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import Callable, Optional, Union

import numpy as np

from ..dtypes import DTYPES, DType, ReduceOp, from_numpy, get_dtype
from ..errors import UnsupportedError, UsageError

#: Implementations; ``kernel="auto"`` takes ``c`` where it is built, else ``numpy``.
KERNELS = ("numpy", "c")
#: The two-operand reductions (``avg`` is ``sum`` then a division, done by the caller).
OPS = ("sum", "prod", "min", "max")
#: Environment variable that picks the C kernel's ISA at import.
ISA_ENV = "DDLCOMM_KERNEL_ISA"

Reducer = Callable[[np.ndarray, np.ndarray, np.ndarray], None]

_UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
_BY_UFUNC = {u.__name__: name for name, u in _UFUNCS.items()}

try:
    from . import _reduce
except ImportError as exc:      # not built: no compiler at install time, or a stale build
    _reduce = None
    _C_MISSING = (f"not built ({exc}); reinstall ddlcomm with a C compiler present: "
                  "pip install -e .")
else:
    _C_MISSING = None


def _default_isa() -> Optional[str]:
    if _reduce is None:
        return None
    supported = _reduce.supported_isas()
    wanted = os.environ.get(ISA_ENV, "").strip().lower()
    if wanted in ("", "auto"):
        return supported[-1]
    if wanted in supported:
        return wanted
    if wanted in _reduce.ISAS:
        warnings.warn(f"{ISA_ENV}={wanted}: this CPU or this build cannot run it; using {supported[-1]}",
                      RuntimeWarning, stacklevel=2)
    else:
        warnings.warn(f"{ISA_ENV}={wanted!r} is not an ISA (choose from auto, "
                      f"{', '.join(_reduce.ISAS)}); using {supported[-1]}",
                      RuntimeWarning, stacklevel=2)
    return supported[-1]


_ISA = _default_isa()


def isa() -> str:
    """The instruction set the C kernel dispatches to (``"none"`` when it is not built)."""
    return _ISA if _ISA is not None else "none"


def supported_isas() -> tuple[str, ...]:
    """The C kernel's ISAs that this CPU runs, weakest first (empty when not built)."""
    return tuple(_reduce.supported_isas()) if _reduce is not None else ()


def describe_isa(name: str) -> str:
    """``"avx512 (f16c, avx512bf16)"``: an ISA with the extensions its loops use."""
    return {"portable": "portable C",
            "avx2": "avx2 (f16c)",
            "avx512": "avx512 (f16c)",
            "avx512bf16": "avx512 (f16c, avx512bf16)"}.get(name, name)


def available() -> dict[str, str]:
    """Every kernel of :data:`KERNELS`: what it runs on, or ``"missing: <why>"``."""
    return {"numpy": f"NumPy {np.__version__} ufuncs",
            "c": describe_isa(_ISA) if _reduce is not None else f"missing: {_C_MISSING}"}


def describe(reduce: Reducer) -> str:
    """What runs a reducer from :func:`reducer`: ``"C kernel, avx2 (f16c)"`` or ``"NumPy"``."""
    isa_name = getattr(reduce, "isa", None)
    return f"C kernel, {describe_isa(isa_name)}" if isa_name is not None else "NumPy"


def op_name(op: Union[str, ReduceOp]) -> str:
    """The kernels' name of ``op`` (UsageError naming the choices if no kernel reduces with it)."""
    if isinstance(op, ReduceOp):
        name = _BY_UFUNC.get(op.ufunc.__name__)
        if name is not None:
            return name
        op = op.name
    if op in _UFUNCS:
        return op
    raise UsageError(f"no reduction kernel for op {op!r}", f"choose one of {', '.join(OPS)}")


def _dtype(dtype) -> DType:
    if isinstance(dtype, (str, DType)):
        return get_dtype(dtype)
    np_dtype = np.dtype(dtype)
    found = from_numpy(np_dtype)
    if found is not None:
        return found
    raise UsageError(f"no reduction kernel for dtype {np_dtype}", f"use one of {', '.join(DTYPES)}")


def reducer(op: Union[str, ReduceOp], dtype, kernel: str = "auto",
            isa: Optional[str] = None) -> Reducer:
    """``f(a, b, out)`` computing ``out = a (op) b`` elementwise for ``dtype``.

    ``a``, ``b`` and ``out`` are C-contiguous NumPy arrays of ``dtype`` with one
    size (or any buffers of that many bytes, such as mpi4py's in an MPI user
    operation); ``out`` may be ``a`` or ``b``.  ``kernel``: ``"c"``,
    ``"numpy"``, or ``"auto"`` (C when it is built, NumPy otherwise).  ``isa``
    picks the C kernel's loop (default: :func:`isa`).  Reducers are cached:
    asking twice returns the same function.
    """
    name, dt = op_name(op), _dtype(dtype)
    if kernel not in KERNELS and kernel != "auto":
        raise UsageError(f"unknown reduction kernel {kernel!r}", f"choose auto or one of {', '.join(KERNELS)}")
    return _cached(name, dt.name, kernel, isa)


@functools.lru_cache(maxsize=None)
def _cached(op: str, dtype: str, kernel: str, isa: Optional[str]) -> Reducer:
    if kernel == "auto":
        kernel = "c" if _reduce is not None else "numpy"
    if kernel == "numpy":
        return _numpy_reducer(_UFUNCS[op], DTYPES[dtype])
    if _reduce is None:
        raise UnsupportedError(f"the C reduction kernel is {_C_MISSING}")
    isa = isa or _ISA
    if isa not in _reduce.supported_isas():
        raise UnsupportedError(f"the C reduction kernel cannot run ISA {isa!r} here",
                               f"this CPU runs {', '.join(_reduce.supported_isas())}")
    return _reduce.Reducer(op, dtype, isa)


def _as_array(buf, dtype: np.dtype) -> np.ndarray:
    """``buf`` as an array of ``dtype``: its bytes read as that dtype, as the C kernel reads
    them (bytes, or the dtype's own item size; another item size is refused alike)."""
    if not isinstance(buf, np.ndarray):
        return np.frombuffer(buf, dtype=dtype)
    if buf.dtype == dtype:
        return buf
    if buf.itemsize not in (1, dtype.itemsize):
        raise ValueError(f"{dtype.name} reducer: an array's item size does not match the "
                         f"reducer's dtype ({buf.dtype})")
    return buf.view(dtype)


def _numpy_reducer(ufunc: np.ufunc, dtype: DType) -> Reducer:
    np_dtype = dtype.numpy

    def reduce(a, b, out):
        ufunc(_as_array(a, np_dtype), _as_array(b, np_dtype), out=_as_array(out, np_dtype))
    reduce.__qualname__ = f"numpy_{ufunc.__name__}_{dtype.name}"
    return reduce
