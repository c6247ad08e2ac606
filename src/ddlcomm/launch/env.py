"""Which launcher started this process, and this rank's place in the job (pure).

Each launcher exports rank, size and local rank under its own names; the table
below lists them, most specific first.  ``detect`` reads an environment
mapping (``os.environ`` by default) so it is testable without any launcher.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str
    rank: int
    size: int
    #: None where the launcher says none: the backend works it out (MPI: its node's ranks)
    local_rank: Optional[int]


#: launcher name, rank variable, size variable, local-rank variables (first found wins).
#: srun's PMI-2 and PMIx plugins set PMI_RANK or PMIX_RANK but no local rank of theirs:
#: the step's SLURM_LOCALID is it.
LAUNCHERS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_RANK",)),
    ("hydra", "PMI_RANK", "PMI_SIZE", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID")),
    ("pmix", "PMIX_RANK", "PMIX_SIZE", ("PMIX_LOCAL_RANK", "SLURM_LOCALID")),
    ("torchrun", "RANK", "WORLD_SIZE", ("LOCAL_RANK",)),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", ("SLURM_LOCALID",)),
)


def detect(environ: Optional[Mapping[str, str]] = None) -> Optional[LaunchInfo]:
    """Return this process's :class:`LaunchInfo`, or None outside any launcher.

    torchrun is recognised by ``TORCHELASTIC_RUN_ID`` or ``MASTER_ADDR`` beside
    ``RANK``/``WORLD_SIZE``, so a stray ``RANK`` variable is not mistaken for it.
    Slurm counts only inside a job step (``SLURM_STEP_ID``), not in a batch
    script that has yet to call srun.
    """
    env = os.environ if environ is None else environ
    for name, rank_var, size_var, local_vars in LAUNCHERS:
        if rank_var not in env or size_var not in env:
            continue
        if name == "torchrun" and not ("TORCHELASTIC_RUN_ID" in env or "MASTER_ADDR" in env):
            continue
        if name == "slurm" and "SLURM_STEP_ID" not in env:
            continue
        try:
            rank, size = int(env[rank_var]), int(env[size_var])
            local = next((int(env[v]) for v in local_vars if v in env), None)
        except ValueError:
            continue
        return LaunchInfo(name, rank, size, local)
    return None


#: Ports a Slurm job step's rank 0 may listen on for the gloo rendezvous (below
#: Linux's ephemeral range, 32768-60999, so that no client socket holds one).
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 10000


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list expression (pure).

    ``first_host("node[07-09,12],gpu3") == "node07"``; every bracket takes its
    first value, zero padding kept (``rack[2-3]-n[1-4]`` -> ``rack2-n1``).
    """
    out, depth, bracket = [], 0, ""
    for ch in nodelist.strip():
        if ch == "," and depth == 0:
            break
        if ch == "[":
            depth, bracket = depth + 1, ""
        elif ch == "]":
            depth -= 1
            out.append(bracket.split(",")[0].split("-")[0])
        elif depth:
            bracket += ch
        else:
            out.append(ch)
    return "".join(out)


def slurm_rendezvous(environ: Optional[Mapping[str, str]] = None) -> Optional[tuple[str, int]]:
    """(host, port) where rank 0 of this Slurm job step can meet the others, or None.

    Inside an srun step: rank 0 runs on the step's first node (block and cyclic
    distributions alike), and every rank derives the same port from the job
    and step ids, with no message exchanged.  ``MASTER_ADDR``/``MASTER_PORT``
    override both (see comm/torchdist.py).
    """
    env = os.environ if environ is None else environ
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST")
    try:
        job, step = int(env["SLURM_JOB_ID"]), int(env["SLURM_STEP_ID"])
    except (KeyError, ValueError):
        return None
    if not nodes:
        return None
    return first_host(nodes), SLURM_PORT_BASE + (job * 131 + step) % SLURM_PORT_SPAN
