"""Tables of things loaded by name on first use ("module:attribute" targets), and torch.

Registries (workloads, recipes, backends) name what implements each entry
instead of importing it, so ``import ddlcomm`` stays cheap and an entry whose
dependencies are missing cannot break the others.  :func:`torch_module` is the
one place the modules that hold tensors import torch from, on first use.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from .errors import UsageError


def load(target: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def torch_module() -> Any:
    """The torch module, imported on first use: only code that holds tensors needs it."""
    # torch is optional: imported only where tensors are held
    import torch
    return torch


def lookup(table: Mapping[str, str], name: str, what: str) -> Any:
    """Load entry ``name`` of ``table``; a UsageError naming the choices if it has none."""
    try:
        target = table[name]
    except KeyError:
        raise UsageError(f"unknown {what} {name!r}", f"choose from {', '.join(table)}") from None
    return load(target)
