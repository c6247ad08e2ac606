"""Named experiments (``ddlcomm reproduce NAME``): plans over the same pieces.

A recipe lists ``ddlcomm bench`` and ``ddlcomm train`` invocations (which environment,
which options) and how its report is laid out; it adds no mechanism of its own.
"""
from __future__ import annotations

from ..lazy import lookup

RECIPES = {
    "woo2020": "ddlcomm.recipes.woo2020:RECIPE",
    "choi2021": "ddlcomm.recipes.choi2021:RECIPE",
    "shi2018": "ddlcomm.recipes.shi2018:RECIPE",
    "awan2019": "ddlcomm.recipes.awan2019:RECIPE",
}


def get_recipe(name: str):
    """The recipe registered as ``name`` (UsageError naming the choices)."""
    return lookup(RECIPES, name, "recipe")
