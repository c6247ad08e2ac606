"""The networks the training benchmark trains, defined here in PyTorch (no torchvision).

AlexNet, GoogLeNet (Inception v1, no auxiliary classifiers), ResNet-50 (v1.5),
MobileNet v1 and VGG-16 follow torchvision's definitions, so their trainable
parameters are exactly those :mod:`ddlcomm.workloads.models` lists (the unit
tests compare the counts); ``smallcnn`` is a two-convolution network for
32x32 images and 10 classes that learns a fixed batch in seconds on a CPU.

torch is imported when a network is built, so ``import ddlcomm.train.nets``
works without it.  Each entry of :data:`NETS` says the network's default
image size and batch per worker (small enough for a CPU), its smallest image
size, its classes, and the name of its description in ``workloads.models``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import UsageError


@dataclass(frozen=True)
class NetSpec:
    name: str
    build: Callable[[], Any]          # () -> torch.nn.Module
    image_size: int                   # default input height = width (pixels)
    min_image_size: int               # the smallest input its pooling allows
    classes: int
    batch: int                        # default images per worker per iteration (CPU-sized)
    lr: float                         # default SGD learning rate
    workload: Optional[str]           # name in ddlcomm.workloads.models (same parameters)


def _nn():
    try:
        # torch is optional: ddlcomm train says how to install it when it is missing
        import torch.nn as nn
    except ImportError:
        raise UsageError("ddlcomm train needs PyTorch", "pip install 'ddlcomm[torch]'") from None
    return nn


def _conv_bn(nn, cin: int, cout: int, k: int, stride: int = 1, padding: int = 0,
             groups: int = 1, eps: float = 1e-5, relu: bool = True):
    layers = [nn.Conv2d(cin, cout, k, stride, padding, groups=groups, bias=False),
              nn.BatchNorm2d(cout, eps=eps)]
    return nn.Sequential(*layers, nn.ReLU(inplace=True)) if relu else nn.Sequential(*layers)


# ------------------------------------------------------------------ small CNN
def smallcnn():
    """conv 3->16, pool, conv 16->32, pool, fc 2048->10 (25,578 parameters; 32x32 input)."""
    nn = _nn()
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


# ------------------------------------------------------------------ AlexNet
def alexnet(classes: int = 1000):
    nn = _nn()
    return nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d(6), nn.Flatten(),
        nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
        nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, classes))


# ------------------------------------------------------------------ VGG-16
def vgg16(classes: int = 1000):
    nn = _nn()
    layers, cin = [], 3
    for width, convs in [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]:
        for _ in range(convs):
            layers += [nn.Conv2d(cin, width, 3, padding=1), nn.ReLU(inplace=True)]
            cin = width
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(
        *layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(),
        nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
        nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5), nn.Linear(4096, classes))


# ------------------------------------------------------------------ ResNet-50
def resnet50(classes: int = 1000):
    nn = _nn()

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1 = _conv_bn(nn, cin, planes, 1)
            self.conv2 = _conv_bn(nn, planes, planes, 3, stride, 1)       # v1.5: stride here
            self.conv3 = _conv_bn(nn, planes, planes * 4, 1, relu=False)
            self.downsample = (_conv_bn(nn, cin, planes * 4, 1, stride, relu=False)
                               if stride != 1 or cin != planes * 4 else None)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(self.conv3(self.conv2(self.conv1(x))) + identity)

    layers, cin = [_conv_bn(nn, 3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, 1)], 64
    for planes, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for b in range(blocks):
            layers.append(Bottleneck(cin, planes, stride if b == 0 else 1))
            cin = planes * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


# ------------------------------------------------------------------ GoogLeNet
def googlenet(classes: int = 1000):
    nn = _nn()
    # torch is optional: imported only when the net is built (_nn checked it is there)
    import torch

    def basic(cin, cout, k, stride=1, padding=0):
        return _conv_bn(nn, cin, cout, k, stride, padding, eps=0.001)

    class Inception(nn.Module):
        def __init__(self, cin, c1, r3, c3, r5, c5, pp) -> None:
            super().__init__()
            self.branch1 = basic(cin, c1, 1)
            self.branch2 = nn.Sequential(basic(cin, r3, 1), basic(r3, c3, 3, padding=1))
            # torchvision's "5x5" branch uses a 3x3 kernel (a known quirk kept for parity).
            self.branch3 = nn.Sequential(basic(cin, r5, 1), basic(r5, c5, 3, padding=1))
            self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), basic(cin, pp, 1))

        def forward(self, x):
            return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)

    pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)          # noqa: E731
    blocks = [("3a", 192, 64, 96, 128, 16, 32, 32), ("3b", 256, 128, 128, 192, 32, 96, 64), None,
              ("4a", 480, 192, 96, 208, 16, 48, 64), ("4b", 512, 160, 112, 224, 24, 64, 64),
              ("4c", 512, 128, 128, 256, 24, 64, 64), ("4d", 512, 112, 144, 288, 32, 64, 64),
              ("4e", 528, 256, 160, 320, 32, 128, 128), None,
              ("5a", 832, 256, 160, 320, 32, 128, 128), ("5b", 832, 384, 192, 384, 48, 128, 128)]
    layers = [basic(3, 64, 7, 2, 3), pool(), basic(64, 64, 1), basic(64, 192, 3, padding=1), pool()]
    layers += [pool() if b is None else Inception(*b[1:]) for b in blocks]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                         nn.Linear(1024, classes))


# ------------------------------------------------------------------ MobileNet v1
def mobilenet(classes: int = 1000):
    nn = _nn()
    layers, cin = [_conv_bn(nn, 3, 32, 3, 2, 1)], 32
    widths = [64, 128, 128, 256, 256, 512] + [512] * 5 + [1024, 1024]
    strides = [1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1]
    for cout, stride in zip(widths, strides):
        layers += [_conv_bn(nn, cin, cin, 3, stride, 1, groups=cin), _conv_bn(nn, cin, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


NETS: dict[str, NetSpec] = {s.name: s for s in (
    NetSpec("smallcnn", smallcnn, 32, 8, 10, 128, 0.02, None),
    NetSpec("alexnet", alexnet, 224, 63, 1000, 4, 0.01, "alexnet"),
    NetSpec("googlenet", googlenet, 224, 32, 1000, 2, 0.01, "googlenet"),
    NetSpec("resnet50", resnet50, 224, 32, 1000, 2, 0.01, "resnet50"),
    NetSpec("mobilenet", mobilenet, 224, 32, 1000, 4, 0.01, "mobilenet"),
    NetSpec("vgg16", vgg16, 224, 32, 1000, 1, 0.005, "vgg16"),
)}


def get_net(name: str) -> NetSpec:
    """The network registered as ``name`` (UsageError naming the choices)."""
    spec = NETS.get(name)
    if spec is None:
        raise UsageError(f"unknown model {name!r}", f"choose one of: {', '.join(NETS)}")
    return spec


def check_image_size(spec: NetSpec, size: int) -> None:
    if size < spec.min_image_size:
        raise UsageError(f"--image-size {size} is too small for {spec.name}",
                         f"its pooling needs at least {spec.min_image_size} pixels")
