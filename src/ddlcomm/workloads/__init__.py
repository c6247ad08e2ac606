"""Data-parallel communication workloads: parameter server and all-reduce.

Each workload registers itself by name; ``get_workload`` loads it on demand.
"""
from __future__ import annotations

import importlib

from ..errors import UsageError

#: workload name -> "module:object" (imported when first asked for)
WORKLOADS = {
    "ps-sync": "ddlcomm.workloads.ps:PS_SYNC",
    "ps-async": "ddlcomm.workloads.ps:PS_ASYNC",
    "allreduce": "ddlcomm.workloads.allreduce:ALLREDUCE",
}


def get_workload(name: str):
    """The workload registered as ``name`` (UsageError naming the choices)."""
    try:
        target = WORKLOADS[name]
    except KeyError:
        raise UsageError(f"unknown workload {name!r}", f"choose from {', '.join(WORKLOADS)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
