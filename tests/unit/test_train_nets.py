"""The torch networks have exactly the parameters workloads/models.py describes."""
from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from ddlcomm.errors import UsageError  # noqa: E402
from ddlcomm.train import fits, nets  # noqa: E402
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


@pytest.mark.parametrize("name", list(nets.NETS))
def test_activations_stay_under_the_bound_the_ranks_skip_by(name):
    """train.fits skips its meta-device pass where even ACTIVATIONS_PER_INPUT_BYTE fits:
    every network keeps less than that, at the smallest image and at 224."""
    spec = nets.get_net(name)
    for size in (spec.min_image_size, 224):
        kept = fits.activation_bytes(name, size)
        assert 0 < kept < fits.ACTIVATIONS_PER_INPUT_BYTE * 3 * size * size * 4, (size, kept)
    # vgg16's convolutions at 224: 64x224x224 twice, 128x112x112 twice, ... (13.5 M floats)
    if name == "vgg16":
        assert fits.activation_bytes(name, 224) == 4 * (2 * 64 * 224 ** 2 + 2 * 128 * 112 ** 2 + 3 * 256
                                                        * 56 ** 2 + 3 * 512 * 28 ** 2 + 3 * 512 * 14 ** 2
                                                        + 4096 + 4096 + 1000)


def test_a_hosts_ranks_are_counted_together():
    rows = [("a", 100, [10, 50]), ("a", 90, [10, 50]), ("b", 100, [80, 0])]
    assert fits.worst_host(rows) == ("a", 1, 100, 90, 2)      # the least either rank saw
    assert fits.worst_host([("b", 100, [80, 0])]) == ("b", 0, 80, 100, 1)


def test_what_a_rank_needs_at_least():
    from ddlcomm.train.config import STATE_COPIES, TrainConfig
    cfg = TrainConfig(model="vgg16", batch=2, image_size=224)
    images, state = 2 * 3 * 224 * 224 * 4, STATE_COPIES * 4 * models.total_parameters("vgg16")
    assert fits.rank_needs(cfg, worker=True) == (images + state,
                                                 images * (1 + fits.ACTIVATIONS_PER_INPUT_BYTE) + state)
    assert fits.rank_needs(cfg, worker=False) == (images + state,) * 2     # the parameter server
    on_gpu = TrainConfig(model="vgg16", batch=2, image_size=224, device="cuda")
    assert fits.rank_needs(on_gpu, worker=True) == (images, images)        # its network lives there


def test_a_batch_of_one_too_small_for_batchnorm_is_refused_by_every_rank():
    """Refused in rank 0's first pass alone, while the others waited: the job aborted."""
    from ddlcomm.errors import EveryRankError
    from ddlcomm.train.config import TrainConfig
    with pytest.raises(EveryRankError, match="googlenet at batch 1 and 48x48 leaves BatchNorm "
                                             "one value per channel"):
        fits.check_batch_norm([TrainConfig(model="smallcnn", batch=1, image_size=32),
                               TrainConfig(model="googlenet", batch=1, image_size=48)])
    fits.check_batch_norm([TrainConfig(model="googlenet", batch=2, image_size=48),
                           TrainConfig(model="googlenet", batch=1, image_size=64),
                           TrainConfig(model="smallcnn", batch=1, image_size=32)])
