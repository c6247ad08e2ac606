"""Shi and Chu's S-SGD iteration model: closed forms, overlap, monotonicity."""
from __future__ import annotations

import functools

import pytest

from ddlcomm.errors import UsageError
from ddlcomm.model import costs, ssgd
from ddlcomm.model.ssgd import Phases, predict

PH = Phases(t_io=0.010, t_h2d=0.005, t_f=0.030, t_b=0.060, t_u=0.005)
T1 = 0.110
LAYERS = Phases(0.0, 0.0, 0.0, 3.0, 0.0, layers=((1.0, 100), (1.0, 100), (1.0, 100)))


@pytest.mark.parametrize("n", [2, 3, 16, 1024])
@pytest.mark.parametrize("t_c", [0.0, 0.02, 0.5])
def test_no_overlap_closed_form(n, t_c):
    r = predict(PH, n, t_c=t_c)
    assert r.t_iter == pytest.approx(T1 + t_c)
    assert r.speedup == pytest.approx(n * T1 / (T1 + t_c))
    assert r.efficiency == pytest.approx(T1 / (T1 + t_c))
    assert (r.exposed, r.hidden, r.t_comm) == (pytest.approx(t_c), 0.0, pytest.approx(t_c))


def test_one_worker():
    r = predict(PH, 1, t_c=1.0)
    assert (r.t_iter, r.t_comm, r.speedup, r.efficiency) == (pytest.approx(T1), 0.0, 1.0, 1.0)


def test_io_prefetch():
    # reading hides behind the rest, and only what exceeds the rest shows
    assert predict(PH, 4, t_c=0.02, overlap="io").t_iter == pytest.approx(0.100 + 0.02)
    slow_io = Phases(0.5, 0.005, 0.030, 0.060, 0.005)
    r = predict(slow_io, 4, t_c=0.02, overlap="io")
    assert r.t_iter == pytest.approx(0.5)
    assert r.speedup == pytest.approx(4.0)


def test_reader_grows_with_workers_per_node():
    # one reader for 4 GPUs: reading takes 4 t_io from 4 workers on
    r = predict(PH, 8, t_c=0.0, workers_per_node=4, io_per_node=True)
    assert r.t_iter == pytest.approx(T1 + 3 * 0.010)
    assert predict(PH, 2, t_c=0.0, workers_per_node=4, io_per_node=True).t_iter == \
        pytest.approx(T1 + 0.010)
    # prefetched, it only shows once it exceeds the rest (0.1 s)
    slow = Phases(0.03, 0.005, 0.030, 0.060, 0.005)
    assert predict(slow, 8, t_c=0.0, workers_per_node=4, io_per_node=True,
                   overlap="io").t_iter == pytest.approx(0.12)


def test_wfbp_by_hand():
    # layers ready at 1, 2, 3; 0.5 s per message: ends 1.5, 2.5, 3.5 -> 0.5 exposed
    r = predict(LAYERS, 2, comm=lambda n: 0.5, overlap="wfbp")
    assert (r.t_comm, r.exposed, r.hidden) == (pytest.approx(1.5), pytest.approx(0.5),
                                               pytest.approx(1.0))
    assert r.t_iter == pytest.approx(3.5)
    # 2 s per message: the link is the bottleneck, ends 3, 5, 7 -> 4 exposed
    r = predict(LAYERS, 2, comm=lambda n: 2.0, overlap="wfbp")
    assert (r.exposed, r.hidden) == (pytest.approx(4.0), pytest.approx(2.0))
    # t_c spread in proportion to bytes behaves the same
    r = predict(LAYERS, 2, t_c=1.5, overlap="wfbp")
    assert r.exposed == pytest.approx(0.5)


def test_wfbp_with_fusion():
    # everything in one bucket: ready at the end of the backward pass, nothing hidden
    r = predict(LAYERS, 2, comm=lambda n: n / 100, overlap="wfbp", fusion_bytes=1 << 20)
    assert (r.t_comm, r.exposed, r.hidden) == (pytest.approx(3.0), pytest.approx(3.0), 0.0)
    # buckets of 200 bytes: [200 @2, 100 @3] -> ends 4, 5 -> 2 exposed
    r = predict(LAYERS, 2, comm=lambda n: n / 100, overlap="wfbp", fusion_bytes=200)
    assert r.exposed == pytest.approx(2.0)


def test_layers_without_parameters_send_nothing():
    # each was priced as a message of 0 bytes, a latency apiece
    bare = Phases(0.0, 0.0, 0.0, 3.0, 0.0, layers=((1.0, 100), (1.0, 0), (1.0, 200), (0.0, 0)))
    for fusion in (None, 150):         # 150: the 200 bytes alone, then the last 0 apart
        assert predict(bare, 2, comm=lambda n: 1.0 + n, fusion_bytes=fusion).t_comm == 302.0
    nothing = Phases(0.0, 0.0, 0.0, 3.0, 0.0, layers=((3.0, 0),))
    assert predict(nothing, 2, comm=lambda n: 1.0).t_comm == 0


def test_io_and_wfbp():
    ph = Phases(4.0, 0.0, 0.0, 3.0, 0.0, layers=LAYERS.layers)
    assert predict(ph, 2, comm=lambda n: 0.5, overlap="io+wfbp").t_iter == pytest.approx(4.0)
    assert predict(ph, 2, comm=lambda n: 0.5, overlap="wfbp").t_iter == pytest.approx(7.5)


def test_monotonic():
    layered = Phases(0.01, 0.005, 0.03, 0.06, 0.005,
                     layers=ssgd.model_layers("resnet50", 0.06))
    for overlap in ssgd.OVERLAPS:
        prev = None
        for t_c in (0.0, 0.01, 0.05, 0.2, 1.0):
            r = predict(layered, 8, t_c=t_c, overlap=overlap)
            assert r.exposed <= r.t_comm + 1e-12 and r.hidden >= -1e-12
            assert r.speedup <= 8 + 1e-9 and r.efficiency <= 1 + 1e-12
            if prev is not None:
                assert r.t_iter >= prev.t_iter - 1e-12          # more comm never helps
            prev = r
        nov = predict(layered, 8, t_c=0.05)
        assert predict(layered, 8, t_c=0.05, overlap=overlap).t_iter <= nov.t_iter + 1e-12
    # with a cost model, more workers never make an iteration faster
    p = costs.Params(5e-6, 1e-10, 1e-10)
    times = [predict(layered, n, comm=functools.partial(costs.allreduce_time, p, "ring", n),
                     overlap="wfbp").t_iter for n in (2, 4, 16, 256, 1024)]
    assert times == sorted(times)


def test_model_layers_sum():
    layers = ssgd.model_layers("alexnet", 0.1)
    assert sum(t for t, _ in layers) == pytest.approx(0.1)
    assert sum(b for _, b in layers) == 4 * 61_100_840


def test_sweep():
    out = ssgd.sweep(PH, [1, 2, 4], t_c=0.01)
    assert [r.workers for r in out] == [1, 2, 4]
    out = ssgd.sweep(LAYERS, [1, 2], comm_at=lambda n: (lambda b: 0.001 * n))
    assert out[1].t_comm == pytest.approx(3 * 0.002)


def test_errors():
    with pytest.raises(UsageError, match="one of them"):
        predict(PH, 2)
    with pytest.raises(UsageError, match="one of them"):
        predict(PH, 2, t_c=1.0, comm=lambda n: 1.0)
    with pytest.raises(UsageError, match="wfbp"):
        predict(PH, 2, t_c=1.0, overlap="wfbp")
    with pytest.raises(UsageError, match="overlap"):
        predict(PH, 2, t_c=1.0, overlap="sometimes")
    with pytest.raises(UsageError, match="workers"):
        predict(PH, 0, t_c=1.0)
    with pytest.raises(UsageError, match="t_b"):
        Phases(0.0, 0.0, 0.0, -1.0, 0.0)
    with pytest.raises(UsageError, match="layer 0"):
        Phases(0.0, 0.0, 0.0, 1.0, 0.0, layers=((1.0, -5),))


def test_layer_times_are_scaled_to_the_backward_pass():
    """Layers whose backward times summed past t_b gave a negative hidden time (exposed >
    t_comm); below t_b, everything was hidden.  Their times give the pass's shape only."""
    layers = ((0.5, 1_000_000), (0.5, 2_000_000))
    shaped = ((0.03, 1_000_000), (0.03, 2_000_000))
    for scale in (1.0, 1e-3):
        got = ssgd.predict(Phases(0.01, 0.005, 0.03, 0.06, 0.005, tuple((t * scale, b) for t, b in layers)),
                           2, t_c=0.01, overlap="wfbp")
        want = ssgd.predict(Phases(0.01, 0.005, 0.03, 0.06, 0.005, shaped), 2, t_c=0.01, overlap="wfbp")
        assert got == want and 0 <= got.hidden <= got.t_comm
