"""Reductions on tensors, chosen by the kind of buffer they are handed.

An algorithm that may be handed host or device buffers must know which it
has before it reduces (:mod:`ddlcomm.kernels.kinds` asks the driver, once per
buffer with a :class:`KindCache`): NumPy host arrays go to the SIMD C kernel
(or NumPy), device buffers to a GPU kernel.  The GPU kernels are a table,
:data:`DEVICE_KERNELS`:

- ``torch``: PyTorch's elementwise kernels (``torch.add(a, b, out=out)``
  and friends) on the current stream, synchronised so the result is there when
  the call returns; every dtype, bfloat16 included.  On CPU tensors (which
  stand in for device buffers in tests without a GPU) the same call runs
  torch's CPU kernel, recorded as ``torch-CPU``.
- ``cupy``: CuPy's elementwise kernels on the same memory (zero-copy through
  DLPack); not bfloat16 (CuPy has no such dtype), where ``torch`` runs instead.

Every reducer carries ``label``, what reduced ("C kernel, avx512 (f16c)",
"NumPy", "torch-CUDA", "torch-CPU", "CuPy"), which a point records.
:func:`many_reducer` reduces several inputs into one output in one pass
(the device shm all-reduce): CuPy's fused elementwise kernel, or torch's
adds one after another.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import UnsupportedError, UsageError
from ..lazy import torch_module as _torch
from ..memory.gpu import cuda_available
from . import describe, reducer
from .kinds import DEVICE, HOST, KindCache, address, kind_of  # noqa: F401 (re-exported)

#: torch's elementwise kernel per op (``avg`` is ``sum`` then the caller's division).
_TORCH_OPS = {"sum": "add", "prod": "mul", "min": "minimum", "max": "maximum"}
#: CuPy's ufunc per op; its fused expression of two operands.
_CUPY_OPS = {"sum": ("add", "{a} + {b}"), "prod": ("multiply", "{a} * {b}"),
             "min": ("minimum", "ddlcomm_min({a}, {b})"), "max": ("maximum", "ddlcomm_max({a}, {b})")}
#: The fused kernels' min and max: the NaN where an operand is NaN, as NumPy's, torch's and
#: the host kernels' (CUDA's min and max of floats are fminf and fmaxf, which drop a NaN).
#: Every branch is a T: CuPy's float16 has no operator+, and a + b was a float beside a
#: float16, which each convert to the other (an ambiguous ?:, no kernel compiled).  NaN is
#: told by !(x == x): CUDA's __half != (__hne) is false where an operand is NaN, == is too.
_CUPY_PREAMBLE = """
template <typename T> __device__ bool ddlcomm_nan(T x) { return !(x == x); }
template <typename T> __device__ T ddlcomm_min(T a, T b) { return ddlcomm_nan(a) ? a : ddlcomm_nan(b) ? b : (b < a ? b : a); }
template <typename T> __device__ T ddlcomm_max(T a, T b) { return ddlcomm_nan(a) ? a : ddlcomm_nan(b) ? b : (b > a ? b : a); }
"""
#: dtypes CuPy reduces (no bfloat16).
CUPY_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
               "uint8", "uint16", "uint32", "uint64")


def _dtype_name(dtype) -> str:
    """``"float32"`` for a name, a torch dtype (``torch.float32``), a NumPy dtype or type."""
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, type):                       # np.float32: its str is "<class ...>"
        return np.dtype(dtype).name
    return str(dtype).rpartition(".")[2]


def _torch_kernel(op: str, on_cuda: bool) -> tuple[Callable, str]:
    """torch's elementwise function for ``op`` and its label; on CUDA refused without a GPU."""
    if on_cuda:
        ok, why = cuda_available()
        if not ok:
            raise UnsupportedError(f"device reduction needs a GPU: {why}")
    return getattr(_torch(), _TORCH_OPS[op]), "torch-CUDA" if on_cuda else "torch-CPU"


def wait_for(out) -> None:
    """The work queued on ``out``'s device done on return: that device's current stream
    synchronised, whichever GPU is current (nothing for a CPU tensor: done already)."""
    if out.is_cuda:
        _torch().cuda.current_stream(out.device).synchronize()


def torch_reducer(op: str, dtype, on_cuda: bool = True) -> Callable:
    """``f(a, b, out)`` on tensors: ``out = a (op) b`` by torch's kernel; on CUDA synchronised."""
    fn, label = _torch_kernel(op, on_cuda)

    def reduce(a, b, out) -> None:
        fn(a, b, out=out)
        wait_for(out)
    reduce.label = label
    reduce.__qualname__ = f"torch_{_TORCH_OPS[op]}"
    return reduce


def cupy_reducer(op: str, dtype, on_cuda: bool = True) -> Callable:
    """``f(a, b, out)`` on CUDA tensors through CuPy's ufuncs (DLPack views, no copy)."""
    name = _dtype_name(dtype)
    if not on_cuda:
        raise UnsupportedError("the cupy kernel reduces device buffers only", "use torch or c")
    if name not in CUPY_DTYPES:
        raise UnsupportedError(f"CuPy cannot reduce {name}", "use the torch kernel (ring+torch)")
    why = _cupy_unusable(op, name, _current_gpu())   # CuPy compiles its kernels when first called
    if why is not None:
        raise UnsupportedError(f"the cupy kernel cannot reduce {name} here: {why}",
                               "use the torch kernel (ring+torch)")
    # CuPy is optional: only on GPU machines
    import cupy
    fn = getattr(cupy, _CUPY_OPS[op][0])

    def reduce(a, b, out) -> None:
        with cupy.cuda.Device(_gpu_of(out)):    # the buffers' GPU, not CuPy's current one
            (x, z), y = _cupy_views((a, b), out)
            fn(x, z, out=y)
            cupy.cuda.get_current_stream().synchronize()
    reduce.label = "CuPy"
    reduce.__qualname__ = f"cupy_{_CUPY_OPS[op][0]}"
    return reduce


#: GPU kernels by name: factory(op, dtype, on_cuda) -> reduce(a, b, out) with a ``label``.
DEVICE_KERNELS: dict[str, Callable[..., Callable]] = {"torch": torch_reducer, "cupy": cupy_reducer}
#: Host kernels by name (NumPy arrays): :func:`ddlcomm.kernels.reducer`'s.
HOST_KERNELS = ("c", "numpy")


def device_reducer(op: str, dtype="float32", kernel: str = "torch") -> Callable:
    """``f(a, b, out)`` on CUDA tensors by the GPU kernel ``kernel`` (UnsupportedError without a GPU)."""
    return _device(op, _dtype_name(dtype), kernel, True)


def copy_pass(a, b, out) -> None:
    """``out = b`` on ``out``'s device, done on return: one pass of the GPU-memory floor
    (``a`` is unused: the signature of a reducer, for :func:`ddlcomm.measure.timing.pass_us`)."""
    out.copy_(b)
    wait_for(out)


@functools.lru_cache(maxsize=None)
def _device(op: str, dtype: str, kernel: str, on_cuda: bool) -> Callable:
    if kernel not in DEVICE_KERNELS:
        raise UsageError(f"unknown device kernel {kernel!r}", f"choose {', '.join(DEVICE_KERNELS)}")
    return DEVICE_KERNELS[kernel](op, dtype, on_cuda)


def _host(op: str, dtype, kernel: str) -> Callable:
    """The C or NumPy kernel on NumPy arrays, with its label."""
    fn = reducer(op, dtype, kernel)
    label = describe(fn)

    def reduce(a, b, out) -> None:
        fn(a, b, out)
    reduce.label = label
    return reduce


def kernel_for(kind: str, is_tensor: bool, kernel: str = "auto") -> str:
    """The kernel that reduces buffers of ``kind`` (pure): ``kernel`` when it fits, ``auto``
    made concrete (host arrays: ``auto`` of the host kernels; tensors: ``torch``)."""
    if not is_tensor:
        if kernel in DEVICE_KERNELS:
            raise UsageError(f"the {kernel} kernel reduces tensors, not NumPy arrays",
                             f"use {' or '.join(HOST_KERNELS)}")
        return kernel
    if kernel in HOST_KERNELS:
        raise UsageError(f"the {kernel} kernel reduces host NumPy arrays, not {kind} tensors",
                         f"use {' or '.join(DEVICE_KERNELS)} (or no suffix)")
    return "torch" if kernel == "auto" else kernel


def dispatching_reducer(op: str, dtype, cache: "Callable | None" = None,
                        kernel: str = "auto") -> Callable:
    """``f(a, b, out)`` that reduces by the kind of ``out``: NumPy host arrays with the C
    kernel (or ``kernel``), device tensors on the GPU, CPU tensors with torch's CPU kernel.

    ``cache`` (a :class:`KindCache`, or :class:`~.kinds.DriverAsked` to count the driver's
    answers) looks each buffer's kind up once; None asks the driver on every call.
    ``f.label`` is what reduced last.
    """
    lookup = cache if cache is not None else kind_of
    name = _dtype_name(dtype)

    def pick(buf) -> Callable:
        kind = lookup(buf)
        tensor = not isinstance(buf, np.ndarray)
        chosen = kernel_for(kind, tensor, kernel)
        if not tensor:
            return _host(op, dtype, chosen)
        return _device(op, name, chosen, kind == DEVICE)

    def reduce(a, b, out) -> None:
        fn = pick(out)
        reduce.label = fn.label
        fn(a, b, out)
    reduce.label = None
    return reduce


def many_reducer(op: str, dtype, on_cuda: bool, kernel: str = "auto") -> Callable:
    """``f(inputs, out)``: ``out = inputs[0] (op) inputs[1] (op) ...`` for tensors of one
    size, done on return.  CuPy: one fused kernel reading every input once (``kernel``
    auto or cupy, on CUDA, a dtype CuPy has, a CuPy that compiles here); otherwise torch,
    one kernel per extra input, all queued on the stream and waited for once: where
    processes share a GPU without MPS each wait may cost a time slice (about 0.6 ms with 4
    ranks on the H200, docs/benchmarks.md), so a wait per input made bfloat16, which CuPy
    lacks, 1 ms slower than float32 at every size.  ``cupy`` asked for where it cannot run
    is refused.  ``f.label``."""
    name = _dtype_name(dtype)
    why_not = _cupy_unusable(op, name, _current_gpu()) if on_cuda and kernel in ("auto", "cupy") else None
    if on_cuda and kernel in ("auto", "cupy") and why_not is None:
        return _cupy_many(op)
    if kernel == "cupy":
        raise UnsupportedError(f"the cupy kernel cannot reduce {name} "
                               f"{f'here: {why_not}' if on_cuda else 'on the CPU'}", "use shm+torch")
    fn, label = _torch_kernel(op, on_cuda)

    def reduce(inputs: Sequence, out) -> None:
        inputs = aliased_first(inputs, out)
        if len(inputs) == 1:
            out.copy_(inputs[0])
        else:
            fn(inputs[0], inputs[1], out=out)
            for other in inputs[2:]:
                fn(out, other, out=out)
        wait_for(out)
    reduce.label = label
    return reduce


def aliased_first(inputs: Sequence, out) -> list:
    """``inputs`` with the one that is ``out`` (in place) first, so that a chain of pairwise
    reductions into ``out`` reads it before overwriting it."""
    ptr = out.data_ptr()
    return sorted(inputs, key=lambda t: t.data_ptr() != ptr)


@functools.lru_cache(maxsize=None)
def _cupy_unusable(op: str, dtype: str, device: int) -> Optional[str]:
    """None when CuPy's fused kernel compiles and runs here for (op, dtype), else why not
    (tried once per process and GPU, on the rank's own ``device``: CuPy
    compiles kernels when first called, and a CuPy without its runtime compiler fails only
    then; min and max of floats must keep a NaN, either operand's: three elements)."""
    if dtype not in CUPY_DTYPES:
        return f"CuPy has no {dtype}"
    try:
        # CuPy is optional: only on GPU machines
        import cupy
        nan_kept = op in ("min", "max") and dtype.startswith("float")
        with cupy.cuda.Device(device):
            x, z = cupy.ones(3, dtype=dtype), cupy.ones(3, dtype=dtype)
            if nan_kept:
                x[1] = z[2] = cupy.nan              # a NaN in either operand
            y = cupy.empty_like(x)
            _cupy_many(op)([z, x], y)
            if nan_kept and not bool(cupy.isnan(y[1:]).all()):
                return f"CuPy's {op} dropped a NaN here"
    except Exception as exc:  # noqa: BLE001 - any failure means: reduce with torch instead
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _cupy_many(op: str) -> Callable:
    # CuPy is optional: only on GPU machines
    import cupy
    kernels: dict[int, object] = {}

    def build(n: int):
        names = [f"x{i}" for i in range(n)]
        expr = names[0]
        for other in names[1:]:
            expr = _CUPY_OPS[op][1].format(a=expr, b=other)
        return cupy.ElementwiseKernel(", ".join(f"T {x}" for x in names), "T y",
                                      f"y = {expr}", f"ddlcomm_{op}_{n}", preamble=_CUPY_PREAMBLE)

    def reduce(inputs: Sequence, out) -> None:
        k = kernels.get(len(inputs)) or kernels.setdefault(len(inputs), build(len(inputs)))
        with cupy.cuda.Device(_gpu_of(out)):    # the buffers' GPU, not CuPy's current one
            views, y = _cupy_views(inputs, out)
            k(*views, y)
            cupy.cuda.get_current_stream().synchronize()
    reduce.label = "CuPy"
    return reduce


def _cupy_views(inputs: Sequence, out) -> tuple[list, Any]:
    """CuPy views (DLPack, no copy) of ``inputs`` and of ``out``; an input that is ``out``
    (in place) becomes ``out``'s very view: CuPy copies an input that shares memory with an
    output before every launch, unless it is the same array object."""
    # CuPy is optional: only on GPU machines
    import cupy
    y, mine = cupy.from_dlpack(out), address(out)
    return [y if address(t) == mine else cupy.from_dlpack(t) for t in inputs], y


def _current_gpu() -> int:
    """The rank's GPU (``use_gpu`` made it torch's current device); 0 where torch has none."""
    cuda = _torch().cuda
    return cuda.current_device() if cuda.is_available() else 0


def _gpu_of(buf) -> int:
    """The index of the GPU that holds ``buf``: a CUDA torch tensor or a CuPy array."""
    device = buf.device
    return device.index if hasattr(device, "index") else device.id
