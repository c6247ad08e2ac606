"""choi2021: communication of multi-GPU data-parallel training in containers (Choi et al.).

Parameter-server broadcast and gather (the ``ps-sync`` workload's phases) and
all-reduce of a float32 array, over MPICH and Open MPI (each from its own
environment), 1 to 4 workers, with one rank per container vs all ranks in
one container.

The GPU half (where torch sees a GPU): the workers' data on the GPU (``--memory
device``), 1 to 4 workers (all ranks on GPU ``local_rank % gpus``: 4 ranks
share the one GPU of a one-GPU machine), along every path and library that
can run here: MPI (both) host-staged and NCCL-via-chief, NCCL itself and
Gloo on CUDA tensors; the direct path where the MPI is CUDA-aware.  All
ranks on the host, and at 4 workers also one container per rank (each a host
of its own to MPI and NCCL, the GPU shared all the same).  What cannot run is
listed with the reason (:func:`unavailable`).

Scaled default: 16 MiB instead of 1 GiB, 3 timed steps (MPICH oversubscribed
on 2 cores takes seconds per large broadcast; the GPU half's 28 launches are
meant to fit in about 10 minutes, an estimate to confirm there). One launch
measures both workloads of its rank count (PS at n ranks has n - 1 workers,
all-reduce n): 5 launches a variant, not 8.  ``--full``: 1 GiB, 1000
repetitions, containers at every worker count.
"""
from __future__ import annotations

from ..machine import mpi as mpi_facts
from ..memory.gpu import cuda_available
from ..report.recipe import write_recipe_report
from ..units import counted
from .base import Recipe, Step, containers_here

FULL_BYTES = 1 << 30
SCALED_BYTES = 16 << 20
MPIS = (("openmpi", "Open MPI"), ("mpich", "MPICH"))
PLACEMENTS = ("one container per rank", "all in one container")
#: The GPU half's runs beside one container per rank: every rank on the host.
ON_HOST = "all on the host"


def steps(full: bool) -> list[Step]:
    """(Where there is a GPU) the GPU half first, then the CPU half: a run cut short by a
    time limit loses the part any machine can measure."""
    return (gpu_steps(full) if cuda_available()[0] else []) + cpu_steps(full)


def _sized(full: bool) -> tuple[int, int]:
    return (FULL_BYTES, 1000) if full else (SCALED_BYTES, 3)


#: The most workers: PS runs 2 to WORKERS + 1 ranks (a server beside them), all-reduce 1 to WORKERS.
WORKERS = 4


def by_ranks() -> list[tuple[int, tuple[tuple[str, int], ...]]]:
    """Each rank count's (workload, workers): one launch measures both workloads of its rank
    count, ``ps-sync`` with a worker fewer (the server), so 5 launches make the 8 (pure)."""
    out = []
    for ranks in range(1, WORKERS + 2):
        here = ((("ps-sync", ranks - 1),) if ranks > 1 else ()) + \
            ((("allreduce", ranks),) if ranks <= WORKERS else ())
        out.append((ranks, here))
    return out


def _what(ranks: int, workloads) -> str:
    said = ", ".join(f"{w} {counted(n, 'worker')}" for w, n in workloads)
    return f"{counted(ranks, 'rank')} ({said})"


def _workload_args(workloads, ranks: int, size: int, iters: int) -> tuple[str, ...]:
    return ("--workload", ",".join(w for w, _ in workloads), "--sizes", f"{size}B",
            "--ranks", str(ranks), "--steps", str(iters))


def cpu_steps(full: bool) -> list[Step]:
    """Every placement is a --containers run: none where containers cannot be made here."""
    if not containers_here()[0]:
        return []
    size, iters = _sized(full)
    out = []
    for env, _ in MPIS:
        for ranks, workloads in by_ranks():
            for placement in PLACEMENTS:
                if ranks == 1 and placement == PLACEMENTS[0]:
                    continue             # one rank: one container either way, run once
                containers = ranks if placement == PLACEMENTS[0] else 1
                args = (*_workload_args(workloads, ranks, size, iters), "--containers", str(containers))
                out.append(Step(f"{env} {_what(ranks, workloads)}, {placement}", args, env=env))
    return out


#: The GPU half's runs of one workload: (label, environment, options).  MPI takes the
#: device data along the paths; NCCL and Gloo are handed the device tensors themselves.
GPU_RUNS = (
    [(f"{name} host-staged, nccl-chief", env, ("--backend", "mpi", "--path", "host-staged,nccl-chief"))
     for env, name in MPIS]
    + [("NCCL", "openmpi", ("--backend", "nccl")), ("Gloo on CUDA", "openmpi", ("--backend", "gloo"))])


#: Worker counts whose GPU runs (the launches that measure them) are also made with one
#: container per rank (scaled default; ``--full``: every count), beside all ranks on the host.
GPU_CONTAINER_WORKERS = (4,)


def gpu_steps(full: bool) -> list[Step]:
    size, iters = _sized(full)
    runs = GPU_RUNS + _direct_runs()            # one MPI probe (a child process), not eight
    containers = containers_here()[0]
    out = []
    for ranks, workloads in by_ranks():
        apart = containers and ranks > 1 and (
            full or any(n in GPU_CONTAINER_WORKERS for _, n in workloads))
        for label, env, how in runs:
            if ranks < 2 and "host-staged,nccl-chief" in how:   # no chief beside rank 0
                label = label.replace(", nccl-chief", "")
                how = tuple("host-staged" if a == "host-staged,nccl-chief" else a for a in how)
            args = (*_workload_args(workloads, ranks, size, iters), "--memory", "device", *how)
            what = f"GPU {label}: {_what(ranks, workloads)}"
            out.append(Step(what, args, env=env))
            if apart:
                out.append(Step(f"{what}, {PLACEMENTS[0]}", (*args, "--containers", str(ranks)), env=env))
    return out


def _direct_runs() -> list:
    """The direct path, in the environments whose MPI is CUDA-aware (none from the pip wheels)."""
    aware = cuda_aware_mpis()
    return [(f"{name} direct", env, ("--backend", "mpi", "--path", "direct"))
            for env, name in MPIS if aware.get(env) is True]


def cuda_aware_mpis() -> dict:
    """``{env: True/False/"unknown"}`` for this environment's MPI (the others are asked by
    their own runs: the direct path refuses there with the evidence)."""
    facts = mpi_facts.facts()
    env = {name: env for env, name in MPIS}.get(facts.get("library", ""))
    return {env: facts.get("cuda_aware")} if env else {}


def unavailable() -> list[tuple[str, str]]:
    """The paper's variants that cannot run here, each with the reason."""
    apart, no_containers = containers_here()
    missing = [] if apart else [("one container per rank, all in one container (the CPU half) and "
                                 "the GPU half's runs in containers", no_containers)]
    ok, why = cuda_available()
    if not ok:
        return missing + [(f"GPU half: {v}", why) for v in
                          ("CUDA-aware Open MPI (path direct)", "NCCL", "Gloo on CUDA",
                           "path host-staged", "path nccl-chief")]
    out = missing
    facts = mpi_facts.facts()
    for _, name in MPIS:                        # every MPI whose direct path is not run
        if facts.get("library") != name:
            out.append((f"path direct ({name})", "not run: only this environment's MPI "
                        f"({facts.get('library', 'MPI')}) is asked whether it is CUDA-aware"))
        elif facts.get("cuda_aware") is not True:
            evidence = "; ".join(facts.get("evidence") or [])
            out.append((f"path direct ({name})",
                        f"not CUDA-aware (cuda_aware: {facts.get('cuda_aware')}): {evidence}"))
    out.append(("path nccl-chief, all-reduce at 1 worker", "the path needs a chief worker "
                                                          "(rank 1) beside rank 0"))
    out.append(("one GPU per container", "the containers' ranks take GPU local_rank % GPUs, so "
                                         "on a machine with fewer GPUs than ranks they share them"))
    return out


_PHASE = {("ps-sync", "broadcast"): "PS broadcast", ("ps-sync", "gather"): "PS gather",
          ("allreduce", "allreduce"): "all-reduce"}


def _workers(p: dict) -> int:
    return p["ranks"] - 1 if p["collective"] == "ps-sync" else p["ranks"]


def _placement(p: dict) -> str:
    """One container per rank, all in one container, or (the GPU half's) all on the host."""
    containers = p.get("containers") or 0
    if containers == p["ranks"] and p["ranks"] > 1:
        return PLACEMENTS[0]
    return PLACEMENTS[1] if containers else ON_HOST


def select(points):
    return [p for p in points if (p["collective"], p.get("phase")) in _PHASE]


def _panel(p: dict) -> str:
    """The CPU panels by library; the GPU ones by library and path (``GPU: Open MPI host-staged``)."""
    if p.get("memory") != "device":
        return p["library"]
    path = p.get("path") or "host"
    return f"GPU: {p['library']}" + ("" if path == "host" else f" {path}")


#: The GPU panels, in order (see :func:`_panel`).
GPU_PANELS = [f"GPU: {name} {path}" for _, name in MPIS
              for path in ("host-staged", "nccl-chief", "direct")] + ["GPU: NCCL", "GPU: Gloo"]


def _figure(p: dict) -> str:
    """The CPU half's figures by collective; the GPU half's apart (``GPU all-reduce``)."""
    return ("GPU " if p.get("memory") == "device" else "") + _PHASE[p["collective"], p["phase"]]


def report(recipe, points, out_dir, missing=()):
    chosen = select(points)
    on_gpu = any(p.get("memory") == "device" for p in chosen)
    return write_recipe_report(
        recipe.title, chosen, out_dir,
        figure_of=_figure,
        panel_of=_panel, x_of=_workers,
        line_of=_placement, x_label="workers",
        panel_order=[name for _, name in MPIS] + GPU_PANELS,
        notes=["float32 array; PS: rank 0 is the server, workers are the other ranks.",
               "With one worker, 'one container per rank' for all-reduce is a single rank.",
               *(["GPU panels: the workers' data on the GPU; every timed step ends with a CUDA "
                  "stream synchronisation (OSU's -d cuda convention); host-staged and "
                  "nccl-chief copy phases are stored apart. All ranks on the host, and at "
                  f"{', '.join(map(str, GPU_CONTAINER_WORKERS))} workers (every count with --full) "
                  "one container per rank; the ranks share the GPUs by local rank (each point "
                  "records ranks_per_gpu)."] if on_gpu else [])],
        unavailable=missing)


RECIPE = Recipe("choi2021", "choi2021: multi-GPU communication in containers",
                steps, unavailable, report)
