"""Tests of the CNN gradient-size models and tensor fusion (ddlcomm.workloads.models)."""
from __future__ import annotations

import pytest

from ddlcomm.errors import UsageError
from ddlcomm.workloads.models import (MODELS, Tensor, fuse, gradient_sizes, parameters, per_layer,
                                      total_parameters)

MiB = 1 << 20
TOTALS = {
    "alexnet": 61_100_840, "googlenet": 6_624_904, "resnet50": 25_557_032,
    "mobilenet": 4_231_976, "vgg16": 138_357_544,
}
LAYERS = {"alexnet": 8, "googlenet": 58, "resnet50": 54, "mobilenet": 28, "vgg16": 16}
LAST_LAYER = {"alexnet": "fc8", "googlenet": "fc", "resnet50": "fc", "mobilenet": "fc", "vgg16": "fc8"}


def test_registry_holds_the_five_models():
    assert set(MODELS) == set(TOTALS)


@pytest.mark.parametrize("model, total", TOTALS.items())
def test_total_parameters_match_the_reference_definitions(model, total):
    assert total_parameters(model) == total


@pytest.mark.parametrize("model, lo, hi", [
    ("resnet50", 25.5e6, 25.6e6), ("alexnet", 61.0e6, 61.2e6), ("vgg16", 138.3e6, 138.4e6),
    ("googlenet", 6.6e6, 7.0e6), ("mobilenet", 4.2e6, 4.3e6),
])
def test_totals_in_published_ranges(model, lo, hi):
    assert lo <= total_parameters(model) <= hi


def test_tensor_numel_and_layer():
    t = Tensor("layer1.0.conv1.weight", (64, 3, 7, 7))
    assert t.numel == 64 * 3 * 7 * 7 and t.layer == "layer1.0.conv1"
    assert Tensor("x", (5,)).layer == "x"


@pytest.mark.parametrize("model", TOTALS)
def test_parameters_forward_order_and_unique_names(model):
    params = parameters(model)
    names = [t.name for t in params]
    assert len(names) == len(set(names))
    assert params[0].shape[1] == 3  # the first conv reads the RGB image
    assert params[-1].shape == (1000,) and params[-2].shape[0] == 1000  # classifier last


@pytest.mark.parametrize("model", TOTALS)
@pytest.mark.parametrize("itemsize", [2, 4])
def test_gradient_sizes_sum_to_total_bytes_in_backward_order(model, itemsize):
    sizes = gradient_sizes(model, itemsize)
    assert sum(n for _, n in sizes) == TOTALS[model] * itemsize
    assert sizes[0][0].startswith(LAST_LAYER[model] + ".")
    assert [name for name, _ in sizes] == [t.name for t in reversed(parameters(model))]


@pytest.mark.parametrize("model", TOTALS)
def test_per_layer_groups_weight_bias_and_bn(model):
    layers = per_layer(model, 4)
    assert len(layers) == LAYERS[model]
    assert layers[0][0] == LAST_LAYER[model]
    assert sum(n for _, n in layers) == TOTALS[model] * 4


def test_per_layer_resnet50_details():
    layers = dict(per_layer("resnet50", 4))
    assert layers["fc"] == (2048 * 1000 + 1000) * 4
    assert layers["conv1"] == (64 * 3 * 7 * 7 + 2 * 64) * 4  # conv (no bias) + BN gamma/beta
    assert layers["layer1.0.downsample"] == (256 * 64 + 2 * 256) * 4
    assert sum(".downsample" in name for name in layers) == 4
    assert list(layers)[-1] == "conv1"


def test_mobilenet_depthwise_shape():
    shapes = {t.name: t.shape for t in parameters("mobilenet")}
    assert shapes["block1.dw.weight"] == (32, 1, 3, 3)
    assert shapes["block1.pw.weight"] == (64, 32, 1, 1)


@pytest.mark.parametrize("itemsize", [0, -4])
def test_bad_itemsize(itemsize):
    with pytest.raises(UsageError, match="item size"):
        gradient_sizes("resnet50", itemsize)
    with pytest.raises(UsageError, match="item size"):
        per_layer("resnet50", itemsize)


def test_unknown_model_lists_choices():
    with pytest.raises(UsageError) as err:
        parameters("resnet51")
    message = str(err.value)
    assert "'resnet51'" in message
    assert all(name in message for name in TOTALS)
    with pytest.raises(UsageError):
        total_parameters("bert")


def test_fuse_packs_up_to_threshold():
    assert fuse([4, 4, 4, 4, 4], 8) == [8, 8, 4]
    assert fuse([3, 3, 3], 9) == [9]  # exactly at the threshold fits
    assert fuse([5, 4, 2], 8) == [5, 6]


def test_fuse_big_tensor_goes_alone_and_order_is_kept():
    assert fuse([1, 2, 100, 3, 4], 10) == [3, 100, 7]
    assert fuse([100], 10) == [100]
    assert fuse([1, 100, 1], 10) == [1, 100, 1]


def test_fuse_zero_threshold_means_no_fusion():
    sizes = [n for _, n in gradient_sizes("alexnet", 4)]
    assert fuse(sizes, 0) == sizes


def test_fuse_empty_and_zero_sized():
    assert fuse([], 10) == []
    assert fuse([0, 0], 10) == [0]


@pytest.mark.parametrize("model", TOTALS)
@pytest.mark.parametrize("threshold", [0, 1, 64 * 1024, 25 * MiB, 64 * MiB, 1 << 40])
def test_fuse_preserves_total_and_respects_threshold(model, threshold):
    sizes = [n for _, n in gradient_sizes(model, 4)]
    buckets = fuse(sizes, threshold)
    assert sum(buckets) == sum(sizes)
    if threshold:
        # every bucket fits, or is a single gradient bigger than the threshold
        assert all(b <= threshold or b in sizes for b in buckets)
        assert len(buckets) <= len(sizes)
    if threshold == 1 << 40:
        assert buckets == [sum(sizes)]


def test_fuse_resnet50_25mib_bucket_count():
    buckets = fuse([n for _, n in gradient_sizes("resnet50", 4)], 25 * MiB)
    assert len(buckets) == 5 and max(buckets) <= 25 * MiB  # 97.5 MiB of float32 gradients


@pytest.mark.parametrize("threshold", [-1, -25 * MiB])
def test_fuse_negative_threshold(threshold):
    with pytest.raises(UsageError, match="fusion threshold"):
        fuse([1, 2], threshold)


def test_fuse_negative_size():
    with pytest.raises(UsageError):
        fuse([1, -2], 10)


def test_a_workloads_fusion_0_sends_a_message_per_tensor():
    """--fusion 0 ('0: per tensor', its help says) read as no --fusion: a message per layer
    (ResNet-50: 54 messages, not its 161 tensors)."""
    from types import SimpleNamespace
    from ddlcomm.workloads.base import message_bytes
    from ddlcomm.workloads import models
    plan = lambda fusion: SimpleNamespace(model="resnet50", dtype="float32", fusion=fusion)  # noqa: E731
    tensors = len(models.gradient_sizes("resnet50", 4))
    assert len(message_bytes(plan(0), 0)) == tensors > len(message_bytes(plan(None), 0))
    assert len(message_bytes(plan(None), 0)) == len(models.per_layer("resnet50", 4))
