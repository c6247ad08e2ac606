"""Whether a training job fits in its hosts' memory, and its batches the networks'
BatchNorm: checked in the ranks, once they meet.

What a rank needs is a lower bound: :func:`ddlcomm.train.config.host_bytes` (a batch's
images; the network's parameters, gradients and momentum where it lives in host memory)
and, on a worker training on the CPU, the outputs of the network's convolutions and
linear layers for the batch, which autograd keeps for the backward pass (measured on
torch's meta device: shapes only, no memory).  What ReLU's and pooling's outputs, the
gradients of activations and torch itself add comes on top.  A host's ranks are counted
together: the command's own check counts every rank on its machine, but under a launcher
of yours they may be spread over hosts.  Every rank sees every host's figures, so every
rank refuses alike (:class:`EveryRankError`) and rank 0 says why.
"""
from __future__ import annotations

import functools
import socket
from typing import Sequence

from ..bench.plan import mem_available
from ..errors import EveryRankError
from ..units import about_size, counted, format_size
from .config import TrainConfig, host_bytes
from .nets import get_net

#: The networks keep less than this many bytes of activations (the outputs counted by
#: :func:`activation_bytes`) per byte of input image (vgg16: 90; tests/unit/test_train_nets.py
#: checks every network): where even this many fit, the meta-device pass (1.3 s on its first
#: call, most of it torch importing ``torch._dynamo`` for Linear's meta decomposition) is
#: skipped.
ACTIVATIONS_PER_INPUT_BYTE = 128


@functools.lru_cache(maxsize=None)
def activation_bytes(model: str, image_size: int) -> int:
    """Bytes of float32 the outputs of ``model``'s convolutions and linear layers take for one
    image of ``image_size`` pixels a side."""
    # torch: imported by the ranks that train, never by the command that checks its options
    import torch

    with torch.device("meta"):
        net = get_net(model).build().eval()       # (batch norm takes one image in eval mode)
    outputs = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: outputs.append(out.numel()))
             for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        net(torch.empty(1, 3, image_size, image_size, device="meta"))
    for hook in hooks:
        hook.remove()
    return 4 * sum(outputs)


def check_batch_norm(configs: Sequence[TrainConfig]) -> None:
    """Refuse, in every rank alike before any trains, a batch of one image that leaves some
    BatchNorm of the network one value per channel (torch refused it in rank 0's first pass
    alone, the others waiting for it; with 2 images or more it never does)."""
    for cfg in configs:
        if cfg.batch == 1 and _one_value_per_channel(cfg.model, cfg.image_size):
            raise EveryRankError(f"{cfg.model} at batch 1 and {cfg.image_size}x{cfg.image_size} "
                                 "leaves BatchNorm one value per channel",
                                 "use --batch 2 or more, or a larger --image-size")


@functools.lru_cache(maxsize=None)
def _one_value_per_channel(model: str, image_size: int) -> bool:
    """Whether a training forward pass of one image leaves a BatchNorm one value per channel
    (on torch's meta device: shapes only)."""
    # torch: imported by the ranks that train, never by the command that checks its options
    import torch

    with torch.device("meta"):
        net = get_net(model).build().train()
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        return False
    try:
        with torch.no_grad():
            net(torch.empty(1, 3, image_size, image_size, device="meta"))
    except ValueError as exc:
        if "value per channel" not in str(exc):
            raise
        return True
    return False


def rank_needs(cfg: TrainConfig, worker: bool) -> tuple[int, int]:
    """(what a rank needs at least, what it would need if its activations were as large as
    :data:`ACTIVATIONS_PER_INPUT_BYTE` allows): the second is the cheap upper one."""
    images, state = host_bytes(cfg)
    if not worker or cfg.device != "cpu":
        return images + state, images + state
    return images + state, images * (1 + ACTIVATIONS_PER_INPUT_BYTE) + state


def worst_host(rows: Sequence[tuple[str, int, Sequence[int]]]) -> tuple[str, int, int, int, int]:
    """(host, configuration, need, available, ranks) where a host's ranks need the largest share
    of its memory; ``rows``: each rank's (host, available bytes, its need in each
    configuration, in the order every rank has them)."""
    hosts: dict[str, tuple[int, list[int], int]] = {}
    for host, available, needs in rows:
        least, total, ranks = hosts.get(host, (available, [0] * len(needs), 0))
        hosts[host] = (min(least, available), [a + b for a, b in zip(total, needs)], ranks + 1)
    host, (available, total, ranks) = max(
        hosts.items(), key=lambda item: max(item[1][1]) / max(item[1][0], 1))
    worst = max(range(len(total)), key=total.__getitem__)
    return host, worst, total[worst], available, ranks


def check_hosts(comm, configs: Sequence[TrainConfig]) -> None:
    """Refuse, in every rank alike, a job some host cannot hold (see the module)."""
    bounds = [rank_needs(cfg, worker=not (cfg.arch == "ps" and comm.rank == 0)) for cfg in configs]
    here = (socket.gethostname(), mem_available())
    _, _, need, available, _ = worst_host(comm.allgather_object((*here, [hi for _, hi in bounds])))
    if need <= available:
        return                                 # it fits even with the most activations can take
    needs = [lo + (cfg.batch * activation_bytes(cfg.model, cfg.image_size) if hi > lo else 0)
             for cfg, (lo, hi) in zip(configs, bounds)]
    host, worst, need, available, ranks = worst_host(comm.allgather_object((*here, needs)))
    if need > available:
        cfg = configs[worst]
        raise EveryRankError(
            f"training needs at least {about_size(need)} on {host}: {counted(ranks, 'rank')} "
            f"of {cfg.label()} at {cfg.image_size}x{cfg.image_size} (the images, the activations "
            f"kept for the backward pass, the parameters, gradients and momentum), more than "
            f"its {format_size(available)} available",
            "use a smaller --batch or --image-size, or fewer ranks a host")
