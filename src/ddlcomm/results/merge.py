"""Merging databases: runs measured apart (one per job, per library, per GPU call) into one.

Every run of each source is copied with its points under a new id; a run the
destination holds already (the same start, host, owner and command) is not
taken twice, so merging again is harmless.  With ``one_machine`` every run,
those already in the destination included, must come from one machine (CPU
model and core count): a dataset that describes one machine (the model's
fidelity data) must not mix two; nothing is written otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import UsageError
from .store import Store


@dataclass
class Merged:
    """What one source gave: runs added (with their points), runs already there, and runs
    there that the source has gone on with since (merged while they ran: brought up to date)."""

    source: str
    runs: int = 0
    points: int = 0
    already: int = 0
    updated: int = 0


def machine_of(run: dict) -> tuple:
    """A run's machine, as far as its row tells: (CPU model, cores)."""
    return run.get("cpu_model"), run.get("cores")


def check_one_machine(paths: Sequence[Path]) -> None:
    """UsageError unless every run of the databases at ``paths`` comes from one machine
    (read only: a refused merge writes nothing, not even the database it would make)."""
    machines = {}
    for path in paths:
        with Store(path, readonly=True) as store:
            machines.update({machine_of(r): path for r in store.runs()})
    if len(machines) > 1:
        seen = "; ".join(f"{model} with {cores} cores ({path})"
                         for (model, cores), path in machines.items())
        raise UsageError(f"the runs come from {len(machines)} machines: {seen}",
                         "merge each machine's runs into a database of its own, or drop "
                         "--one-machine")


def merge(dest: Store, sources: Sequence[Path], one_machine: bool = False,
          said: Callable[[Merged], None] = lambda done: None) -> list[Merged]:
    """Copy every run of ``sources`` (in order) into ``dest``; what each gave (``said`` as
    each source is done: a long merge stopped midway has said how far it got)."""
    if one_machine:
        check_one_machine([dest.path, *sources])
    out = []
    for path in sources:
        done = Merged(str(path))
        with Store(path, readonly=True) as store:           # a source is read, never written
            for run in reversed(store.runs()):                  # oldest first
                points = store.points(run["id"])
                _, state = dest.import_run(run, points)
                if state == "already":
                    done.already += 1
                elif state == "updated":
                    done.updated, done.points = done.updated + 1, done.points + len(points)
                else:
                    done.runs, done.points = done.runs + 1, done.points + len(points)
        out.append(done)
        said(done)
    return out
