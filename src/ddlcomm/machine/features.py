"""What else a run may ask for: containers from Linux namespaces, memkind's
high-bandwidth memory, Slurm, and single-copy transfers between processes (CMA, what
Open MPI's shared-memory transport copies large messages with).  Each answers
``available`` and, when not, the ``reason`` (the same message the feature's own
refusal gives)."""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ..errors import DdlcommError
from ..launch import containers
from ..memory import hbw
from . import cma, probe

SLURM_TOOLS = ("srun", "sbatch", "salloc", "sinfo", "squeue")
#: The variables of a Slurm allocation worth keeping (the rest of SLURM_* is noise).
SLURM_JOB_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES",
                  "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SLURM_STEP_ID",
                  "SLURM_JOB_PARTITION", "SLURM_GPUS_ON_NODE")


def namespaces() -> dict[str, Any]:
    """Whether ``--containers`` can build containers here (:func:`containers.check_available`:
    a throwaway namespace probe that leaves nothing behind)."""
    try:
        containers.check_available()
    except DdlcommError as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True}


def memkind() -> dict[str, Any]:
    """Whether memory kind ``hbw`` has high-bandwidth memory (:func:`hbw.unavailable`)."""
    why = hbw.unavailable()
    return {"available": True} if why is None else {"available": False, "reason": why[0]}


def slurm_job(environ: Mapping[str, str]) -> Optional[dict[str, str]]:
    """The Slurm allocation this process runs in, from its environment; None outside one (pure)."""
    job = {k: environ[k] for k in SLURM_JOB_VARS if k in environ}
    return job or None


def slurm() -> dict[str, Any]:
    """Slurm's tools on PATH, its version (``srun --version``, which must answer for Slurm
    to count as available), and the current job."""
    tools = {name: probe.which(name) for name in SLURM_TOOLS}
    out: dict[str, Any] = {"available": tools["srun"] is not None,
                           "tools": {k: v for k, v in tools.items() if v}, "job": slurm_job(os.environ)}
    if tools["srun"] is None:
        out["reason"] = "srun not found on PATH"
        return out
    text, why = probe.command([tools["srun"], "--version"])
    out["version"] = None if why else (text or "").strip()
    if why:                      # a Slurm with no configuration to read starts no job
        out["available"], out["reason"] = False, why
    return out


def facts() -> dict[str, Any]:
    """``namespaces``, ``memkind`` (hbw), ``slurm`` and ``cma`` (:mod:`.cma`), each guarded."""
    return {"namespaces": probe.guarded(namespaces), "memkind": probe.guarded(memkind),
            "slurm": probe.guarded(slurm), "cma": probe.guarded(cma.facts)}
