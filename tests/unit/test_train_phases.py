"""The pure arithmetic of the training benchmark: phases by name, buckets, layer times,
hidden communication, the cost function, critical path, speed-up."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ddlcomm.errors import UsageError
from ddlcomm.measure.stats import relative_error
from ddlcomm.report.train import STACK
from ddlcomm.train import phases as ph
from ddlcomm.workloads import models


def test_phases_by_name():
    assert [ph.phase_index(p) for p in ph.PHASES] == list(range(len(ph.PHASES)))
    assert set(ph.WORK) < set(ph.PHASES)
    # the report's stacked breakdown: a worker's own work, then what it waited for
    assert [key for key, _, _ in STACK] == [*ph.WORK, "comm_exposed"]
    with pytest.raises(ValueError, match="no phase 'comm'"):
        ph.phase_index("comm")
    t = ph.PhaseTimes(3)
    t.record(1, io=0.5, update=2.0)
    t["comm_exposed"] = [1.0, 2.0, 3.0]
    t["update"] += 1.0                                 # a view: in place
    assert t.table.shape == (3, len(ph.PHASES))
    assert t["io"].tolist() == [0.0, 0.5, 0.0] and t["update"].tolist() == [1.0, 3.0, 1.0]
    assert t.table[:, ph.PHASES.index("comm_exposed")].tolist() == [1.0, 2.0, 3.0]
    assert not t["comm_hidden"].any()                  # never recorded: 0
    with pytest.raises(ValueError):
        t.record(0, compute=1.0)


def test_buckets_follow_the_fusion_rule():
    assert ph.buckets([4, 4, 30, 2, 2, 2], 8) == [[0, 1], [2], [3, 4, 5]]
    assert ph.buckets([1, 2, 3], 0) == [[0], [1], [2]]          # 0: one per gradient
    assert ph.buckets([5, 5, 5], 1 << 20) == [[0, 1, 2]]
    assert ph.buckets([], 8) == []


def test_buckets_match_workloads_fuse_on_resnet50():
    sizes = [b for _, b in models.gradient_sizes("resnet50", 4)]
    groups = ph.buckets(sizes, 25 << 20)
    assert [sum(sizes[i] for i in g) for g in groups] == models.fuse(sizes, 25 << 20)
    assert [i for g in groups for i in g] == list(range(len(sizes)))   # each once, in order
    assert len(groups) == 5


def test_layer_times_add_up_to_backward():
    assert ph.layer_times([1.0, 1.5, 3.0], 0.5, 3.2) == pytest.approx([0.5, 0.5, 1.7])
    assert ph.layer_times([], 0.0, 1.0) == []
    # a hook seen before backward "started" (clock jitter) never gives a negative time
    assert min(ph.layer_times([0.9, 1.2], 1.0, 1.5)) >= 0


def test_hidden_is_cost_alone_minus_exposed_never_negative():
    assert ph.hidden(0.2, 0.05) == pytest.approx(0.15)
    assert ph.hidden(0.1, 0.3) == 0.0
    # one bucket, started by the last gradient 0.001 s before backward ended: 1.6 ms of
    # "hidden" came from the two measurements' difference alone
    assert ph.hidden(0.0043, 0.0027, 0.001) == pytest.approx(0.001)


def test_comm_function_exact_sizes_and_fit():
    f = ph.comm_function([(100, 1.0), (200, 1.5), (400, 2.5), (100, 3.0)])
    assert f(100) == pytest.approx(2.0)                 # median of the measurements at 100
    assert f(300) == pytest.approx(f.alpha + f.beta * 300)
    assert f.alpha >= 0 and f.beta >= 0
    one = ph.comm_function([(1000, 0.01)])              # one size: through the origin
    assert one(2000) == pytest.approx(0.02) and one(1000) == 0.01
    neg = ph.comm_function([(100, 5.0), (200, 1.0)])    # a falling line is clipped to >= 0
    assert neg.alpha >= 0 and neg.beta >= 0
    with pytest.raises(UsageError):
        ph.comm_function([])


def test_speedup_and_efficiency():
    assert ph.speedup(4, 1.0, 1.25) == pytest.approx(3.2)
    assert ph.efficiency(4, 1.0, 1.25) == pytest.approx(0.8)
    assert ph.speedup(1, 1.0, 1.0) == 1.0
    assert math.isnan(ph.speedup(2, 1.0, 0.0))
    assert ph.images_per_s(2, 32, 0.5) == 128


def test_mean_and_critical_phases():
    # 2 workers, 2 iterations of 7 each: worker 1 works longer on average (4.5 against 3.5)
    t = np.zeros((2, 2, len(ph.PHASES)))
    t[0, 0, :6] = [0, 0, 1, 1, 0, 5]        # waited 5 for worker 1
    t[1, 0, :6] = [0, 0, 3, 3, 0, 1]
    t[0, 1, :6] = [0, 0, 2, 3, 0, 2]
    t[1, 1, :6] = [0, 0, 1, 2, 0, 4]
    mean = ph.mean_phases(t)
    assert mean["forward"] == pytest.approx(7 / 4) and mean["comm_exposed"] == pytest.approx(12 / 4)
    crit = ph.critical_phases(t)
    assert crit["forward"] == pytest.approx(2.0) and crit["backward"] == pytest.approx(2.5)
    assert crit["comm_exposed"] == pytest.approx(2.5)
    assert sum(crit.values()) == pytest.approx(7.0)
    with pytest.raises(ValueError):
        ph.mean_phases(np.zeros((2, 2, 3)))


def test_critical_phases_add_up_to_an_iteration_when_workers_start_apart():
    """Iterations of 9 then 5 on one worker, 5 then 9 on the other (7 each, on average):
    the slowest of each iteration added up to 9."""
    t = np.zeros((2, 2, len(ph.PHASES)))
    t[0, 0, :6], t[0, 1, :6] = [0, 0, 4, 4, 0, 1], [0, 0, 2, 2, 0, 1]
    t[1, 0, :6], t[1, 1, :6] = [0, 0, 2, 2, 0, 1], [0, 0, 4, 4.5, 0, 0.5]
    crit = ph.critical_phases(t)
    assert sum(crit.values()) == pytest.approx(7.0) and crit["backward"] == pytest.approx(3.25)


def test_scale_to():
    assert ph.scale_to([1, 3], 2.0) == pytest.approx([0.5, 1.5])
    assert ph.scale_to([0, 0], 2.0) == [0.0, 0.0]


def test_relative_error():
    assert relative_error(2.0, 2.2) == pytest.approx(0.1)
    assert relative_error(0.2, 0.18) == pytest.approx(-0.1)
    assert relative_error(0.2, None) is None and relative_error(0.0, 1.0) is None
    assert relative_error(1.0, math.inf) is None and relative_error(math.nan, 1.0) is None
