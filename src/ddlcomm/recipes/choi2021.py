"""choi2021: communication of multi-GPU data-parallel training in containers (Choi et al.).

Parameter-server broadcast and gather (the ``ps-sync`` workload's phases) and
all-reduce of a float32 array, over MPICH and Open MPI (each from its own
environment), 1 to 4 workers, with one rank per container vs all ranks in
one container.  The paper's GPU variants (CUDA-aware Open MPI, NCCL, the
host-staged / direct / NCCL-via-chief paths) need a GPU; on a machine without
one they are listed with the reason.

Scaled default: 16 MiB instead of 1 GiB, 3 timed steps (MPICH oversubscribed
on 2 cores takes seconds per large broadcast). ``--full``: 1 GiB
and 1000 repetitions.
"""
from __future__ import annotations

from ..report.recipe import write_recipe_report
from ..workloads.paths import PATHS, gpu_available
from .base import Recipe, Step

FULL_BYTES = 1 << 30
SCALED_BYTES = 16 << 20
MPIS = (("openmpi", "Open MPI"), ("mpich", "MPICH"))
PLACEMENTS = ("one container per rank", "all in one container")


def steps(full: bool) -> list[Step]:
    size = FULL_BYTES if full else SCALED_BYTES
    iters = 1000 if full else 3
    out = []
    for env, _ in MPIS:
        for workers in range(1, 5):
            for placement in PLACEMENTS:
                for workload, ranks in (("ps-sync", workers + 1), ("allreduce", workers)):
                    containers = ranks if placement == PLACEMENTS[0] else 1
                    args = ["--workload", workload, "--sizes", f"{size}B", "--ranks", str(ranks),
                            "--containers", str(containers), "--steps", str(iters)]
                    out.append(Step(f"{env} {workload} {workers} workers, {placement}", tuple(args),
                                    env=env))
    return out


def unavailable() -> list[tuple[str, str]]:
    ok, why = gpu_available()
    reason = why if not ok else "GPU paths are not implemented yet"
    out = [("CUDA-aware Open MPI", reason), ("NCCL", reason)]
    out += [(f"path {p.name} ({p.description})", reason) for p in PATHS.values() if p.needs_gpu]
    return out


_PHASE = {("ps-sync", "broadcast"): "PS broadcast", ("ps-sync", "gather"): "PS gather",
          ("allreduce", "allreduce"): "all-reduce"}


def _workers(p: dict) -> int:
    return p["ranks"] - 1 if p["collective"] == "ps-sync" else p["ranks"]


def _placement(p: dict) -> str:
    return PLACEMENTS[0] if (p.get("containers") or 0) == p["ranks"] and p["ranks"] > 1 \
        else PLACEMENTS[1]


def select(points):
    return [p for p in points if (p["collective"], p.get("phase")) in _PHASE]


def report(recipe, points, out_dir):
    return write_recipe_report(
        recipe.title, select(points), out_dir,
        figure_of=lambda p: _PHASE[p["collective"], p["phase"]],
        panel_of=lambda p: p["library"], x_of=_workers,
        line_of=_placement, x_label="workers", panel_order=[name for _, name in MPIS],
        notes=["float32 array; PS: rank 0 is the server, workers are the other ranks.",
               "With one worker, 'one container per rank' for all-reduce is a single rank."],
        unavailable=unavailable())


RECIPE = Recipe("choi2021", "choi2021: multi-GPU communication in containers (CPU variants)",
                steps, unavailable, report)
