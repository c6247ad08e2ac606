"""What this machine has, from real queries: ``ddlcomm info``, and the ``machine``
facts kept with every stored run.

One module per section, each returning plain (JSON-able) dicts and reporting a
missing thing as ``available: false`` with its ``reason`` instead of raising:
``cpus`` (model, affinity, NUMA), ``ram`` (memory, THP, hugetlb, /dev/shm),
``mpi`` (library, version, launcher, CUDA-awareness with evidence), ``gpus``
(torch, CUDA, NCCL, devices, ranks per GPU, MPS), ``features`` (namespaces,
memkind, Slurm, cross-memory attach).  ``probe`` is how they ask: commands and child interpreters
under timeouts.  :func:`facts` runs the sections at once (the MPI and torch
children take a second or two each) and turns a section that raised into
``{"error": ...}``.
"""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from . import cpus, features, gpus, mpi, probe, ram

#: The sections of :func:`facts`, in the order ``ddlcomm info`` shows them.
SECTIONS: dict[str, Callable[[Optional[int]], dict]] = {
    "cpus": lambda ranks: cpus.facts(),
    "memory": lambda ranks: ram.facts(),
    "mpi": lambda ranks: mpi.facts(),
    "gpus": lambda ranks: gpus.facts(ranks),
    "features": lambda ranks: features.facts(),
}

#: Version of the layout of :func:`facts`' dict (bump when a key changes meaning).
FACTS_VERSION = 1


def facts(ranks: Optional[int] = None) -> dict[str, Any]:
    """Every section's facts (``ranks``: how many local ranks to place on the GPUs),
    plus ``host``, ``facts_version``, ``probe_s`` (seconds the probes took) and ``gpu_verdict``."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(SECTIONS)) as pool:
        futures = {name: pool.submit(probe.guarded, lambda f=f: f(ranks)) for name, f in SECTIONS.items()}
        out: dict[str, Any] = {"facts_version": FACTS_VERSION, "host": socket.gethostname()}
        out.update({name: future.result() for name, future in futures.items()})
    out["gpu_verdict"] = gpu_verdict(out)
    out["probe_s"] = round(time.perf_counter() - start, 3)
    return out


def gpu_verdict(facts: dict[str, Any]) -> str:
    """One line on GPU work here, from :func:`facts`' ``gpus`` and ``mpi`` (pure)."""
    g, m = facts.get("gpus") or {}, facts.get("mpi") or {}
    if not g.get("count"):
        return "no GPU: GPU memory kinds (pinned, device), nccl and the GPU paths are unavailable here"
    if not g.get("cuda_available"):
        return (f"{g['count']} GPU(s) seen by nvidia-smi but torch cannot use them "
                f"(torch {g.get('torch')}, CUDA {g.get('cuda')}): install a CUDA build of torch")
    library = f"{m.get('library', 'MPI')} {m.get('version', '')}".strip()
    aware = {True: f"{library} is CUDA-aware: device buffers can go to MPI directly",
             False: f"{library} is not CUDA-aware: device buffers go through host staging or NCCL"
             }.get(m.get("cuda_aware"), f"whether {library} is CUDA-aware is unknown")
    shared = (f"; {max(g['ranks_per_gpu'])} ranks share a GPU at --ranks {g['ranks']}"
              + ("" if (g.get("mps") or {}).get("running") else
                 ", taking turns on it by time slices without MPS (each wait for another "
                 "rank's GPU work cost about 0.6 ms at 4 ranks on an H200)")
              if g.get("shared") else "")
    return f"{g['count']} GPU(s), NCCL {g['nccl'].get('version') or 'absent'}; {aware}{shared}"
