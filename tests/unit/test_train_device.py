"""Training on a device, as far as it goes without a GPU.

The GPU refusals are the real ones (this machine has no GPU: one line, exit 2).
The device, bucket and wire code takes any torch device: here ``torch.device("cpu")``
stands in for a GPU, so these tests check the plumbing (where buffers live, what a
backend is handed, the copies around a call, the syncs at phase boundaries), not a
GPU; tests/mpi/test_gpu_train.py runs the real thing on a GPU machine.
"""
from __future__ import annotations

import numpy as np
import pytest

from ddlcomm.errors import UnsupportedError, UsageError
from ddlcomm.train import device as dev
from ddlcomm.train import timed
from ddlcomm.train import wire as wires
from ddlcomm.memory.gpu import cuda_available

from test_cli import ddlcomm  # the real command, outside any launcher
from test_train_cli import jobs
from test_train_timed import Data, FakeComm, Recorder

torch = pytest.importorskip("torch")
NO_GPU = pytest.mark.skipif(cuda_available()[0], reason="this machine has a GPU")


# ------------------------------------------------------------------ refusals without a GPU
@NO_GPU
@pytest.mark.parametrize("argv, says", [
    (("--backend", "nccl"), "ddlcomm: error: backend nccl needs a CUDA GPU: "
                            "torch.cuda.is_available() is False"),
    (("--backend", "nccl", "--device", "cuda", "--overlap"), "ddlcomm: error: backend nccl needs a CUDA GPU"),
    (("--backend", "gloo", "--device", "cuda"), "ddlcomm: error: --device cuda needs a CUDA GPU: "
                                                "torch.cuda.is_available() is False"),
    (("--backend", "mpi", "--device", "cuda", "--peer", "ddp"), "ddlcomm: error: --device cuda needs a CUDA GPU"),
    (("--device", "tpu"), "argument --device: invalid choice: 'tpu'"),
])
def test_gpu_training_refused_in_one_line(tmp_path, argv, says):
    res = ddlcomm("train", *argv, db=tmp_path / "x.db")
    assert res.returncode == 2, res.stdout + res.stderr
    assert says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "x.db").exists()


@NO_GPU
def test_plan_refuses_the_gpu_without_one():
    with pytest.raises(UsageError, match="--device cuda needs a CUDA GPU"):
        jobs("--backend", "nccl")               # nccl trains on the GPU by default
    with pytest.raises(UsageError, match="--device cuda needs a CUDA GPU"):
        jobs("--backend", "gloo", "--device", "cuda")


def test_a_device_only_backend_cannot_train_on_the_cpu():
    with pytest.raises(UnsupportedError, match="backend nccl takes device memory only.*CPU"):
        jobs("--backend", "nccl", "--device", "cpu")


def test_unknown_device():
    with pytest.raises(UsageError, match="unknown --device 'tpu'.*cpu, cuda"):
        dev.get_device("tpu")


# ------------------------------------------------------------------ which wire
@pytest.mark.parametrize("device, memories, kind", [
    ("cpu", ("host",), "view"),                 # mpi, gloo on the CPU: NumPy views
    ("cpu", ("host", "device"), "view"),
    ("cuda", ("device",), "device"),            # nccl: CUDA tensors
    ("cuda", ("host", "device"), "device"),     # gloo, a CUDA-aware MPI: CUDA tensors
    ("cuda", ("host",), "staged"),              # the pip MPIs: host copies, never a GPU pointer
])
def test_wire_chosen_by_device_and_backend_memories(device, memories, kind):
    assert wires.wire_for(device, memories).kind == kind


def test_no_wire_for_a_cpu_tensor_and_a_device_only_backend():
    with pytest.raises(UnsupportedError, match="takes device memory only"):
        wires.wire_for("cpu", ("device",), "nccl")


# ------------------------------------------------------------------ wires on a stand-in device
class Comm:
    """A one-rank communicator that records what it was handed (not a backend: the calls
    a real backend makes are tested in tests/mpi)."""
    rank, size, name, memories = 0, 1, "stand-in", ("host",)

    def __init__(self):
        self.handed = []

    def iallreduce(self, sendbuf, recvbuf, op):
        self.handed.append(sendbuf)
        recvbuf *= 2                    # a visible "result"
        return Done()


class Done:
    def wait(self):
        return None

    def test(self):
        return True


def test_view_wire_shares_the_tensors_memory():
    t = torch.arange(4, dtype=torch.float32)
    w = wires.ViewWire(t)
    assert isinstance(w.buf, np.ndarray) and not w.copies
    w.buf[1] = 9
    assert t[1] == 9
    s = w.scratch()
    s.buf[0] = 5
    assert t[0] == 0 and s.tensor[1] == 9


def test_staged_wire_copies_out_and_back_and_hands_a_host_array():
    t = torch.arange(4, dtype=torch.float32)        # the CPU standing in for a GPU
    w = wires.StagedWire(t)
    assert w.copies and isinstance(w.buf, np.ndarray)
    assert w.buf.ctypes.data != t.data_ptr()        # its own host memory
    comm = Comm()
    req = wires.iallreduce(comm, w)
    assert comm.handed[0] is w.buf                   # the backend saw the host array only
    assert t.tolist() == [0, 1, 2, 3]                # not pulled before completion
    assert req.test() and t.tolist() == [0, 2, 4, 6]
    req.wait()
    assert t.tolist() == [0, 2, 4, 6]                # pulled once


def test_wired_call_copies_around_the_call_only_where_a_wire_copies():
    t = torch.ones(3)
    staged, view = wires.StagedWire(t), wires.ViewWire(torch.ones(3))
    seen = []

    def call():
        seen.append(staged.buf.copy())
        staged.buf[:] = 7
    plain = lambda: None                              # noqa: E731
    assert wires.wired(plain, [view], [view]) is plain
    wires.wired(call, [staged], [staged])()
    assert seen[0].tolist() == [1, 1, 1] and t.tolist() == [7, 7, 7]


def test_device_wire_hands_the_tensor():
    t = torch.zeros(2)
    w = wires.DeviceWire(t)
    assert w.buf is t and not w.copies and w.scratch().buf is not t


# ------------------------------------------------------------------ buckets on a device
def test_buckets_on_a_stand_in_device_with_a_staged_wire():
    from ddlcomm.train.aggregate import Buckets
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(torch.device("cpu"))
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    bk = Buckets(list(model.parameters()), [3, 2, 1, 0], fusion_bytes=40, wire=wires.StagedWire)
    assert [w.kind for w in bk.gwires] == ["staged"] * len(bk.gbufs)
    assert all(p.device == bk.pbufs[0].device for p in model.parameters())
    assert np.array_equal(np.sort(bk.flat_params()), np.sort(before.numpy()))
    model(torch.ones(5, 3)).sum().backward()         # gradients land in the buckets
    assert any(g.abs().sum() > 0 for g in bk.gbufs)
    bk.zero_grads()
    assert all(g.abs().sum() == 0 for g in bk.gbufs)
    assert bk.nbytes == [g.numel() * 4 for g in bk.gbufs]


def test_placed_cpu_and_the_loop_syncs_at_every_phase_boundary():
    p = dev.placed(torch.device("cpu"))
    assert p.name == "cpu" and not p.on_gpu and p.gpu == -1
    assert p.facts == {"device": "cpu", "sync": "none"}
    assert p.seconds([1.0, 2.0], None, 0.5) == [1.0, 2.0]
    syncs = []
    counting = dev.Placed("cpu", "cpu", sync=lambda: syncs.append(1))
    timed.timed_iteration(Recorder(), Data(), 0, counting)
    assert len(syncs) == 5                 # h2d, forward, backward, communication, update
    syncs.clear()
    timed.timed_loop(FakeComm(0, 1), Recorder(comm_after_backward=False), Data(), 0, 2, counting)
    assert len(syncs) == 8                 # DDP: no communication phase of its own


def test_device_facts_name_each_ranks_gpu_and_its_sharing():
    from ddlcomm.train.loop import device_facts
    assert device_facts(dev.HOST, np.array([[-1], [-1]])) == {"device": "cpu", "sync": "none"}
    gpu = dev.Placed("cuda", "cuda:0", facts={"device": "cuda", "sync": "cuda"}, gpu=0)
    facts = device_facts(gpu, np.array([[0.0], [0.0], [1.0]]))
    assert facts["gpu"] == [0, 0, 1] and facts["ranks_per_gpu"] == [2, 2, 1]
    assert facts["sync"] == "cuda"
