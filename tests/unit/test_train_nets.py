"""The torch networks have exactly the parameters workloads/models.py describes."""
from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from ddlcomm.errors import UsageError  # noqa: E402
from ddlcomm.train import nets  # noqa: E402
from ddlcomm.workloads import models  # noqa: E402

BIG = [name for name, spec in nets.NETS.items() if spec.workload]


def test_every_workload_model_has_a_network():
    assert sorted(BIG) == sorted(models.MODELS)


@pytest.mark.parametrize("name", BIG)
def test_parameter_counts_and_shapes_match(name):
    spec = nets.get_net(name)
    net = spec.build()
    total = sum(p.numel() for p in net.parameters())
    assert total == models.total_parameters(spec.workload)
    # the same tensors, shape for shape (names differ: torch's vs the table's)
    ours = Counter(tuple(p.shape) for p in net.parameters())
    theirs = Counter(t.shape for t in models.parameters(spec.workload))
    assert ours == theirs


@pytest.mark.parametrize("name", list(nets.NETS))
def test_forward_at_the_smallest_image(name):
    spec = nets.get_net(name)
    net = spec.build().eval()
    with torch.no_grad():
        out = net(torch.randn(1, 3, spec.min_image_size, spec.min_image_size))
    assert tuple(out.shape) == (1, spec.classes)


def test_smallcnn_is_small():
    assert sum(p.numel() for p in nets.smallcnn().parameters()) == 25_578


def test_errors():
    with pytest.raises(UsageError, match="unknown model"):
        nets.get_net("resnet18")
    with pytest.raises(UsageError, match="too small"):
        nets.check_image_size(nets.get_net("alexnet"), 32)
