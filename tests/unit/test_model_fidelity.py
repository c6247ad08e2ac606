"""The cost model against committed measurements of real machines (no MPI needed).

Each machine under tests/data/machines/ holds the databases of
``scripts/gpu-check manycores:LIB`` (gzip-compressed), the machine's
``ddlcomm info --json`` and a README with the command that made them.  Per
library and collective family, the model is fitted on the smaller rank counts
and must predict the larger ones (held out) within the machine's bounds, from
64 KiB: the median |relative error| of the held-out points, and of the fitted
points.  The bounds of the 2-core machine are the model's figures when its
data were committed (no worse than that: 6-55%, far from the 16-core
targets); the 16-core machine's are the targets of issue 17.  A machine whose data are not committed yet is skipped
with the reason.
"""
from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddlcomm.model.calibrate import calibrate, family_summary, parse_holdout, select_points, with_cores
from ddlcomm.model.node import bandwidth_of
from ddlcomm.results.export import point_record
from ddlcomm.results.store import Store

MACHINES_DIR = Path(__file__).resolve().parent.parent / "data" / "machines"
#: Sizes the bounds apply from.
FROM_BYTES = 64 << 10
#: How each library's points are named in a database.
LIBRARIES = {"openmpi": ("mpi", "Open MPI"), "mpich": ("mpi", "MPICH"), "gloo": ("gloo", "gloo")}
COLLECTIVES = ("broadcast", "gather", "allreduce")


@dataclass(frozen=True)
class Machine:
    name: str               # its folder under tests/data/machines
    holdout: str            # the ranks predicted, e.g. "ranks=4"
    #: (held-out, fitted) median |relative error| at most: one pair for every
    #: family, or per (library, collective)
    bounds: object
    #: whether the model prices memory contention from the machine's measured copy
    #: bandwidth by copies at once (its info.json's, where it has one)
    contention: bool = True

    def bound(self, library: str, collective: str) -> tuple[float, float]:
        return self.bounds[library, collective] if isinstance(self.bounds, dict) else self.bounds


#: The model's figures on the 2-core data when they were committed (2026-11-23, the
#: model of 0c94df2), rounded up: (held out, fitted).  Lower them as the model improves.
#: One was raised, with the reason: Open MPI's broadcast held out (0.26 -> 0.38).  The
#: 0.26 priced its 4-rank chain broadcast (from 1 MiB) as four chains, while Open MPI
#: runs one chain of 3 hops (fan-out 0 forced to 1; forcing the algorithm on this
#: machine, the default took the time of fan-out 1, 1.6-1.9x that of fan-out 4 at 16 MiB).
#: Priced as what runs, the committed 4-rank runs came out 20-30% faster than this
#: machine measured the same points later (16 MiB: 2.68 ms then, 3.35 ms later).
#: MPICH's were lowered, but for one: the model now prices what MPICH runs on one node,
#: its shared-memory release_gather (all-reduce at every size; broadcast below 8 ranks),
#: where it priced recursive halving/doubling and a binomial tree: broadcast held out 13%
#: -> 8%, fitted 20% -> 13%; all-reduce held out 17% -> 15%, fitted 6% -> 7% (raised).
TODAY_2CORE = {
    ("openmpi", "broadcast"): (0.38, 0.14), ("openmpi", "gather"): (0.26, 0.24),
    ("openmpi", "allreduce"): (0.24, 0.28), ("mpich", "broadcast"): (0.08, 0.13),
    ("mpich", "gather"): (0.55, 0.17), ("mpich", "allreduce"): (0.15, 0.07),
    ("gloo", "broadcast"): (0.20, 0.10), ("gloo", "gather"): (0.21, 0.24),
    ("gloo", "allreduce"): (0.41, 0.30),
}

#: The 2-core machine without the contention term: its info.json predates the copy-bandwidth
#: probe, and with the curve measured later on a machine of its kind (2026-11-25: one copy
#: 15.0 GB/s, two at once 15.7 GB/s together) 4 of its 9 families predicted worse (Gloo
#: allreduce held out 40% -> 52%), 2 better (Open MPI broadcast 38% -> 29%, but fitted 14% ->
#: 21%): docs/benchmarks.md.
MACHINES = (
    Machine("epyc-2core", "ranks=4", TODAY_2CORE, contention=False),
    Machine("h100-16core", "ranks=12:16", (0.15, 0.10)),      # issue 17's targets
)


def points_of(machine: Machine, library: str, tmp_path: Path) -> list[dict]:
    """The library's sweep points (not the own-algorithm runs) of a machine's database."""
    packed = MACHINES_DIR / machine.name / f"manycores-{library}.db.gz"
    if not packed.exists():
        pytest.skip(f"no {library} data of {machine.name} committed yet: run "
                    f"`scripts/gpu-check manycores:{library}` there (tests/data/machines/README.md)")
    db = tmp_path / f"{machine.name}-{library}.db"
    with gzip.open(packed, "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with Store(db) as store:
        runs = [r for r in store.runs() if ":own:" not in ((r.get("config") or {}).get("extra") or {}).get("tag", "")]
        points = [point_record(p) for p in store.points()]
    backend, name = LIBRARIES[library]
    sweep = {r["id"] for r in runs}
    return select_points(with_cores(points, runs, str(db)), runs=sweep, backend=backend, library=name)


def info_of(machine: Machine) -> dict:
    return json.loads((MACHINES_DIR / machine.name / "info.json").read_text())


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("machine", MACHINES, ids=[m.name for m in MACHINES])
def test_the_model_predicts_the_larger_rank_counts(machine, library, collective, tmp_path):
    points = [p for p in points_of(machine, library, tmp_path) if p["collective"] == collective]
    holdout = parse_holdout(machine.holdout)
    if not any(holdout.matches(p) for p in points):
        # e.g. a GPU call's deadline ended the sweeps before the largest rank counts
        pytest.skip(f"{machine.name}'s {library} data has no {collective} point at "
                    f"{machine.holdout}: measure the rest (tests/data/machines/README.md)")
    info = info_of(machine)
    llc = info["cpus"].get("last_level_cache_bytes")    # None where sysfs had none (a VM)
    fit = calibrate(points, holdout=[holdout], summary_bytes=FROM_BYTES,
                    cache=float(llc) if llc else None,  # as `ddlcomm model calibrate` does
                    bandwidth=bandwidth_of(info["memory"].get("copy_bandwidth"))
                    if machine.contention else None)
    (family,) = family_summary(fit).values()        # the figures `ddlcomm model calibrate` prints
    held, fitted = family["heldout"], family["fitted"]
    assert held["points"] and fitted["points"], family
    where = f"{machine.name} {library} {collective}"
    held_bound, fitted_bound = machine.bound(library, collective)
    assert held["median_rel_err"] <= held_bound, \
        f"{where}: held-out median |error| {held['median_rel_err']:.1%} > {held_bound:.0%}"
    assert fitted["median_rel_err"] <= fitted_bound, \
        f"{where}: fitted median |error| {fitted['median_rel_err']:.1%} > {fitted_bound:.0%}"
