"""Per-layer parameter shapes of standard ImageNet CNNs, without torch.

A data-parallel training step all-reduces (or pushes to a parameter server) one
gradient per parameter tensor, in the order back-propagation produces them:
last layer first.  This module describes each model once as a list of
:class:`Tensor` shapes built from small helpers, so the benchmark can send the
same messages a real step sends, one per tensor, one per layer, or fused into
buckets the way Horovod's tensor fusion does (:func:`fuse`).

Naming: a layer's tensors share the name up to the last dot (``conv1.weight``,
``conv1.bias``; a batch norm after a conv takes the conv's name:
``conv1.gamma``, ``conv1.beta``), which is how :func:`per_layer` groups them.
Only trainable parameters count (BN running statistics are buffers, not sent).

Totals (1000 classes): AlexNet 61,100,840; VGG-16 138,357,544; ResNet-50
25,557,032; GoogLeNet 6,624,904 (torchvision, no auxiliary classifiers);
MobileNet v1 4,231,976.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import UsageError

CLASSES = 1000


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor: its name and shape (elements per dimension)."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def layer(self) -> str:
        """The layer the tensor belongs to: its name up to the last dot."""
        return self.name.rpartition(".")[0] or self.name


MODELS: dict[str, Callable[[], list[Tensor]]] = {}


def _register(name: str) -> Callable[[Callable[[], list[Tensor]]], Callable[[], list[Tensor]]]:
    def deco(build: Callable[[], list[Tensor]]) -> Callable[[], list[Tensor]]:
        MODELS[name] = build
        return build
    return deco


# -- layer helpers ------------------------------------------------------------

def conv(name: str, cin: int, cout: int, k: int, bias: bool = True, groups: int = 1) -> list[Tensor]:
    """A ``k`` x ``k`` convolution (``groups == cin`` for a depthwise one)."""
    out = [Tensor(f"{name}.weight", (cout, cin // groups, k, k))]
    return out + [Tensor(f"{name}.bias", (cout,))] if bias else out


def bn(name: str, c: int) -> list[Tensor]:
    """Batch norm's scale and shift over ``c`` channels."""
    return [Tensor(f"{name}.gamma", (c,)), Tensor(f"{name}.beta", (c,))]


def conv_bn(name: str, cin: int, cout: int, k: int, groups: int = 1) -> list[Tensor]:
    """A convolution without bias followed by batch norm (one layer)."""
    return conv(name, cin, cout, k, bias=False, groups=groups) + bn(name, cout)


def fc(name: str, fin: int, fout: int) -> list[Tensor]:
    """A fully connected layer with bias (torch's ``(out, in)`` weight layout)."""
    return [Tensor(f"{name}.weight", (fout, fin)), Tensor(f"{name}.bias", (fout,))]


# -- architectures (forward order) --------------------------------------------

@_register("alexnet")
def alexnet() -> list[Tensor]:
    """AlexNet as torchvision defines it (single-tower, 64-192-384-256-256)."""
    out: list[Tensor] = []
    cin = 3
    for i, (cout, k) in enumerate([(64, 11), (192, 5), (384, 3), (256, 3), (256, 3)], 1):
        out += conv(f"conv{i}", cin, cout, k)
        cin = cout
    return out + fc("fc6", cin * 6 * 6, 4096) + fc("fc7", 4096, 4096) + fc("fc8", 4096, CLASSES)


@_register("googlenet")
def googlenet() -> list[Tensor]:
    """GoogLeNet (Inception v1) as torchvision defines it, no auxiliary classifiers.

    Like torchvision, the "5x5" branch uses a 3x3 kernel.
    """
    out = conv_bn("conv1", 3, 64, 7) + conv_bn("conv2", 64, 64, 1) + conv_bn("conv3", 64, 192, 3)
    blocks = {  # name: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj)
        "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
        "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
        "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
        "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
        "5b": (384, 192, 384, 48, 128, 128),
    }
    cin = 192
    for block, (c1, r3, c3, r5, c5, pp) in blocks.items():
        p = f"inception{block}"
        out += conv_bn(f"{p}.branch1", cin, c1, 1)
        out += conv_bn(f"{p}.branch2.0", cin, r3, 1) + conv_bn(f"{p}.branch2.1", r3, c3, 3)
        out += conv_bn(f"{p}.branch3.0", cin, r5, 1) + conv_bn(f"{p}.branch3.1", r5, c5, 3)
        out += conv_bn(f"{p}.branch4.1", cin, pp, 1)
        cin = c1 + c3 + c5 + pp
    return out + fc("fc", cin, CLASSES)


@_register("resnet50")
def resnet50() -> list[Tensor]:
    """ResNet-50 v1.5 (torchvision): bottleneck stages [3, 4, 6, 3], expansion 4."""
    out = conv_bn("conv1", 3, 64, 7)
    cin = 64
    for stage, (planes, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3]), 1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            out += conv_bn(f"{p}.conv1", cin, planes, 1) + conv_bn(f"{p}.conv2", planes, planes, 3)
            out += conv_bn(f"{p}.conv3", planes, planes * 4, 1)
            if b == 0:  # the first block of a stage changes width (and stride): projection shortcut
                out += conv_bn(f"{p}.downsample", cin, planes * 4, 1)
            cin = planes * 4
    return out + fc("fc", cin, CLASSES)


@_register("mobilenet")
def mobilenet() -> list[Tensor]:
    """MobileNet v1 (width 1.0): a 3x3 conv then 13 depthwise separable blocks."""
    out = conv_bn("conv0", 3, 32, 3)
    cin = 32
    widths = [64, 128, 128, 256, 256, 512] + [512] * 5 + [1024, 1024]
    for i, cout in enumerate(widths, 1):
        out += conv_bn(f"block{i}.dw", cin, cin, 3, groups=cin) + conv_bn(f"block{i}.pw", cin, cout, 1)
        cin = cout
    return out + fc("fc", cin, CLASSES)


@_register("vgg16")
def vgg16() -> list[Tensor]:
    """VGG-16 (configuration D, no batch norm)."""
    out: list[Tensor] = []
    cin = 3
    for stage, (width, convs) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], 1):
        for i in range(1, convs + 1):
            out += conv(f"conv{stage}_{i}", cin, width, 3)
            cin = width
    return out + fc("fc6", cin * 7 * 7, 4096) + fc("fc7", 4096, 4096) + fc("fc8", 4096, CLASSES)


# -- queries ------------------------------------------------------------------

def parameters(model: str) -> list[Tensor]:
    """The model's parameter tensors in forward order (the order layers are defined)."""
    build = MODELS.get(model)
    if build is None:
        raise UsageError(f"unknown model {model!r}", f"choose one of: {', '.join(MODELS)}")
    return build()


def total_parameters(model: str) -> int:
    """Number of trainable parameters (elements) of ``model``."""
    return sum(t.numel for t in parameters(model))


def _check_itemsize(itemsize: int) -> None:
    if itemsize <= 0:
        raise UsageError(f"item size must be at least 1 byte, got {itemsize}",
                         "use the dtype's size, e.g. 4 for float32")


def gradient_sizes(model: str, itemsize: int) -> list[tuple[str, int]]:
    """``(tensor name, bytes)`` per gradient, in backward order (last layer first).

    ``itemsize`` is bytes per element (4 for float32, 2 for float16).
    """
    _check_itemsize(itemsize)
    return [(t.name, t.numel * itemsize) for t in reversed(parameters(model))]


def per_layer(model: str, itemsize: int) -> list[tuple[str, int]]:
    """``(layer name, bytes)``: gradients of one layer summed, in backward order.

    A layer is a conv or FC's weight and bias plus its batch norm's scale and shift.
    """
    _check_itemsize(itemsize)
    layers: dict[str, int] = {}
    for t in reversed(parameters(model)):
        layers[t.layer] = layers.get(t.layer, 0) + t.numel * itemsize
    return list(layers.items())


def fuse(sizes: Sequence[int], fusion_bytes: int) -> list[int]:
    """Pack consecutive gradients into buckets of at most ``fusion_bytes`` bytes.

    Sizes (bytes) are taken in the given order and a bucket is sent once the next
    gradient would not fit, as Horovod's tensor fusion does; a gradient larger
    than the threshold goes alone.  ``fusion_bytes == 0`` disables fusion (one
    message per gradient).  Returns bucket sizes in bytes, in order; their sum
    equals ``sum(sizes)``.
    """
    if fusion_bytes < 0:
        raise UsageError(f"fusion threshold must be at least 0 bytes, got {fusion_bytes}",
                         "give 0 for no fusion or a size such as 25MiB")
    if any(s < 0 for s in sizes):
        raise UsageError("gradient sizes must be at least 0 bytes")
    if fusion_bytes == 0:
        return list(sizes)
    buckets: list[int] = []
    current, count = 0, 0
    for size in sizes:
        if count and current + size > fusion_bytes:
            buckets.append(current)
            current, count = 0, 0
        current, count = current + size, count + 1
    if count:
        buckets.append(current)
    return buckets
