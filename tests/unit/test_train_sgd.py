"""ddlcomm's SGD against torch.optim.SGD: the same parameters, bit for bit, on either of
torch's paths; and built and stepped without importing torch._dynamo."""
from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from ddlcomm.train.sgd import SGD  # noqa: E402  (after the skip: torch is optional)

LR, MOMENTUM = 0.05, 0.9


def _params(dtypes=(torch.float32,)) -> list:
    """A few parameters of the shapes a network has (and, as asked, of other dtypes)."""
    gen = torch.Generator().manual_seed(7)
    shapes = [(8, 3, 3, 3), (8,), (10, 72), (10,)]
    return [torch.nn.Parameter(torch.randn(shape, generator=gen, dtype=dtypes[i % len(dtypes)]))
            for i, shape in enumerate(shapes)]


def _train(params: list, opt, steps: int = 5) -> list:
    """``steps`` steps of seeded gradients, the parameters after each.  As layers that took
    no part: the third parameter has no gradient at the first step (so at the second, one
    parameter has no momentum yet), the fourth none at the third."""
    gen = torch.Generator().manual_seed(11)
    after = []
    for step in range(steps):
        for i, p in enumerate(params):
            g = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.grad = None if (step, i) in ((0, 2), (2, 3)) else g
        opt.step()
        opt.zero_grad()
        after.append([p.detach().clone() for p in params])
    return after


def _same_as_torch(dtypes, foreach) -> None:
    ours, theirs = _params(dtypes), _params(dtypes)
    got = _train(ours, SGD(ours, lr=LR, momentum=MOMENTUM, foreach=foreach))
    want = _train(theirs, torch.optim.SGD(theirs, lr=LR, momentum=MOMENTUM, foreach=foreach))
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            assert torch.equal(a, b), f"step {step}, parameter {i}"


@pytest.mark.parametrize("foreach", [None, False, True])
def test_parameters_bit_for_bit_as_torchs(foreach):
    _same_as_torch((torch.float32,), foreach)


def test_multi_tensor_path_groups_dtypes_as_torch_does():
    _same_as_torch((torch.float32, torch.float64), True)


def test_zero_grad_drops_the_gradients():
    params = _params()
    for p in params:
        p.grad = torch.ones_like(p)
    SGD(params, lr=LR, momentum=MOMENTUM).zero_grad()
    assert all(p.grad is None for p in params)


def test_no_gradient_no_step():
    params = _params()
    before = [p.detach().clone() for p in params]
    SGD(params, lr=LR, momentum=MOMENTUM).step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_built_and_stepped_without_torch_dynamo():
    """The reason it exists: torch.optim's optimizers import torch._dynamo (seconds of a
    rank's start)."""
    code = ("import sys, torch\n"
            "from ddlcomm.train.sgd import SGD\n"
            "m = torch.nn.Linear(3, 2)\n"
            "opt = SGD(m.parameters(), lr=0.1, momentum=0.9)\n"
            "for _ in range(2):\n"
            "    m(torch.ones(4, 3)).sum().backward(); opt.step(); opt.zero_grad()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
