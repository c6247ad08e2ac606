"""Named experiments (``ddlcomm reproduce NAME``): plans over the same pieces.

A recipe lists ``ddlcomm bench`` invocations (which environment, which
options) and how its report is laid out; it adds no mechanism of its own.
"""
from __future__ import annotations

import importlib

from ..errors import UsageError

RECIPES = {
    "woo2020": "ddlcomm.recipes.woo2020:RECIPE",
    "choi2021": "ddlcomm.recipes.choi2021:RECIPE",
}


def get_recipe(name: str):
    try:
        target = RECIPES[name]
    except KeyError:
        raise UsageError(f"unknown recipe {name!r}", f"choose from {', '.join(RECIPES)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
