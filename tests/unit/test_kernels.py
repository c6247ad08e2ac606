"""Reduction kernels (ddlcomm.kernels): every op x dtype x kernel/ISA against NumPy.

References are computed here in NumPy: float32 and float64 ops as NumPy does
them; float16 and bfloat16 as "widen to float32, compute, round to nearest
even" (NumPy's float32 -> float16 cast, ml_dtypes' float32 -> bfloat16 cast)
and must match exactly, NaN for NaN.  Inputs mix random bit patterns (every
class of value: zeros, subnormals, normals, inf, NaN) with constructed ties.
Every C ISA the CPU runs is checked, and must agree bit for bit with the
portable loop.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from ddlcomm import kernels
from ddlcomm.dtypes import DTYPES, OPS as REDUCE_OPS
from ddlcomm.errors import UnsupportedError, UsageError

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
DT_NAMES = ("float32", "float64", "int32", "int64", "uint8", "float16", "bfloat16")
LENGTHS = (0, 1, 15, 16, 17, 1000003)
BIG = max(LENGTHS)
C_ISAS = kernels.supported_isas()
#: (kernel, isa) pairs under test: NumPy, then each C loop this CPU runs.
IMPLS = [("numpy", None)] + [("c", isa) for isa in C_ISAS]
IMPL_IDS = ["numpy"] + [f"c-{isa}" for isa in C_ISAS]
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ------------------------------------------------------------------ inputs
def _ties16(rng, n: int, to_float, from_bits) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (x, y) with x + y exactly half-way between two neighbours of the 2-byte format.

    y = ±ulp(x)/2, so the float32 sum is a tie: rounding must go to the even
    neighbour (x itself or its successor).  from_bits/to_float convert the
    2-byte format; mantissa bits vary so both parities occur.
    """
    bits = rng.integers(0, 1 << 16, size=4 * n, dtype=np.uint16)
    x = from_bits(bits)
    xf = to_float(x)
    keep = np.isfinite(xf) & (np.abs(xf) > 0)
    x, xf = x[keep][:n], xf[keep][:n]
    nxt = to_float(from_bits(bits[keep][:n] + np.uint16(1)))   # neighbour away from zero (same sign)
    half_ulp = (np.abs(nxt) - np.abs(xf)) / 2
    sign = np.where(rng.random(x.size) < 0.5, -1, 1).astype(np.float32)
    y = (sign * half_ulp).astype(np.float32)
    y16 = y.astype(x.dtype)
    ok = np.isfinite(y) & (y != 0) & (y16.astype(np.float32) == y)     # the partner itself exact
    return x[ok], y16[ok]


def _bits(dtype: np.dtype):
    return lambda b: np.asarray(b, np.uint16).view(dtype)


def make_inputs(dtype: np.dtype, op: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of BIG elements covering the dtype's special values and, for floats, ties."""
    n = BIG
    if dtype in (np.dtype(np.float16), BF16):
        a = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        b = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        a[:1 << 16] = np.arange(1 << 16, dtype=np.uint16)           # every value at least once
        a, b = a.view(dtype), b.view(dtype)
        # narrow exponents too, so that sums and products land near each other (ties, subnormals)
        near = slice(1 << 16, 3 << 16)
        a[near] = (rng.standard_normal(1 << 17) * 2.0 ** rng.integers(-30, 8, 1 << 17)).astype(np.float32).astype(dtype)
        b[near] = (rng.standard_normal(1 << 17) * 2.0 ** rng.integers(-30, 8, 1 << 17)).astype(np.float32).astype(dtype)
        x, y = _ties16(rng, 50000, lambda v: v.astype(np.float32), _bits(dtype))
        a[300000:300000 + x.size], b[300000:300000 + y.size] = x, y
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0], np.float32).astype(dtype)
        a[-49:] = np.repeat(specials, 7)
        b[-49:] = np.tile(specials, 7)
        return a, b
    if dtype.kind == "f":
        scale = 2.0 ** rng.integers(-60, 60, n)
        a = (rng.standard_normal(n) * scale).astype(dtype)
        b = (rng.standard_normal(n) * scale[::-1]).astype(dtype)
        fi = np.finfo(dtype)
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, fi.tiny,
                             fi.smallest_subnormal, -fi.smallest_subnormal], dtype)
        a[-81:] = np.repeat(specials, 9)
        b[-81:] = np.tile(specials, 9)
        return a, b
    if dtype == np.uint8:                                           # every pair of bytes
        a = rng.integers(0, 256, size=n, dtype=np.uint8)
        b = rng.integers(0, 256, size=n, dtype=np.uint8)
        a[:1 << 16] = np.repeat(np.arange(256, dtype=np.uint8), 256)
        b[:1 << 16] = np.tile(np.arange(256, dtype=np.uint8), 256)
        return a, b
    info = np.iinfo(dtype)                                          # full range: + and * wrap
    a = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    small = slice(0, n // 2)
    a[small] = rng.integers(-50000, 50000, size=n // 2)
    b[small] = rng.integers(-50000, 50000, size=n // 2)
    a[-4:], b[-4:] = [info.min, info.max, -1, 0], [info.min, -1, info.max, info.min]
    return a, b


def reference(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy's answer: float16/bfloat16 through float32, rounded to nearest even once."""
    ufunc = UFUNCS[op]
    if a.dtype in (np.dtype(np.float16), BF16):
        with np.errstate(all="ignore"):
            return ufunc(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    with np.errstate(all="ignore"):
        return ufunc(a, b)


def same(got: np.ndarray, want: np.ndarray, op: str = "sum") -> bool:
    """Equal values, bit for bit (a zero's sign too: (-0) + (-0) is -0), and NaN where NaN;
    of ``op`` min or max, either zero where both are zeros (IEEE 754 leaves min(+0, -0)
    to the implementation, and NumPy answers it one way in float16, the other in float32)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if op in ("min", "max") and got.dtype.kind not in "iu":
        apart = ~((got == 0) & (want == 0))
        got, want = got[apart], want[apart]
    return bit_identical(got, want)


def bit_identical(x: np.ndarray, y: np.ndarray) -> bool:
    """Same bits, except that any NaN matches any NaN (payloads may differ)."""
    ux, uy = x.view(_UINT[x.dtype.itemsize]), y.view(_UINT[y.dtype.itemsize])
    if x.dtype.kind in "iu":
        return bool(np.array_equal(ux, uy))
    nx, ny = np.isnan(x.astype(np.float32 if x.itemsize == 2 else x.dtype)), \
        np.isnan(y.astype(np.float32 if y.itemsize == 2 else y.dtype))
    return bool(np.array_equal(nx, ny) and np.array_equal(ux[~nx], uy[~ny]))


_CACHE: dict = {}


def case(dtype_name: str, op: str):
    """(a, b, want) for a dtype and op, computed once per test session."""
    key = (dtype_name, op)
    if key not in _CACHE:
        rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
        a, b = make_inputs(DTYPES[dtype_name].numpy, op, rng)
        _CACHE[key] = (a, b, reference(op, a, b))
    return _CACHE[key]


# ------------------------------------------------------------------ build and API
def test_c_kernel_is_built():
    """The package build must compile the C kernel (opt out where no compiler is expected)."""
    if os.environ.get("DDLCOMM_NO_C_KERNEL_OK"):
        pytest.skip("DDLCOMM_NO_C_KERNEL_OK is set")
    assert not kernels.available()["c"].startswith("missing"), kernels.available()["c"]
    assert C_ISAS[0] == "portable" and kernels.isa() in C_ISAS


def test_shm_engines_are_built():
    """The package build must compile the shm engines too (built optional, like the kernel:
    without them the pipelined and mapped shm variants and their tests are skipped)."""
    if os.environ.get("DDLCOMM_NO_C_KERNEL_OK"):
        pytest.skip("DDLCOMM_NO_C_KERNEL_OK is set")
    from ddlcomm.comm import shm, shm_mapped
    assert shm._shmpipe is not None, "ddlcomm.comm._shmpipe is not built"
    assert shm_mapped._shmmap is not None, "ddlcomm.comm._shmmap is not built"


def test_available_describes_every_kernel():
    info = kernels.available()
    assert tuple(info) == kernels.KERNELS
    assert info["numpy"].startswith("NumPy")
    assert info["c"] == kernels.describe_isa(kernels.isa())


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86-64 Linux only")
def test_isa_matches_cpu_flags():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    want = ["portable"]
    if {"avx2", "f16c"} <= flags:
        want.append("avx2")
        if "avx512f" in flags:
            want.append("avx512")
            if "avx512_bf16" in flags and kernels._reduce.cpu_features()["avx512bf16_compiled"]:
                want.append("avx512bf16")
    assert list(C_ISAS) == want
    if not os.environ.get(kernels.ISA_ENV):
        assert kernels.isa() == want[-1]


def test_auto_is_c_when_built_and_numpy_otherwise():
    r = kernels.reducer("sum", "float32")
    assert r is kernels.reducer("sum", DTYPES["float32"])          # cached, any spelling of the dtype
    assert r is kernels.reducer(REDUCE_OPS["sum"], np.float32)
    if C_ISAS:
        assert r.isa == kernels.isa() and r.op == "sum" and r.dtype == "float32"
        assert "sum float32" in repr(r)


def test_avg_reduces_as_sum():
    a = np.array([1.0, 2.0], np.float32)
    out = np.empty_like(a)
    kernels.reducer(REDUCE_OPS["avg"], "float32")(a, a, out)
    assert out.tolist() == [2.0, 4.0]


@pytest.mark.parametrize("args, match", [
    (("xor", "float32"), "sum, prod, min, max"),
    (("sum", "complex64"), "float32"),
    (("sum", np.complex64), "float32"),
    (("sum", "float32", "fortran"), "numpy, c"),
])
def test_bad_requests_name_the_choices(args, match):
    with pytest.raises(UsageError, match=match):
        kernels.reducer(*args)


@pytest.mark.skipif(not C_ISAS, reason="C kernel not built")
def test_isa_the_cpu_cannot_run_is_refused():
    with pytest.raises(UnsupportedError, match="cannot run ISA"):
        kernels.reducer("sum", "float32", kernel="c", isa="sse9")


# ------------------------------------------------------------------ correctness
@pytest.mark.parametrize("kernel, isa", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("op", kernels.OPS)
@pytest.mark.parametrize("dtype_name", DT_NAMES)
def test_every_op_and_dtype_matches_numpy(dtype_name, op, kernel, isa):
    a, b, want = case(dtype_name, op)
    reduce = kernels.reducer(op, dtype_name, kernel, isa)
    for n in LENGTHS:
        out = np.full(n, 7, a.dtype)
        reduce(a[:n], b[:n], out)
        assert same(out, want[:n], op), f"n={n}"
    # the tail of the arrays (specials, extremes) at short lengths too
    for n in (1, 15, 16, 17, 100):
        out = np.empty(n, a.dtype)
        reduce(a[-n:], b[-n:], out)
        assert same(out, want[-n:], op), f"last {n}"


@pytest.mark.skipif(not C_ISAS, reason="C kernel not built")
@pytest.mark.parametrize("op", kernels.OPS)
@pytest.mark.parametrize("dtype_name", DT_NAMES)
def test_every_isa_is_bit_identical_to_portable(dtype_name, op):
    a, b, _ = case(dtype_name, op)
    portable = np.empty_like(a)
    kernels.reducer(op, dtype_name, "c", "portable")(a, b, portable)
    for isa in C_ISAS[1:]:
        out = np.empty_like(a)
        kernels.reducer(op, dtype_name, "c", isa)(a, b, out)
        assert bit_identical(out, portable), isa


@pytest.mark.parametrize("kernel, isa", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16", "int64", "uint8"])
def test_out_may_alias_a_or_b_and_slices_may_be_unaligned(dtype_name, kernel, isa):
    a, b, want = case(dtype_name, "sum")
    reduce = kernels.reducer("sum", dtype_name, kernel, isa)
    for n in (17, 1001):
        for start in (1, 3):                      # off the 64-byte alignment of the array start
            x, y = a[start:start + n].copy(), b[start:start + n].copy()
            reduce(x, y, x)
            assert same(x, want[start:start + n]), ("out=a", n, start)
            x, y = a[start:start + n].copy(), b[start:start + n].copy()
            reduce(x, y, y)
            assert same(y, want[start:start + n]), ("out=b", n, start)
            big_a, big_b = a.copy(), b.copy()     # views into larger arrays, written in place
            reduce(big_a[start:start + n], big_b[start:start + n], big_a[start:start + n])
            assert same(big_a[start:start + n], want[start:start + n])
            assert same(big_a[start + n:start + n + 5], a[start + n:start + n + 5]), "wrote past the end"


@pytest.mark.skipif(not C_ISAS, reason="C kernel not built")
@pytest.mark.parametrize("isa", C_ISAS)
def test_elements_unaligned_to_their_own_size(isa):
    a, b, want = case("float64", "prod")
    n = 1001
    raw = bytearray(3 * n * 8 + 3)
    x = np.frombuffer(raw, np.float64, n, offset=1)               # 1 byte off: misaligned doubles
    y = np.frombuffer(raw, np.float64, n, offset=1 + n * 8)
    out = np.frombuffer(raw, np.float64, n, offset=1 + 2 * n * 8)
    x[:], y[:] = a[:n], b[:n]
    kernels.reducer("prod", "float64", "c", isa)(x, y, out)
    assert same(out, want[:n])


@pytest.mark.parametrize("kernel, isa", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32"])
def test_raw_byte_buffers_are_read_as_the_dtype(dtype_name, kernel, isa):
    """As MPI user operations get them: untyped buffers (mpi4py's), reduced in place."""
    a, b, want = case(dtype_name, "max")
    n = 33
    inbuf, inout = bytearray(a[:n].tobytes()), bytearray(b[:n].tobytes())
    kernels.reducer("max", dtype_name, kernel, isa)(memoryview(inbuf), memoryview(inout), memoryview(inout))
    assert same(np.frombuffer(bytes(inout), a.dtype), want[:n], "max")


@pytest.mark.parametrize("kernel, isa", IMPLS, ids=IMPL_IDS)
def test_arrays_of_bytes_are_read_as_the_dtype_and_another_item_size_refused(kernel, isa):
    """NumPy's kernel computed in the arrays' own dtype: uint8 views of float32 wrapped
    round as bytes (8.5e+37 for 1.5 + 1.5), float64 arrays into a float32 reducer summed as
    float64; the C kernel reads the bytes as its dtype and refuses another item size."""
    a = np.float32([1.5, 2.5]).view(np.uint8)
    out = np.zeros(8, np.uint8)
    kernels.reducer("sum", "float32", kernel, isa)(a, a.copy(), out)
    assert list(out.view(np.float32)) == [3.0, 5.0]
    with pytest.raises(ValueError, match="item size does not match"):
        kernels.reducer("sum", "float32", kernel, isa)(np.ones(2), np.ones(2), np.zeros(2))


@pytest.mark.skipif(not C_ISAS, reason="C kernel not built")
def test_c_kernel_refuses_bad_buffers():
    r = kernels.reducer("sum", "float32", "c")
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="same size"):
        r(a, a[:4], a)
    with pytest.raises(ValueError, match="overlaps"):
        r(a[:4], a[:4], a[1:5])
    with pytest.raises(ValueError, match="item size"):
        r(np.zeros(4, np.float64), np.zeros(4, np.float64), np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="multiple"):
        r(bytearray(6), bytearray(6), bytearray(6))
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        r(a[::2], a[::2], np.zeros(4, np.float32))
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises((BufferError, ValueError), match="read-only"):
        r(a, a, frozen)
    with pytest.raises(TypeError, match="three positional"):
        r(a, a)
    with pytest.raises(ValueError, match="unknown op"):
        kernels._reduce.Reducer("xor", "float32")


@pytest.mark.skipif(not C_ISAS, reason="C kernel not built")
def test_isa_env_var_forces_the_portable_loop_with_identical_results(tmp_path):
    """DDLCOMM_KERNEL_ISA=portable is read at import; results equal the default ISA's."""
    a, b, _ = case("bfloat16", "sum")
    f, h, _ = case("float16", "prod")
    np.save(tmp_path / "a.npy", a.view(np.uint16)[:100003])
    np.save(tmp_path / "b.npy", b.view(np.uint16)[:100003])
    np.save(tmp_path / "f.npy", f[:100003])
    np.save(tmp_path / "h.npy", h[:100003])
    script = (
        "import sys, numpy as np, ml_dtypes\n"
        "from ddlcomm import kernels\n"
        "d = sys.argv[1]\n"
        "a = np.load(d + '/a.npy').view(ml_dtypes.bfloat16); b = np.load(d + '/b.npy').view(ml_dtypes.bfloat16)\n"
        "f = np.load(d + '/f.npy'); h = np.load(d + '/h.npy')\n"
        "kernels.reducer('sum', 'bfloat16')(a, b, a); kernels.reducer('prod', 'float16')(f, h, f)\n"
        "np.save(d + '/out_bf16.npy', a.view(np.uint16)); np.save(d + '/out_f16.npy', f)\n"
        "print(kernels.isa(), kernels.available()['c'])\n")
    env = dict(os.environ, DDLCOMM_KERNEL_ISA="portable")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True)
    assert run.stdout.split()[0] == "portable" and "portable C" in run.stdout
    here_bf16, here_f16 = a[:100003].copy(), f[:100003].copy()
    kernels.reducer("sum", "bfloat16")(here_bf16, b[:100003], here_bf16)
    kernels.reducer("prod", "float16")(here_f16, h[:100003], here_f16)
    assert bit_identical(np.load(tmp_path / "out_bf16.npy").view(BF16), here_bf16)
    assert bit_identical(np.load(tmp_path / "out_f16.npy"), here_f16)

    env[kernels.ISA_ENV] = "sse9"
    run = subprocess.run([sys.executable, "-W", "always", "-c", script, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True)
    assert "not an ISA" in run.stderr and run.stdout.split()[0] == C_ISAS[-1]


def test_float16_conversions_are_exact_for_every_value():
    """All 65536 halves through the kernels: x + 0 = x, x * 1 = x, max(x, -inf) = x."""
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    for kernel, isa in IMPLS:
        for op, other in (("sum", -0.0), ("prod", 1.0), ("max", -np.inf)):
            out = np.empty_like(every)
            kernels.reducer(op, "float16", kernel, isa)(every, np.full_like(every, other), out)
            assert same(out, every), (kernel, isa, op)


@pytest.mark.parametrize("kernel, isa", IMPLS, ids=IMPL_IDS)
def test_bfloat16_rounding_ties_to_even_and_keeps_subnormals(kernel, isa):
    """Ties go to even; subnormal results stay (VCVTNE2PS2BF16 alone would flush them)."""
    pairs = [(0x3f80, 0x3b80, 0x3f80),      # 1 + 2^-8: a tie, to the even 1.0
             (0x3f81, 0x3b80, 0x3f82),      # 1.0078125 + 2^-8: a tie, to the even 1.015625
             (0x0001, 0x0001, 0x0002),      # 2^-133 + 2^-133 = 2^-132, subnormal
             (0x007f, 0x0001, 0x0080),      # largest subnormal + smallest: smallest normal
             (0x8001, 0x0080, 0x007f)]      # smallest normal - smallest subnormal: subnormal
    # 64 elements, so the 32-wide AVX512-BF16 loop sees every pair, not only the tail loop
    a, b, want = (np.resize(np.array(col, np.uint16), 64) for col in zip(*pairs))
    out = np.empty(64, BF16)
    kernels.reducer("sum", "bfloat16", kernel, isa)(a.view(BF16), b.view(BF16), out)
    assert out.view(np.uint16).tolist() == want.tolist()
    assert same(out, reference("sum", a.view(BF16), b.view(BF16)))


def _run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout


def test_without_the_c_kernel_numpy_does_the_work():
    out = _run_python(
        "import sys; sys.modules['ddlcomm.kernels._reduce'] = None\n"
        "import numpy as np; from ddlcomm import kernels\n"
        "a = np.arange(5, dtype=np.float16); o = np.empty_like(a)\n"
        "kernels.reducer('sum', 'float16')(a, a, o)\n"
        "print(o.tolist(), kernels.isa(), kernels.available()['c'])\n"
        "try:\n"
        "    kernels.reducer('sum', 'float16', 'c')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n")
    first, second = out.splitlines()
    assert first.startswith("[0.0, 2.0, 4.0, 6.0, 8.0] none missing: not built")
    assert second.startswith("UnsupportedError") and "pip install" in second


def test_without_ml_dtypes_there_is_no_bfloat16():
    out = _run_python(
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import ddlcomm; from ddlcomm import kernels\n"
        "print('bfloat16' in ddlcomm.DTYPES, 'float16' in ddlcomm.DTYPES,\n"
        "      ddlcomm.DTYPES['float16'].eps == 2.0 ** -10)\n")
    assert out.split() == ["False", "True", "True"]


def test_dtype_eps_includes_bfloat16():
    assert DTYPES["bfloat16"].eps == 2.0 ** -7
    assert DTYPES["float32"].eps == float(np.finfo(np.float32).eps)
