"""The device collectives' pure pieces and CPU-side behaviour, without ranks and without a GPU:
the driver's memory types, the kind cache, reducers by buffer kind on CPU tensors, the
transport of a pair, and the bench options' refusals on a machine without a GPU."""
import importlib.util

import numpy as np
import pytest

from ddlcomm.comm.device import algorithms_for, check_tensors, ends_queued, tail_sync
from ddlcomm.comm.device.transports import choose
from ddlcomm.dtypes import get_op
from ddlcomm.errors import UnsupportedError, UsageError
from ddlcomm.kernels.device import (_dtype_name, aliased_first, dispatching_reducer, kernel_for,
                                    many_reducer)
from ddlcomm.kernels import kinds
from ddlcomm.kernels.kinds import DEVICE, HOST, KindCache, kind_from_memory_type

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("code, kind", [(0, HOST), (1, HOST), (2, DEVICE), (3, DEVICE)])
def test_cuda_memory_types_map_to_kinds(code, kind):
    assert kind_from_memory_type(code) == kind


def test_an_unknown_memory_type_is_refused():
    with pytest.raises(UnsupportedError, match="memory type 7"):
        kind_from_memory_type(7)


def test_the_cache_asks_once_per_buffer_and_forgets_a_freed_buffers_slices():
    asked = []
    cache = KindCache(lambda buf: asked.append(1) or DEVICE)
    a = np.zeros(16, np.float32)
    for _ in range(3):
        assert cache(a[:8]) == DEVICE and cache(a[8:]) == DEVICE
    assert (len(asked), cache.hits, len(cache)) == (2, 4, 2)
    cache.forget(a)                        # both slices lie inside a
    assert len(cache) == 0
    cache(a[:8])
    assert len(asked) == 3


def test_look_ups_are_counted_and_priced_either_way():
    """--kind-cache off asks the driver on every look-up, on once per buffer; a bound call's
    point says how many look-ups a call made and what one costs (timed apart, afterwards)."""
    a = np.zeros(16, np.float32)
    on, off = kinds.lookup(True), kinds.lookup(False)
    assert isinstance(on, KindCache) and isinstance(off, kinds.DriverAsked)
    for _ in range(3):
        on(a)
        off(a)
    assert (on.calls, on.asked) == (3, 1) and (off.calls, off.asked) == (3, 3)
    facts = kinds.lookup_facts(off, 3, a)
    assert facts["kind_lookups"] == 3 and facts["kind_lookups_per_call"] == 1.0
    assert facts["kind_lookup_us"] > 0
    assert facts["kind_lookup_us_per_call"] == pytest.approx(facts["kind_lookup_us"], abs=1e-4)
    assert off.calls == 3                        # pricing a look-up leaves the call's counts alone
    # a call that made none: what the driver was asked, no price
    assert kinds.lookup_facts(kinds.lookup(True), 0, a) == {"kind_lookups": 0}
    assert kinds.cost_us(True, a, reps=10) > 0


def test_kernels_by_kind():
    assert kernel_for(HOST, False) == "auto" and kernel_for(DEVICE, True) == "torch"
    assert kernel_for(DEVICE, True, "cupy") == "cupy"
    with pytest.raises(UsageError, match="reduces host NumPy arrays"):
        kernel_for(DEVICE, True, "c")
    with pytest.raises(UsageError, match="reduces tensors"):
        kernel_for(HOST, False, "torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cpu_tensors_are_reduced_by_torchs_cpu_kernel(dtype):
    reduce = dispatching_reducer("max", dtype, KindCache())
    a, b = torch.tensor([1, 5, 3], dtype=dtype), torch.tensor([4, 2, 6], dtype=dtype)
    reduce(a, b, a)
    assert a.tolist() == [4, 5, 6] and reduce.label == "torch-CPU"


def test_many_inputs_reduced_in_place_read_the_aliased_input_first():
    ins = [torch.full((4,), float(v)) for v in (1, 2, 3)]
    out = ins[2]                            # in place on the last rank's input
    assert aliased_first(ins, out)[0] is out
    many_reducer("sum", torch.float32, on_cuda=False)(ins, out)
    assert out.tolist() == [6.0] * 4


def test_cupy_is_refused_where_it_cannot_run():
    with pytest.raises(UnsupportedError, match="cupy"):
        many_reducer("sum", torch.float32, on_cuda=False, kernel="cupy")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_cupy_asked_for_without_a_working_cupy_says_why():
    with pytest.raises(UnsupportedError, match="cannot reduce float32 here: ModuleNotFoundError"):
        many_reducer("sum", torch.float32, on_cuda=True, kernel="cupy")


@pytest.mark.parametrize("wanted, mine, peer, got", [
    ("auto", "a", "a", "ipc"), ("auto", "a", "b", "staged"), ("staged", "a", "a", "staged"),
    ("ipc", "a", "a", "ipc")])
def test_the_transport_of_a_pair(wanted, mine, peer, got):
    assert choose(wanted, mine, peer) == got


def test_ipc_across_nodes_and_unknown_transports_are_refused():
    with pytest.raises(UsageError, match="one node"):
        choose("ipc", "a", "b")
    with pytest.raises(UsageError, match="unknown device transport 'tcp'"):
        choose("tcp", "a", "a")


def test_device_algorithms_and_tensor_checks():
    assert algorithms_for("allreduce") == ["ring", "rhd", "shm"]
    assert algorithms_for("gather") == []
    with pytest.raises(UsageError, match="must match"):
        check_tensors(None, torch.ones(3), torch.ones(3, dtype=torch.float16))
    with pytest.raises(UsageError, match="receive buffer has 2 elements, the send buffer 3"):
        check_tensors(None, torch.ones(3), torch.ones(2))
    send = torch.ones(2, 3)
    flat, same = check_tensors(None, send, send)
    assert flat is same and flat.shape == (6,)
    with pytest.raises(UsageError, match="the receive buffer overlaps the send buffer"):
        check_tensors(None, send, send.view(-1))      # the same bytes, not the same tensor
    apart = torch.ones(6)
    assert check_tensors(None, send, apart)[1].data_ptr() == apart.data_ptr()


@pytest.mark.parametrize("args, message", [
    (["--kind-cache", "off"], "--kind-cache applies to ddlcomm's own algorithms on --memory device"),
    (["--kind-cache", "on", "--algorithm", "ring"], "--kind-cache applies to"),
    (["--kind-cache", "maybe"], "--kind-cache 'maybe': choose on or off"),
    (["--algorithm", "ring+torch"], "ring+torch: the torch kernel reduces device buffers"),
])
def test_bench_refuses_device_options_in_one_line(capsys, tmp_path, args, message):
    from ddlcomm.cli import main
    rc = main(["bench", "--backend", "mpi", "--collective", "allreduce", "--sizes", "4B",
               "--db", str(tmp_path / "r.db"), "--no-report", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_bench_on_device_memory_without_a_gpu_says_why_in_one_line(capsys, tmp_path):
    from ddlcomm.cli import main
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rc = main(["bench", "--backend", "mpi", "--collective", "allreduce", "--sizes", "4B",
               "--memory", "device", "--algorithm", "ring,rhd,shm", "--kind-cache", "off",
               "--db", str(tmp_path / "r.db"), "--no-report"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "needs a GPU" in err[0], err


@pytest.mark.parametrize("size, op, queued", [(1, None, True), (1, "sum", True), (4, "sum", False),
                                              (4, None, False), (4, "avg", True), (2, "max", False)])
def test_a_device_call_waits_for_the_work_it_left_queued(size, op, queued):
    """Alone, a call's copy is queued on the GPU, and so is avg's division after the last move:
    the call waits for them itself (the host backend's sync is a no-op); the rest is waited for
    by the transports and reducers."""
    assert ends_queued(size, get_op(op) if op else None) is queued


def test_cpu_tensors_end_with_no_sync():
    assert tail_sync(torch.zeros(2), 1, get_op("avg"))() is None


@pytest.mark.parametrize("dtype", ["float32", np.float32, np.dtype("float32"), torch.float32])
def test_a_dtype_is_named_whatever_form_it_comes_in(dtype):
    assert _dtype_name(dtype) == "float32"


def test_a_peer_buffer_the_driver_will_not_map_is_a_refusal():
    """CUDA IPC refused on one rank (torch's RuntimeError) becomes UnsupportedError, which
    map_peers agrees on: a RuntimeError left the others waiting in the first call."""
    from ddlcomm.comm.device.allreduce_shm import open_peers

    class Refusing:
        def open(self, handle):
            raise RuntimeError("CUDA error: invalid resource handle\nCUDA kernel errors ...")
    mine = torch.zeros(4)
    with pytest.raises(UnsupportedError, match=r"^cannot map rank 1's buffer: CUDA error: "
                                               r"invalid resource handle \(use ring or rhd"):
        open_peers(0, Refusing(), mine, [(b"", 0, 16), (b"h", 0, 16)])
    assert open_peers(0, Refusing(), mine, [(b"", 0, 16)])[0] is mine
