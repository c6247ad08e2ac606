"""The training loop shared by ddlcomm's configurations and DDP, and the packed gather,
with stand-ins for the communicator, the data and the tensors (no torch, no MPI)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ddlcomm.train import phases as ph
from ddlcomm.train import timed
from ddlcomm.train.gather import gather_named, pack, unpack


# ------------------------------------------------------------------ packed gather
def test_pack_and_unpack_by_name():
    arrays = {"phases": np.arange(6.0).reshape(2, 3), "t_iter": np.array([7.0, 8.0]),
              "loss": np.array([np.nan, 1.5, 0.5]), "none": np.zeros(0)}
    flat, layout = pack(arrays)
    assert flat.dtype == np.float64 and flat.shape == (11,)
    assert layout == [("phases", (2, 3)), ("t_iter", (2,)), ("loss", (3,)), ("none", (0,))]
    rows = np.stack([flat, flat + 100])                 # two ranks
    out = unpack(rows, layout)
    assert list(out) == ["phases", "t_iter", "loss", "none"]
    assert out["phases"].shape == (2, 2, 3) and out["none"].shape == (2, 0)
    assert np.array_equal(out["phases"][0], arrays["phases"])
    assert np.array_equal(out["phases"][1], arrays["phases"] + 100)
    assert out["t_iter"].tolist() == [[7.0, 8.0], [107.0, 108.0]]
    assert np.isnan(out["loss"][0, 0]) and out["loss"][1, 1:].tolist() == [101.5, 100.5]
    with pytest.raises(ValueError, match="11"):
        unpack(rows[:, :-1], layout)
    with pytest.raises(ValueError):
        unpack(flat, layout)                            # one row needs its rank axis


class FakeComm:
    """Rank ``rank`` of ``size``: the other ranks hold ``offset`` more in every value."""

    def __init__(self, rank: int = 0, size: int = 2, offset: float = 10.0) -> None:
        self.rank, self.size, self.offset = rank, size, offset
        self.barriers = 0

    def gather(self, flat, root=0):
        if self.rank != root:
            return None
        return np.concatenate([flat + r * self.offset for r in range(self.size)])

    def barrier(self):
        self.barriers += 1

    def allreduce(self, buf, out, op):
        assert op == "max"
        out[...] = buf


def test_gather_named_on_root_and_elsewhere():
    arrays = {"a": np.ones((2, 2)), "b": np.array([3.0])}
    got = gather_named(FakeComm(0, 3), arrays)
    assert got["a"].shape == (3, 2, 2) and got["b"][:, 0].tolist() == [3.0, 13.0, 23.0]
    assert gather_named(FakeComm(1, 3), arrays) is None


# ------------------------------------------------------------------ timed loop
class Tensor:
    def __init__(self, value: float = 0.0) -> None:
        self.value, self.backwards = value, 0

    def to(self, device, non_blocking=False):
        return self

    def item(self):
        return self.value

    def backward(self):
        self.backwards += 1


class Data:
    def __init__(self) -> None:
        self.reads = 0

    def next(self):
        self.reads += 1
        return Tensor(), Tensor()


class Recorder(timed.Steps):
    def __init__(self, computes=True, comm_after_backward=True) -> None:
        self.computes, self.comm_after_backward = computes, comm_after_backward
        self.calls: list[str] = []

    def forward(self, x, y):
        self.calls.append("forward")
        return Tensor(2.0)

    def begin(self):
        self.calls.append("begin")

    def backward_done(self, iteration, start, end):
        assert end >= start
        self.calls.append(f"backward_done {iteration}")

    def finish(self):
        self.calls.append("finish")

    def update(self):
        self.calls.append("update")


def test_iteration_of_a_worker_with_communication_after_backward():
    steps, data = Recorder(), Data()
    seconds, t_iter, loss = timed.timed_iteration(steps, data, 4)
    assert steps.calls == ["forward", "begin", "backward_done 4", "finish", "update"]
    assert data.reads == 1 and loss == 2.0
    assert set(seconds) == {"io", "h2d", "forward", "backward", "update", "comm_exposed"}
    assert all(s >= 0 for s in seconds.values()) and sum(seconds.values()) <= t_iter


def test_iteration_with_communication_inside_backward_and_of_a_server():
    steps = Recorder(comm_after_backward=False)                 # DDP
    seconds, _, _ = timed.timed_iteration(steps, Data(), 0)
    assert "finish" not in steps.calls and "comm_exposed" not in seconds
    assert set(seconds) == set(ph.WORK)
    server, data = Recorder(computes=False), Data()             # a parameter server
    seconds, _, loss = timed.timed_iteration(server, data, 0)
    assert server.calls == ["begin", "finish", "update"] and data.reads == 0 and math.isnan(loss)
    assert seconds["io"] == seconds["h2d"] == seconds["forward"] == seconds["backward"] == 0.0


def test_adjust_has_the_last_say():
    class Server(Recorder):
        def adjust(self, seconds):
            seconds["update"] = 0.25
    seconds, _, _ = timed.timed_iteration(Server(computes=False), Data(), 0)
    assert seconds["update"] == 0.25


def test_loop_times_every_iteration_and_reports_progress(capsys):
    comm, steps = FakeComm(0, 1), Recorder()
    t = timed.timed_loop(comm, steps, Data(), warmup=2, iters=8)
    assert comm.barriers == 2                                   # at the start and after warm-up
    assert t.phases.table.shape == (10, len(ph.PHASES)) and (t.t_iter > 0).all()
    assert t.losses.tolist() == [2.0] * 10 and t.wall_s > 0
    assert not t.phases["comm_hidden"].any()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("  iter 2/10  ") and lines[0].endswith("  loss 2.0000 (this rank)")
    assert len(lines) == 5 and lines[-1].startswith("  iter 10/10  ")
    server = timed.timed_loop(FakeComm(0, 1), Recorder(computes=False), Data(), 0, 3)
    assert np.isnan(server.losses).all()
    assert "loss" not in capsys.readouterr().err


def test_param_bytes_from_the_parameters_dtypes():
    torch = pytest.importorskip("torch")
    from ddlcomm.train.loop import param_bytes
    f32 = param_bytes([torch.zeros(3, 2), torch.zeros(4)])
    assert (f32.dtype, f32.count, f32.nbytes) == ("float32", 10, 40)
    f64 = param_bytes(torch.nn.Linear(3, 2).double().parameters())
    assert (f64.dtype, f64.count, f64.nbytes) == ("float64", 8, 64)
    half = param_bytes([torch.zeros(4, dtype=torch.float16), torch.zeros(1)])
    assert (half.dtype, half.nbytes) == ("mixed", 12)


def test_a_diverged_loss_curve_is_nan_without_a_warning():
    import warnings

    from ddlcomm.train.loop import loss_summary
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = loss_summary(np.array([[np.nan, np.nan, 2.0], [np.nan, 1.0, 2.0]]))
    assert np.isnan(s["loss"][0]) and s["loss"][1:] == [1.0, 2.0] and not s["loss_decreased"]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_replica_comparison_is_numpys_equal_nan(dtype):
    """loop.same_values against np.array_equal(equal_nan=True): every mix of equal, unequal,
    NaN on one side or both, signed zeros and infinities."""
    from ddlcomm.train.loop import same_values
    rng = np.random.default_rng(7)
    values = np.array([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan], dtype)
    for _ in range(300):
        a = rng.choice(values, size=int(rng.integers(0, 6)))
        b = a.copy()
        if a.size and rng.random() < 0.7:
            i = rng.integers(0, a.size)
            b[i] = rng.choice(values)
        assert same_values(a, b) == np.array_equal(a, b, equal_nan=True), (a, b)
