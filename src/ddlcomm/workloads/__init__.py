"""Data-parallel communication workloads: parameter server and all-reduce.

Each workload registers itself by name; ``get_workload`` loads it on demand.
A workload has ``name``, ``min_ranks`` and ``measure(comm, plan, spec, alloc)``
returning rank 0's records, where ``alloc(dtype, count)`` gives zeroed
buffers in the run's ``--memory`` kind (freed after the point).
"""
from __future__ import annotations

from ..lazy import lookup

#: workload name -> "module:object" (imported when first asked for)
WORKLOADS = {
    "ps-sync": "ddlcomm.workloads.ps:PS_SYNC",
    "ps-async": "ddlcomm.workloads.ps:PS_ASYNC",
    "allreduce": "ddlcomm.workloads.allreduce:ALLREDUCE",
}


def get_workload(name: str):
    """The workload registered as ``name`` (UsageError naming the choices)."""
    return lookup(WORKLOADS, name, "workload")
