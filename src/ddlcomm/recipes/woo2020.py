"""woo2020: Python collectives on many-core CPUs (Woo et al.).

Broadcast 256 MiB, gather 16 MiB and all-reduce 256 MiB of int32, called
from C, from Python with buffers and from Python with pickled objects
(``--impl c,buffer,object``: one run, interleaved per size, same buffers);
process counts 2 .. cores and, marked, oversubscribed beyond; memory kinds
pageable vs hugepage (vs hbw where the machine has it); ranks on the host vs
in 1, 2 and 4 containers, the containers bound to NUMA nodes.

Scaled default: sizes divided by 16, 10 timed calls per point, process
counts {2 .. cores, 2 x cores}. ``--full``: the paper's sizes and 1000 calls.
One launch measures the collectives of one size (:func:`by_size`).
"""
from __future__ import annotations

import os

from .. import memory
from ..report.recipe import write_recipe_report
from ..units import counted
from .base import Recipe, Step, containers_here, cores_of

FULL_SIZES = {"broadcast": 256 << 20, "gather": 16 << 20, "allreduce": 256 << 20}
SCALE = 16
ENVIRONMENTS = ((0, "host"), (1, "1 container"), (2, "2 containers"), (4, "4 containers"))


def _process_counts(cores: int) -> list[int]:
    return sorted(set(range(2, cores + 1)) | {2 * cores})


def _memories() -> list[str]:
    kinds = ["pageable", "hugepage"]
    try:
        memory.check("hbw")
        kinds.append("hbw")
    except Exception:                       # no high-bandwidth memory here: listed as unavailable
        pass
    return kinds


def steps(full: bool) -> list[Step]:
    cores = os.cpu_count() or 1
    iters = 1000 if full else 10
    in_containers = containers_here()[0]
    out = []
    for ranks in _process_counts(cores):
        for containers, env_label in ENVIRONMENTS:
            if containers > ranks or containers and not in_containers:
                continue
            for mem in _memories():
                for nbytes, colls in by_size().items():
                    size = nbytes if full else nbytes // SCALE
                    args = ["--collective", ",".join(colls), "--sizes", f"{size}B", "--dtype", "int32",
                            "--impl", "c,buffer,object", "--ranks", str(ranks), "--memory", mem,
                            "--iters", str(iters), "--warmup", "2"]
                    if containers:
                        args += ["--containers", str(containers), "--bind", "numa"]
                    out.append(Step(f"{' and '.join(colls)} {ranks} ranks {env_label} {mem}", tuple(args)))
    return out


def by_size() -> dict[int, list[str]]:
    """The paper's collectives by their size: one launch measures those of one size
    (broadcast and all-reduce, 256 MiB), so each setting takes 2 launches, not 3 (pure)."""
    out: dict[int, list[str]] = {}
    for coll, nbytes in FULL_SIZES.items():
        out.setdefault(nbytes, []).append(coll)
    return out


def unavailable() -> list[tuple[str, str]]:
    apart, why = containers_here()
    out = [] if apart else [("ranks in 1, 2 and 4 containers", why)]
    try:
        memory.check("hbw")
    except Exception as exc:                # the reason the memory kind gives
        out.append(("hbw (high-bandwidth memory)", str(exc)))
    return out


def _environment(p: dict) -> str:
    k = p.get("containers") or 0
    return "host" if k == 0 else counted(k, "container")


def report(recipe, points, out_dir, missing=()):
    cores = cores_of(points)
    return write_recipe_report(
        recipe.title, points, out_dir,
        figure_of=lambda p: f"{p['collective']} ({p['bytes'] >> 20} MiB int32)",
        panel_of=_environment, x_of=lambda p: p["ranks"],
        line_of=lambda p: f"{p['form']} / {p.get('memory', 'numpy')}",
        x_label="processes", panel_order=[e for _, e in ENVIRONMENTS],
        notes=[f"Process counts above {cores} (this machine's cores) are oversubscribed.",
               "Containers are bound to NUMA nodes (--bind numa).",
               "Each line is one implementation (c, buffer, object) in one memory kind."],
        unavailable=missing)


RECIPE = Recipe("woo2020", "woo2020: Python collectives on many-core CPUs", steps, unavailable, report)
