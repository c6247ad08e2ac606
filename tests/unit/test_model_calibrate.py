"""Calibration: known α, β, γ recovered from synthetic points; holdout; fit files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ddlcomm.errors import UsageError
from ddlcomm.model import calibrate as cal
from ddlcomm.model import costs
from ddlcomm.model.costs import Params, Setting
from ddlcomm.report.model import render_fit

SIZES = [4 << k for k in range(0, 25, 2)]          # 4 B .. 64 MiB by 4x


def synthetic(params: dict[str, Params], ranks=(2, 3, 4), cores=2, noise=0.0, seed=0,
              library="Open MPI") -> list[dict]:
    """Points whose times are exactly (or noisily) the model's with ``params`` per collective."""
    rng = np.random.default_rng(seed)
    out = []
    for coll, prm in params.items():
        for p in ranks:
            for n in SIZES:
                t = costs.time(coll, "library", p, n, prm,
                               Setting(library=library, ranks_per_node=p, cores=cores))
                t *= 1 + noise * rng.standard_normal()
                out.append({"run_id": p, "backend": "mpi", "library": library,
                            "collective": coll, "form": "buffer", "algorithm": "library",
                            "bytes": n, "ranks": p, "t_p50_us": t * 1e6, "check": "passed",
                            "containers": 0, "memory": "numpy", "bind": "none",
                            "host_cores": cores})
    return out


#: The gather's β_over is 0: Open MPI's gathers at 2 and 3 ranks copy one at a time,
#: which costs it no per-byte wait (costs.waits_per_byte), so a fit of them cannot see
#: it, and the held-out 4 ranks would not be predicted exactly.
TRUE = {"allreduce": Params(2e-6, 1e-10, 3e-10, 5e-6, 4e-10),
        "broadcast": Params(1e-6, 2e-10, 0.0, 3e-6, 1e-10),
        "gather": Params(1.5e-6, 1.5e-10, 0.0, 3e-6, 0.0)}


def test_recovers_known_parameters():
    fit = cal.calibrate(synthetic(TRUE))
    assert len(fit.groups) == 3
    for g in fit.groups:
        want = TRUE[g.key["collective"]]
        for name in cal.COLUMNS:
            assert getattr(g.params, name) == pytest.approx(getattr(want, name), rel=1e-6,
                                                            abs=1e-15)
        assert g.max_rel_err < 1e-6
        assert g.cores == 2


def _exact(true: Params, ranks, cores: int, collective: str = "allreduce", library: str = "MPICH",
           **node) -> list[dict]:
    """Points whose times are exactly the model's with ``true`` for ``library``'s
    ``collective``, every rank on one node of ``cores`` (``node``: the rest of its
    :class:`Setting`)."""
    points = []
    for p in ranks:
        for n in SIZES:
            t = costs.time(collective, "library", p, n, true,
                           Setting(library=library, ranks_per_node=p, cores=cores, **node))
            points.append({"run_id": p, "backend": "mpi", "library": library,
                           "collective": collective, "form": "buffer", "algorithm": "library",
                           "bytes": n, "ranks": p, "t_p50_us": t * 1e6, "check": "passed",
                           "host_cores": cores})
    return points


def test_recovers_the_spill_term():
    cache = 8 << 20
    true = Params(2e-6, 1e-10, 3e-10, 5e-6, 4e-10, beta_spill=2e-10)
    points = _exact(true, (2, 3, 4), cores=2, cache=cache)
    fit = cal.calibrate(points, cache=cache)
    (g,) = fit.groups
    assert g.params.beta_spill == pytest.approx(2e-10, rel=1e-6)
    assert g.max_rel_err < 1e-6
    assert fit.cache == cache and fit.params_for("allreduce")[1].cache == cache
    # without the cache the same points cannot be fitted exactly
    assert cal.calibrate(points).groups[0].max_rel_err > 0.01


#: A node's copy bandwidth by copies at once (bytes/s together): each of 8 copies 1.6x slower
#: than one alone, each of 16 2.4x.
CURVE = ((1, 8e9), (2, 15.5e9), (4, 30e9), (8, 40e9), (16, 53e9))


def test_splits_a_bytes_cost_by_what_contention_slows():
    """Part of a byte's cost is the memory's, which copies at once slow (β, γ), part the
    core's own (β_core, γ_core): fitted on 2-8 ranks, the split predicts 16."""
    true = Params(2e-6, 1e-10, 2e-10, beta_core=3e-10, gamma_core=1e-10)
    fit = cal.calibrate(_exact(true, (2, 4, 8, 16), cores=16, bandwidth=CURVE), bandwidth=CURVE,
                        holdout=[cal.parse_holdout("ranks=16")])
    (g,) = fit.groups
    for name in ("alpha", "beta", "gamma", "beta_core", "gamma_core"):
        assert getattr(g.params, name) == pytest.approx(getattr(true, name), rel=1e-6)
    assert fit.meta["summary"]["heldout"]["max_rel_err"] < 1e-6
    # all of it priced as contended, the 16 ranks come out slow
    whole = Params(2e-6, 4e-10, 3e-10)
    slow = cal.calibrate(_exact(whole, (2, 4, 8), cores=16, bandwidth=CURVE)
                         + _exact(true, (16,), cores=16, bandwidth=CURVE),
                         bandwidth=CURVE, holdout=[cal.parse_holdout("ranks=16")])
    assert slow.groups[0].params.beta_core == 0 and slow.meta["summary"]["heldout"]["median_rel_err"] > 0.1


def test_recovers_open_mpis_rendezvous_handshake():
    """Open MPI's messages of 4 KiB and more go by rendezvous: α_rndv per such message on
    the critical path, fitted beside α; without it the same points cannot be fitted."""
    true = Params(1e-6, 1e-10, 2e-10, alpha_rndv=3e-6)
    points = _exact(true, (2, 4, 8), cores=16, collective="gather", library="Open MPI")
    (g,) = cal.calibrate(points).groups
    assert g.params.alpha_rndv == pytest.approx(3e-6, rel=1e-6) and g.max_rel_err < 1e-6
    plain = _exact(Params(1e-6, 1e-10, 2e-10), (2, 4, 8), cores=16, collective="gather",
                   library="Open MPI")
    assert cal.calibrate(plain).groups[0].params.alpha_rndv == 0


def test_recovers_the_cost_of_a_single_copys_small_pages():
    """α_page per small page a single copy pins, fitted where the points' runs say the THP
    mode (``with_cores`` reads it from their machine facts); the fit keeps the mode, and its
    predictions price the pages with it."""
    true = Params(1e-6, 1e-10, alpha_rndv=2e-6, alpha_page=1.5e-7)
    points = [dict(pt, host_thp="madvise") for pt in
              _exact(true, (2, 4, 8), cores=16, collective="broadcast", library="Open MPI", thp="madvise")]
    fit = cal.calibrate(points)
    (g,) = fit.groups
    assert g.params.alpha_page == pytest.approx(1.5e-7, rel=1e-6) and g.max_rel_err < 1e-6
    assert fit.thp == "madvise" and fit.params_for("broadcast")[1].thp == "madvise"
    assert cal.Fit.from_dict(json.loads(json.dumps(fit.to_dict()))).thp == "madvise"
    unknown = cal.calibrate([dict(pt, host_thp=None) for pt in points])
    assert unknown.thp is None and unknown.groups[0].params.alpha_page == 0
    assert cal.calibrate(points + [dict(points[0], host_thp=None, run_id=99)]).thp == "madvise"
    assert cal.calibrate(points + [dict(points[0], host_thp="never", run_id=99)]).thp is None
    # where a point recorded its ranks' huge pages, they decide, whatever its size
    measured = []
    for i, pt in enumerate(points):
        share = (0.2, 0.9, 0.5)[i % 3]
        t = costs.time("broadcast", "library", pt["ranks"], pt["bytes"], true,
                       Setting(library="Open MPI", ranks_per_node=pt["ranks"], cores=16,
                               thp="madvise", huge_share=share))
        measured.append(dict(pt, t_p50_us=t * 1e6, pages={"memory": "numpy", "huge_share_ranks": [share] * 2}))
    fit = cal.calibrate(measured)
    (g,) = fit.groups
    assert g.params.alpha_page == pytest.approx(1.5e-7, rel=1e-6) and g.max_rel_err < 1e-6
    assert fit.meta["pages_measured"] == fit.meta["points_fitted"] == len(measured)
    from ddlcomm.report.model import render_fit
    assert f"transparent huge pages: madvise; the senders' pages measured at {len(measured)} of " \
        f"{len(measured)} points" in render_fit(fit)
    assert "transparent huge pages: not known (no page term)" in render_fit(unknown)


def test_points_take_their_runs_cores_and_thp_mode():
    runs = [{"id": 1, "cores": 16, "machine": {"memory": {"thp": {"enabled": "madvise"}}}},
            {"id": 2, "cores": 2, "machine": None}]
    got = cal.with_cores([{"run_id": 1}, {"run_id": 2}, {"run_id": 3}], runs, "a.db")
    assert [(p["host_cores"], p["host_thp"], p["source"]) for p in got] == \
        [(16, "madvise", "a.db"), (2, None, "a.db"), (None, None, "a.db")]
    assert cal.memory_of("host,memory=hugepage,bind=core") == "hugepage"
    assert cal.memory_of("host,bind=core") is None and cal.memory_of(None) is None


def test_without_contention_the_core_terms_are_left_out():
    """With c = 1 throughout (no copy bandwidth known) the core columns are the β and γ
    columns: β and γ take them, as before the core terms."""
    true = Params(2e-6, 1e-10, 2e-10, beta_core=3e-10, gamma_core=1e-10)
    (g,) = cal.calibrate(_exact(true, (2, 4, 8), cores=16, bandwidth=None)).groups
    assert g.params.beta_core == 0 and g.params.gamma_core == 0
    assert g.params.beta == pytest.approx(4e-10, rel=1e-6)
    assert g.params.gamma == pytest.approx(3e-10, rel=1e-6)


def test_each_set_fits_its_own_cache_from_the_reported_one():
    """A VM reports its host's last-level cache (300 MiB on the 16-core node); each
    parameter set finds the cache its points spill at, the reported one halved."""
    true = Params(2e-6, 1e-10, 3e-10, beta_spill=4e-10)
    points = [pt for coll, cache in (("allreduce", 4 << 20), ("broadcast", 16 << 20))
              for pt in _exact(true, (2, 4), cores=8, collective=coll, cache=cache)]
    fit = cal.calibrate(points, cache=64 << 20)
    caches = {g.key["collective"]: g.cache for g in fit.groups}
    assert caches == {"allreduce": 4 << 20, "broadcast": 16 << 20}
    assert all(g.max_rel_err < 1e-6 for g in fit.groups)
    assert fit.cache == 64 << 20 and fit.params_for("broadcast")[1].cache == 16 << 20
    # kept in the fit file
    again = cal.Fit.from_dict(fit.to_dict())
    assert {g.key["collective"]: g.cache for g in again.groups} == caches


def test_holdout_ranks_predicted():
    fit = cal.calibrate(synthetic(TRUE), holdout=[cal.parse_holdout("ranks=4")])
    held = [r for r in fit.residuals if r["heldout"]]
    assert held and all(r["ranks"] == 4 for r in held)
    assert len(held) == 3 * len(SIZES)
    assert fit.meta["summary"]["heldout"]["max_rel_err"] < 1e-6
    assert all(g.points == 2 * len(SIZES) for g in fit.groups)


def test_noisy_points_median_error():
    fit = cal.calibrate(synthetic(TRUE, noise=0.05), holdout=[cal.parse_holdout("ranks=4")])
    assert fit.meta["summary"]["heldout"]["median_rel_err"] < 0.1


def test_shared_and_split_groups():
    fit = cal.calibrate(synthetic(TRUE), shared=True)
    assert [g.key["collective"] for g in fit.groups] == ["*"]
    # every collective's points are fitted: the repeats of a point were keyed by the set's
    # key, whose collective is "*", so only the fastest collective at each size was kept
    assert len(fit.residuals) == len(synthetic(TRUE))
    fit = cal.calibrate(synthetic(TRUE), split=[65536])
    regimes = sorted({g.key["regime"] for g in fit.groups})
    assert regimes == ["*:64KiB", "64KiB:*"]
    small = fit.select("allreduce", "library", 1024)
    large = fit.select("allreduce", "library", 1 << 20)
    assert (small.key["regime"], large.key["regime"]) == ("*:64KiB", "64KiB:*")
    # a split no unit writes exactly: its label was '~97.7KiB', which no prediction could read
    fit = cal.calibrate(synthetic(TRUE), split=[100000])
    assert sorted({g.key["regime"] for g in fit.groups}) == ["*:100000B", "100000B:*"]
    assert fit.select("allreduce", "library", 99999).key["regime"] == "*:100000B"
    assert fit.select("allreduce", "library", 100000).key["regime"] == "100000B:*"
    # nor one a unit writes with a fraction ('1.5KiB': parse_size takes no fractions)
    fit = cal.calibrate(synthetic(TRUE), split=[1536])
    assert sorted({g.key["regime"] for g in fit.groups}) == ["*:1536B", "1536B:*"]
    assert fit.select("allreduce", "library", 1536).key["regime"] == "1536B:*"


def test_weighting_is_relative():
    # one big point off by 2x must not swamp the small ones: they stay exact
    pts = synthetic({"gather": TRUE["gather"]}, ranks=(2,))
    pts[-1]["t_p50_us"] *= 2
    fit = cal.calibrate(pts)
    errs = sorted(abs(r["rel_err"]) for r in fit.residuals)
    assert errs[len(errs) // 2] < 0.05


def test_a_few_disturbed_points_do_not_bend_the_fit():
    # Huber's loss: five points measured 2x slow (a noisy neighbour) pull the fit by their
    # sign only, so the rest stay (nearly) exact and the parameters true; least squares
    # alone (no reweighting) leaves the median point 2.7% off here
    pts = synthetic({"broadcast": TRUE["broadcast"]})
    for i in (5, 9, 17, 22, 30):
        pts[i]["t_p50_us"] *= 2.0
    fit = cal.calibrate(pts)
    (g,) = fit.groups
    assert g.median_rel_err < 0.005
    assert fit.meta["beyond_delta"] == 5          # the disturbed ones, which the report counts
    assert "(5 of the 39 fitted points beyond δ" in render_fit(fit)
    for name in ("alpha", "beta", "alpha_over"):
        assert getattr(g.params, name) == pytest.approx(getattr(TRUE["broadcast"], name), rel=0.01)


@pytest.mark.parametrize("errors, loss", [
    ([0.0], 0.0), ([0.1], 0.005), ([-0.1], 0.005), ([0.05, -0.3], 0.00125 + 0.1 * (0.3 - 0.05)),
])
def test_huber_loss(errors, loss):
    assert cal.huber(errors) == pytest.approx(loss)


def test_skips_what_it_cannot_fit():
    pts = synthetic({"gather": TRUE["gather"]}, ranks=(2,))
    pts += [dict(pts[0], check="failed"), dict(pts[0], collective="alltoall"),
            dict(pts[0], t_p50_us=0), dict(pts[0], workload="ps-sync", phase="step")]
    assert len(cal.make_rows(pts)) == len(SIZES)
    with pytest.raises(UsageError, match="no stored points"):
        cal.calibrate([dict(pts[0], check="failed")])


def test_nnls_matches_known_solution():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x = cal.nnls(a, np.array([1.0, -1.0, 0.0]))
    assert x[1] == 0 and x[0] == pytest.approx(0.5)
    x = cal.nnls(a, a @ np.array([2.0, 3.0]))
    assert x == pytest.approx([2.0, 3.0])


@pytest.mark.parametrize("text, point, hit", [
    ("ranks=4", {"ranks": 4}, True), ("ranks=4", {"ranks": 3}, False),
    ("ranks=4:64", {"ranks": 8}, True), ("ranks=2,3", {"ranks": 4}, False),
    ("bytes=1MiB:64MiB", {"bytes": 1 << 20}, True), ("bytes=64KiB,1MiB", {"bytes": 4}, False),
    ("run=7", {"run_id": 7}, True),
])
def test_holdout_specs(text, point, hit):
    assert cal.parse_holdout(text).matches(point) is hit


@pytest.mark.parametrize("text", ["ranks", "size=4", "ranks=", "ranks=8:4", "ranks=x", "ranks=0"])
def test_bad_holdout(text):
    with pytest.raises(UsageError):
        cal.parse_holdout(text)


def test_fit_file_round_trip(tmp_path):
    fit = cal.calibrate(synthetic(TRUE))
    path = fit.save(tmp_path / "fit.json")
    back = cal.load(path)
    assert [g.params for g in back.groups] == [g.params for g in fit.groups]
    params, setting = back.params_for("allreduce", "ring", 1 << 20)
    assert params.alpha == pytest.approx(TRUE["allreduce"].alpha) and setting.library == "Open MPI"
    old = json.loads(path.read_text()) | {"single_copy": True}     # a key earlier fits wrote
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert cal.load(tmp_path / "old.json").params_for("allreduce", "ring", 1 << 20) == (params, setting)
    assert costs.allreduce_time(back, "ring", 4, 1 << 20) == pytest.approx(
        costs.time("allreduce", "ring", 4, 1 << 20, TRUE["allreduce"]), rel=1e-6)
    with pytest.raises(UsageError, match="no fitted parameters"):
        back.select("allreduce", library="MPICH")
    with pytest.raises(UsageError, match="no fit file"):
        cal.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UsageError, match="not a ddlcomm fit"):
        cal.load(tmp_path / "bad.json")


def test_several_libraries_need_a_choice():
    pts = synthetic({"allreduce": TRUE["allreduce"]}) + \
        synthetic({"allreduce": TRUE["allreduce"]}, library="MPICH")
    fit = cal.calibrate(pts)
    with pytest.raises(UsageError, match="--library"):
        fit.select("allreduce")
    assert fit.select("allreduce", library="mpich").key["library"] == "MPICH"


def test_repeated_points_combine():
    clean = synthetic({"gather": TRUE["gather"]}, ranks=(2, 3))
    slow = [dict(p, run_id=p["run_id"] + 10, t_p50_us=p["t_p50_us"] * 3) for p in clean]
    fit = cal.calibrate(clean + slow)                       # min: the undisturbed runs win
    assert fit.groups[0].max_rel_err < 1e-6
    assert all(r["repeats"] == 2 for r in fit.residuals)
    assert len(fit.residuals) == len(clean)
    assert len(cal.calibrate(clean + slow, combine="none").residuals) == 2 * len(clean)
    med = cal.calibrate(clean + slow + slow, combine="median")
    assert med.groups[0].params.beta == pytest.approx(3 * TRUE["gather"].beta, rel=1e-6)
    # of two runs, the median lies between them (it was the faster one: min again)
    med = cal.calibrate(clean + slow, combine="median")
    assert med.groups[0].params.beta == pytest.approx(2 * TRUE["gather"].beta, rel=1e-6)
    assert [r["repeats"] for r in med.residuals] == [2] * len(clean)
    with pytest.raises(UsageError, match="combine"):
        cal.calibrate(clean, combine="mean")
    ops = [dict(p, op=op) for p in clean for op in ("sum", "max")]   # not repeats of each other
    assert len(cal.calibrate(ops).residuals) == 2 * len(clean)


def test_a_holdout_that_matches_no_point_is_refused():
    """--holdout ranks=99 left the fit untested and said nothing ('held out - (0)')."""
    from ddlcomm.errors import UsageError
    from ddlcomm.model.calibrate import calibrate, parse_holdout
    points = [dict(backend="mpi", library="Open MPI", collective="allreduce", form="buffer",
                   algorithm="library", dtype="float32", op="sum", bytes=b, count=b // 4, ranks=r,
                   root=0, in_place=False, t_avg_us=5.0 + b / 1e3 * r, t_min_us=5.0, t_p50_us=5.0,
                   check="passed", extra={}, run_id=1)
              for r in (2, 3) for b in (1024, 65536, 1 << 20)]
    with pytest.raises(UsageError) as err:
        calibrate(points, holdout=[parse_holdout("ranks=99")])
    assert str(err.value) == "--holdout ranks=99 matches no point (the points have ranks 2, 3)"
    with pytest.raises(UsageError, match=r"the points have bytes 1KiB, 64KiB, 1MiB"):
        calibrate(points, holdout=[parse_holdout("bytes=2MiB:4MiB")])


def test_notes_say_what_the_fitted_points_cannot_fix():
    """MPICH's 3 ranks on 2 cores held out, 2 ranks fitted: alpha_over and beta_over came out
    0 and the held-out points were off by up to -98%, with no word why."""
    fit = cal.calibrate(synthetic(TRUE, ranks=(2, 3)), holdout=[cal.parse_holdout("ranks=3")])
    over = [n for n in fit.meta["notes"] if "no fitted point had more ranks than cores" in n]
    assert len(over) == 3 and over[0].startswith("mpi/Open MPI/host/buffer/library/")
    assert not cal.calibrate(synthetic(TRUE, ranks=(2, 3))).meta["notes"]
    few = [p for p in synthetic(TRUE, ranks=(2,)) if p["bytes"] in (4, 16)]
    assert "fitted from 2 point(s) at 2 size(s)" in cal.calibrate(few).meta["notes"][0]


def test_a_run_holdout_over_several_databases_says_so():
    """run ids count in each database: --holdout run=1 over two held out both runs 1."""
    a = [dict(p, source="a.db") for p in synthetic(TRUE, ranks=(2, 3))]
    b = [dict(p, source="b.db") for p in synthetic(TRUE, ranks=(4,))]
    fit = cal.calibrate(a + b, holdout=[cal.parse_holdout("run=2")])
    assert fit.meta["notes"] == []                          # run 2 only in a.db
    b = [dict(p, run_id=2) for p in b]
    fit = cal.calibrate(a + b, holdout=[cal.parse_holdout("run=2")])
    assert "--holdout run=2 held out that run id in each of 2 databases: a.db, b.db" in fit.meta["notes"]


def test_points_the_model_cannot_price_are_counted_and_a_kernel_suffix_is_priced_by_its_algorithm():
    # ring+numpy and shm@256KiB were skipped in silence (no such cost), 1-rank points fitted
    # as 0 s (every error -100%); with nothing else left the error named no reason
    pts = synthetic({"allreduce": TRUE["allreduce"]})
    ring = [dict(p, algorithm="ring+numpy") for p in pts]
    single = [dict(p, ranks=1) for p in pts[:3]]
    fit = cal.calibrate(pts + ring + single)
    assert {g.key["algorithm"] for g in fit.groups} == {"library", "ring+numpy"}
    assert all(r["ranks"] > 1 for r in fit.residuals)
    assert "3 point(s) skipped: 1 rank: no message to model" in fit.meta["notes"]
    hier = [dict(p, algorithm="hierarchical") for p in pts]
    with pytest.raises(UsageError, match=r"can fit; 3 .* 39 point\(s\) skipped: allreduce by hierarchical"):
        cal.calibrate(hier + single)


def test_a_fit_across_containers_predicts_its_own_points_as_it_fitted_them():
    """MPICH's all-reduce fitted across 2 containers (no shared memory between them: rhd)
    was predicted as its one-node release_gather, 2.7x the fit's own model at 1 MiB (ranks
    within the cores: past them a prediction prices several nodes, as its note says)."""
    from ddlcomm.model.predict import predict
    pts = [dict(p, containers=2, hosts=["c0"] * (-(-p["ranks"] // 2)) + ["c1"] * (p["ranks"] // 2))
           for p in synthetic({"allreduce": TRUE["allreduce"]}, cores=4, library="MPICH")]
    fit = cal.calibrate(pts)
    for r in fit.residuals:
        (row,) = predict("allreduce", "library", [r["ranks"]], [r["bytes"]], fit=fit)
        assert row["ran_as"] == r["model_algorithm"], (r["ranks"], r["bytes"])
        assert row["seconds"] == pytest.approx(r["model_s"], rel=1e-9)


def test_a_skipped_point_says_why_the_model_cannot_price_it():
    """Every refusal read 'an algorithm the model does not price', NCCL's library too."""
    pts = [dict(backend="nccl", library="NCCL 2.21.5", collective="allreduce", form="buffer",
                algorithm="library", dtype="float32", op="sum", bytes=b, count=b // 4, ranks=2,
                root=0, in_place=False, t_avg_us=5.0, t_min_us=5.0, t_p50_us=5.0,
                check="passed", extra={}, run_id=1) for b in (1024, 65536)]
    with pytest.raises(UsageError, match="allreduce by library: no default-algorithm rules "
                                         "for library 'NCCL 2.21.5'"):
        cal.calibrate(pts)
