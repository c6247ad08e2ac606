"""The cost model against committed measurements of real machines (no MPI needed).

Each machine under tests/data/machines/ holds the databases of
``scripts/gpu-check manycores:LIB`` (gzip-compressed), the machine's
``ddlcomm info --json`` and a README with the command that made them.  Per
library and collective family, the model is fitted on the smaller rank counts
and must predict the larger ones (held out) within the machine's bounds, from
64 KiB: the median |relative error| of the held-out points, and of the fitted
points.  The bounds are the model's figures today, rounded up, so that a change that
makes one worse is seen: on the 2-core machine 3-44%; on the 16-core node 6-12%:
within issue 17's 15% held out and 10% fitted for every family; on a second 2-core
machine (measured 2026-11-28) 3-44%; on a third, 2 cores of the 16-core node's Intel
Xeon (2026-12-06), 3-48%.  A library whose data are
not committed yet is skipped with the reason.
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
from ddlcomm.model.predict import predict
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


#: The model's figures on the 2-core data, rounded up: (held out, fitted).  Lower them as the
#: model improves.  Since 2026-11-27 the fit takes p50 (the slowest rank's median call, the
#: critical path the model prices) where it took avg (the mean over ranks); the figures of
#: the model before that day's changes, under p50, were: Open MPI broadcast 11/8, gather
#: 20/22, allreduce 19/20; MPICH 3/5, 60/15, 11/6; Gloo 16/7, 16/9, 47/21.  Two got worse
#: with the effective cache fitted (docs/benchmarks.md, "The model on the 16-core node"):
#: Gloo's gather held out 16% -> 27% and MPICH's all-reduce 11% -> 13%.  With the fresh pages
#: of the libraries' temporaries (2026-11-28) Open MPI's all-reduce went from 19/21 to 15/17.
#: With Open MPI's rendezvous beyond its eager limit (α_rndv, 2026-11-28, night) its three went
#: from 12/10, 15/17, 15/17 to 9/12, 8/10, 14/9: the broadcast's fitted figure got worse.  With
#: torch's flat temporary of Gloo's gather (its fresh pages and its copy out, the same night)
#: Gloo's gather went from 27/11 to 13/3; with both ranks of an MPICH pair busy, MPICH's gather
#: from 60/12 to 42/12.  With the small pages a single copy pins (α_page, 2026-11-28, late) Open
#: MPI's broadcast went from 9/12 to 7/11, MPICH's gather from 42/12 to 38/10.  With the fit's
#: Huber loss (δ 10%, 2026-11-29) in place of least squares the fitted figures fell for all
#: but two (which held) and the held-out ones moved both ways: Open MPI 7/11, 8/10, 14/9 ->
#: 7/7, 6/6, 12/7; MPICH 3/7, 38/10, 13/4 -> 5/4, 42/8, 12/3; Gloo 17/6, 13/3, 48/18 -> 17/6,
#: 12/3, 45/14.  Worse held out: MPICH's broadcast (2.5% -> 4.3%) and gather (37.4% -> 41.5%).
#: With the cache spilling all at once and Open MPI's linear gathers copying the root's own n
#: (2026-11-29, later): Open MPI 6.3/6.9, 5.6/5.4, 12.0/6.9 -> 2.8/6.4, 9.2/7.9, 14.9/11.0;
#: MPICH 4.3/3.1, 41.5/7.1, 11.8/2.3 -> 4.5/2.8, 43.9/6.3, 13.2/4.1; Gloo 16.2/5.1, 11.7/2.5,
#: 44.0/13.5 -> 16.0/5.0, 13.4/2.8, 41.7/10.5.  Against the figures of the issue's day (the
#: p50 ones above), all but MPICH's broadcast and all-reduce held out (3 and 11 then) were
#: better; with a spinning release_gather's busiest core setting the pace (3 ranks on 2 cores
#: run as 4 do; 2026-11-29, eighth session) those two went 4.5/2.8 -> 2.8/2.8 and 13.2/4.1 ->
#: 5.1/4.2: all nine are now no worse than that day.
TODAY_2CORE = {
    ("openmpi", "broadcast"): (0.03, 0.07), ("openmpi", "gather"): (0.10, 0.08),
    ("openmpi", "allreduce"): (0.15, 0.11), ("mpich", "broadcast"): (0.03, 0.03),
    ("mpich", "gather"): (0.44, 0.07), ("mpich", "allreduce"): (0.06, 0.05),
    ("gloo", "broadcast"): (0.17, 0.06), ("gloo", "gather"): (0.14, 0.03),
    ("gloo", "allreduce"): (0.42, 0.11),
}

#: The 16-core node's figures, rounded up: issue 17's targets are 15% held out and 10% fitted for
#: every family.  Met held out by all six since 2026-11-28; fitted by three that night.  Before
#: 2026-11-27's changes (under avg): 56/38, 54/32, 22/17, 57/20, 70/33, 38/11; before
#: 2026-11-28's (fresh pages, a binomial gather's contention along its path): Open MPI's
#: gather 12/25 and all-reduce 23/16, MPICH's gather 15/13; before the terms of the part of a
#: byte's cost that contention does not slow (β_core and γ_core, the same evening): Open MPI's
#: broadcast 14/14 and all-reduce 20/12; before Open MPI's rendezvous (α_rndv, that night):
#: its broadcast 12/13, gather 9/16, all-reduce 12/14; the all-reduce 8/10 before each round
#: of recursive halving was counted by its own message's size; before the small pages a single
#: copy pins (α_page, 2026-11-28, late): Open MPI's broadcast 10/14, MPICH's 10/13; before the
#: fit's Huber loss (2026-11-29): Open MPI 8/13, 10/15, 13/9, MPICH 8/10, 10/12, 7/8, when three
#: families met the 10% fitted (its broadcast 7.7/12.8 -> 12.6/9.1 held out/fitted, its gather
#: 9.9/14.3 -> 7.1/13.4, MPICH's gather 9.6/11.4 -> 8.0/7.1), five after it; all six since the
#: cache spills all at once and Open MPI's linear gathers copy the root's own n (2026-11-29,
#: later): Open MPI 12.6/9.1, 7.1/13.4, 11.8/7.2 -> 11.8/7.1, 8.1/9.6, 5.5/7.7; MPICH 9.5/9.8,
#: 8.0/7.1, 6.8/7.0 -> 10.0/9.3, 8.7/7.7, 7.3/7.3.
TODAY_16CORE = {
    ("openmpi", "broadcast"): (0.12, 0.08), ("openmpi", "gather"): (0.09, 0.10),
    ("openmpi", "allreduce"): (0.06, 0.08), ("mpich", "broadcast"): (0.11, 0.10),
    ("mpich", "gather"): (0.09, 0.08), ("mpich", "allreduce"): (0.08, 0.08),
}

#: A second 2-core machine (AMD EPYC of CPU family 26, AVX-512, 2 MiB L2 a core, 32 MiB L3),
#: measured on 2026-11-28 with the model as it stood that night: its figures, rounded up.
#: Fitted on 2 and 3 ranks, predicting 4 (oversubscribed), the model does worse here than on
#: the first 2-core machine: Open MPI's broadcast 28/40 (its times fall from 256 KiB to 1 MiB
#: and rise again at 4 MiB, a knee the one-cache spill term does not have), Gloo's broadcast
#: and all-reduce 49/9 and 38/8 held out.  That knee was the pages: from 4 MiB NumPy's arrays
#: have huge pages, and a single copy from them costs a third (α_page, the same night, late):
#: Open MPI's broadcast went from 28/40 to 36/21 (held out worse: its 4-rank broadcasts,
#: oversubscribed, came out 21-62% short from 1 MiB, before 17-51%, and 34-48% long below),
#: gather 6/12 to 5/9, all-reduce 24/12 to 26/8, MPICH's gather 41/10 to 38/8.  Then a second
#: set of four repetitions, whose points record each rank's huge pages, was merged in (the
#: same machine, an hour later): Open MPI 37/21, 5/15, 20/11; MPICH 10/11, 40/5, 6/3; Gloo
#: 44/5, 5/6, 33/10.  The two sets alone differ more than any model change did (Gloo's
#: gather 26% held out on the first, 6% on the second): these are noisy machines.  With the
#: fit's Huber loss (2026-11-29): Open MPI 37/21, 5/15, 20/11 -> 31/10, 9/10, 20/6 (its gather
#: 4.9% -> 8.5% held out); MPICH 10/11, 40/5, 6/3 -> 4/5, 41/4, 6/3; Gloo 44/5, 5/6, 33/10 ->
#: 44/5, 5/6, 29/7.  With the cache spilling all at once and Open MPI's linear gathers copying
#: the root's own n (2026-11-29, later): Open MPI 30.1/9.6, 8.5/10.0, 19.0/5.6 -> 30.0/12.8,
#: 12.1/8.2, 16.8/5.9; MPICH 3.4/4.4, 40.7/3.8, 5.7/2.8 -> 2.7/3.8, 38.5/3.9, 5.3/2.9; Gloo
#: 43.8/4.4, 4.5/5.5, 28.1/6.7 -> 43.5/2.9, 5.9/6.9, 26.6/5.8.  With a spinning
#: release_gather's busiest core setting the pace (the same day, later): MPICH's broadcast
#: 2.7/3.8 -> 3.6/4.6, all-reduce 5.3/2.9 -> 3.9/2.9.
TODAY_ZEN5_2CORE = {
    ("openmpi", "broadcast"): (0.30, 0.13), ("openmpi", "gather"): (0.13, 0.09),
    ("openmpi", "allreduce"): (0.17, 0.06), ("mpich", "broadcast"): (0.04, 0.05),
    ("mpich", "gather"): (0.39, 0.04), ("mpich", "allreduce"): (0.06, 0.03),
    ("gloo", "broadcast"): (0.44, 0.03), ("gloo", "gather"): (0.06, 0.07),
    ("gloo", "allreduce"): (0.27, 0.06),
}

#: A third 2-core machine, this one an Intel Xeon (family 6 model 207: the CPU of the 16-core
#: node, 2 of its cores in a VM, 260 MiB L3 reported), measured on 2026-12-06 with the model as
#: it stood that day: its figures, rounded up.  Fitted on 2 and 3 ranks, predicting 4
#: (oversubscribed).  Open MPI's broadcast predicts worst (48% held out): its 64 MiB points move
#: 8.9 GB/s at 2 ranks (one copy of memory alone: 10.8 GB/s), 1.5x the per-byte cost at 16 MiB,
#: which the one spill term, fitted at 4 MiB, prices short at 2, 3 and 4 ranks (-37%, -44%,
#: -56%); its 4-rank points at 64-256 KiB come out 50-113% long.
TODAY_XEON_2CORE = {
    ("openmpi", "broadcast"): (0.48, 0.11), ("openmpi", "gather"): (0.22, 0.09),
    ("openmpi", "allreduce"): (0.14, 0.05), ("mpich", "broadcast"): (0.09, 0.03),
    ("mpich", "gather"): (0.26, 0.07), ("mpich", "allreduce"): (0.08, 0.04),
    ("gloo", "broadcast"): (0.27, 0.07), ("gloo", "gather"): (0.26, 0.05),
    ("gloo", "allreduce"): (0.23, 0.12),
}

#: The 2-core machine without the contention term: its info.json predates the copy-bandwidth
#: probe, and with the curve measured later on a machine of its kind (2026-11-25: one copy
#: 15.0 GB/s, two at once 15.7 GB/s together) 4 of its 9 families predicted worse (Gloo
#: allreduce held out 40% -> 52%), 2 better (Open MPI broadcast 38% -> 29%, but fitted 14% ->
#: 21%): docs/benchmarks.md.
MACHINES = (
    Machine("epyc-2core", "ranks=4", TODAY_2CORE, contention=False),
    Machine("h100-16core", "ranks=12:16", TODAY_16CORE),
    Machine("epyc-zen5-2core", "ranks=4", TODAY_ZEN5_2CORE),
    Machine("xeon-2core", "ranks=4", TODAY_XEON_2CORE),
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


def test_ranks_past_the_node_are_not_priced_cheaper(tmp_path):
    """On the first 2-core machine's Open MPI fit, gather's linear_sync at 3 ranks (past the
    node's 2 cores) came out 5x faster than at 2 (108 -> 21 µs at 1 MiB): past the node the
    messages dropped the single copies' page pinning.  They now go as the node moved them."""
    machine = MACHINES[0]
    points = [p for p in points_of(machine, "openmpi", tmp_path) if p["collective"] == "gather"]
    llc = info_of(machine)["cpus"].get("last_level_cache_bytes")
    fit = calibrate(points, summary_bytes=FROM_BYTES, cache=float(llc) if llc else None)
    rows = predict("gather", "library", [2, 3, 4, 5], [1 << 20], fit=fit)
    times = [r["seconds"] for r in rows]
    assert times == sorted(times) and times[1] > 1.5 * times[0], times
