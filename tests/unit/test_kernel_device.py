"""The buffer-kind cache and the device reduction (the GPU part skips without a CUDA device)."""
import numpy as np
import pytest

from ddlcomm.errors import UnsupportedError
from ddlcomm.kernels.bench import measure
from ddlcomm.kernels.device import (DEVICE, HOST, KindCache, address, copy_pass, device_reducer,
                                    dispatching_reducer, kind_of)
from ddlcomm.memory.gpu import cuda_available

CUDA, WHY = cuda_available()


def needs_gpu(test):
    """A GPU test: marked ``gpu`` (scripts/gpu-check runs it there), skipped here with why."""
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA, reason=f"needs a GPU: {WHY}")(test))


def test_host_buffers_are_looked_up_once_per_buffer():
    cache = KindCache()
    a, b = np.ones(8, np.float32), np.ones(8, np.float32)
    assert [cache(a), cache(a), cache(b), cache(a[:4])] == [HOST] * 4
    assert (cache.misses, cache.hits) == (3, 1)          # a[:4] is another (address, bytes)
    cache.forget(a)
    cache(a)
    assert cache.misses == 4
    assert address(a) == (a.__array_interface__["data"][0], 32)


def test_dispatching_reducer_uses_the_host_kernel_for_host_buffers():
    cache = KindCache()
    reduce = dispatching_reducer("sum", np.float32, cache)
    a, b = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    for _ in range(3):
        reduce(a, b, a)
    assert a.tolist() == [3, 4, 5, 6, 7] and (cache.misses, cache.hits) == (1, 2)


def test_cpu_tensors_are_host():
    torch = pytest.importorskip("torch")
    t = torch.ones(4)
    assert kind_of(t) == HOST and address(t)[1] == 16


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_device_reduction_without_a_gpu_says_why():
    with pytest.raises(UnsupportedError, match="needs a GPU"):
        device_reducer("sum")


@needs_gpu
@pytest.mark.parametrize("op, want", [("sum", 3.0), ("prod", 2.0), ("min", 1.0), ("max", 2.0)])
def test_device_reduction_on_the_gpu(op, want):
    import torch
    a = torch.ones(1 << 20, device="cuda")
    b = torch.full((1 << 20,), 2.0, device="cuda")
    cache = KindCache()
    assert cache(a) == DEVICE
    dispatching_reducer(op, np.float32, cache)(a, b, a)
    assert torch.all(a == want).item()


def test_the_floor_pass_copies_the_second_into_the_output():
    torch = pytest.importorskip("torch")
    a, b = torch.zeros(5), torch.arange(5.0)
    copy_pass(a, b, a)
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@needs_gpu
def test_the_floor_pass_is_done_on_return_on_the_gpu():
    import torch
    a, b = torch.zeros(1 << 24, device="cuda"), torch.ones(1 << 24, device="cuda")
    copy_pass(a, b, a)
    assert torch.cuda.current_stream().query() and float(a.sum()) == float(1 << 24)


def test_kernel_bench_reports_the_reference_first():
    rows = measure(["float16"], 1 << 16, rounds=2)
    assert [(r["dtype"], r["kernel"]) for r in rows][:1] == [("float32", "numpy")]
    assert rows[0]["vs_reference"] == pytest.approx(1.0) and rows[0]["reference"] == "np.add float32"
    assert measure(["float32"], 64, rounds=1, op="max")[0]["reference"] == "np.maximum float32"
    assert {r["dtype"] for r in rows} == {"float32", "float16"}
    assert all(r["GBps"] > 0 for r in rows)


@pytest.mark.parametrize("args, message", [
    (["--op", "avg"], "no reduction kernel for op 'avg'"),
    (["--dtype", "float8"], "float8"),
    (["--size", "12XB"], "12XB"),
    (["--size", "2", "--dtype", "float16"], "not whole float32 elements, the reference"),
])
def test_kernels_command_refuses_bad_input(capsys, args, message):
    from ddlcomm.cli import main
    assert main(["kernels", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_kernels_command_prints_json(capsys):
    import json

    from ddlcomm.cli import main
    assert main(["kernels", "--dtype", "float32", "--size", "64KiB", "--rounds", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["dtype"] == "float32" and {r["kernel"] for r in rows} >= {"numpy"}


def test_pointer_attributes_struct_is_as_large_as_cuda_13s():
    """cudaPointerGetAttributes writes CUDA 13's whole struct (type, device, two pointers,
    then ``long reserved[8]``): ddlcomm's ctypes copy must hold all of it."""
    import ctypes

    from ddlcomm.kernels import kinds
    assert ctypes.sizeof(kinds._Attributes) >= 4 + 4 + 8 + 8 + 8 * ctypes.sizeof(ctypes.c_long)
    assert kinds._Attributes.type.offset == 0 and kinds._Attributes.hostPointer.offset == 16


def test_cudart_is_also_looked_up_by_its_sonames():
    from ddlcomm.kernels import kinds
    paths = kinds.cudart_paths()
    assert "libcudart.so.13" in paths and "libcudart.so.12" in paths


def test_the_gpu_of_a_buffer_from_torch_or_cupy():
    """CuPy's kernels run on the GPU that holds the buffers (a rank's GPU need not be
    CuPy's current one); the index is read from a torch tensor or a CuPy array alike."""
    from types import SimpleNamespace
    from ddlcomm.kernels.device import _gpu_of
    assert _gpu_of(SimpleNamespace(device=SimpleNamespace(index=3, type="cuda"))) == 3
    assert _gpu_of(SimpleNamespace(device=SimpleNamespace(id=2))) == 2
