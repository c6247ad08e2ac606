"""Recipes: every step is a valid bench command line; reports lay points out by panel."""
from __future__ import annotations

import os

import pytest

from ddlcomm.cli import build_parser
from ddlcomm.cli.bench import bench_plan
from ddlcomm.errors import UsageError
from ddlcomm.recipes import RECIPES, get_recipe
from ddlcomm.results import Store


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("full", [False, True])
def test_every_step_parses(name, full):
    recipe = get_recipe(name)
    steps = recipe.steps(full)
    assert steps and len({s.label for s in steps}) == len(steps)
    for step in steps:
        args = build_parser().parse_args([step.command, *step.args])
        if step.command == "train":
            from ddlcomm.cli.train import plan_jobs
            assert plan_jobs(args, None)
            continue
        plan = bench_plan(args, default_ranks=None)
        assert plan.ranks is not None


def test_woo2020_matrix():
    steps = get_recipe("woo2020").steps(False)
    args = [" ".join(s.args) for s in steps]
    assert all("--impl c,buffer,object" in a and "--dtype int32" in a for a in args)
    assert any("--containers 4" in a for a in args) and any("--containers" not in a for a in args)
    assert all("--bind numa" in a for a in args if "--containers" in a)
    full = " ".join(" ".join(s.args) for s in get_recipe("woo2020").steps(True))
    assert f"--sizes {256 << 20}B" in full and "--iters 1000" in full


def test_choi2021_runs_both_mpis_and_lists_gpu_variants():
    from ddlcomm.memory.gpu import cuda_available
    from ddlcomm.recipes import choi2021
    recipe = get_recipe("choi2021")
    assert {s.env for s in recipe.steps(False)} == {"openmpi", "mpich"}
    # every (workload, workers) of the paper once, PS with a server beside its workers
    measured = [(w, n, ranks) for ranks, here in choi2021.by_ranks() for w, n in here]
    assert sorted((w, n) for w, n, _ in measured) == sorted(
        [("ps-sync", n) for n in range(1, 5)] + [("allreduce", n) for n in range(1, 5)])
    assert all(ranks == n + (w == "ps-sync") for w, n, ranks in measured)
    if cuda_available()[0]:
        pytest.skip("this machine has a GPU: the GPU half runs (test_choi2021_gpu_half)")
    variants = [v for v, why in recipe.unavailable()]
    assert "GPU half: NCCL" in variants and "GPU half: CUDA-aware Open MPI (path direct)" in variants
    assert all("torch.cuda.is_available() is False" in why or "PyTorch" in why
               for _, why in recipe.unavailable())
    assert not any("--memory" in " ".join(s.args) for s in recipe.steps(False))


def test_choi2021_gpu_half(monkeypatch):
    """The GPU runs it would make (listed here without running them)."""
    from ddlcomm.recipes import choi2021
    monkeypatch.setattr(choi2021, "cuda_aware_mpis", lambda: {"openmpi": False})
    steps = choi2021.gpu_steps(False)
    args = [" ".join(s.args) for s in steps]
    # one launch a rank count (PS with a worker fewer) x (2 MPIs, NCCL, Gloo) on the host, and
    # the launches holding 4 workers (4 and 5 ranks) with one container per rank too
    assert len(steps) == 5 * 4 + 2 * 4
    assert all("--memory device" in a for a in args)
    assert sum("--workload ps-sync,allreduce " in a for a in args) == 3 * 4 + 4      # 2-4 ranks
    assert sum(a.startswith("--workload allreduce ") for a in args) == 4               # 1 rank
    assert sum(a.startswith("--workload ps-sync ") and "--ranks 5 " in a for a in args) == 4 + 4
    # nccl-chief needs a chief beside rank 0: the 1-rank all-reduce is host-staged only
    assert sum("--path host-staged,nccl-chief" in a for a in args) == 2 * (4 + 2)
    assert sum(a.endswith("--path host-staged") and "--ranks 1 " in a for a in args) == 2
    assert sum("--backend nccl" in a for a in args) == 7 and sum("--backend gloo" in a for a in args) == 7
    apart = [a for a in args if "--containers" in a]
    assert len(apart) == 8 and all(f"--ranks {n} " in a and a.endswith(f"--containers {n}")
                                   for a in apart for n in [a.split()[-1]])
    assert {a.split()[-1] for a in apart} == {"4", "5"}
    full_steps = choi2021.gpu_steps(True)
    full = " ".join(" ".join(s.args) for s in full_steps)
    assert f"--sizes {1 << 30}B" in full and "--steps 1000" in full
    assert len(full_steps) == 20 + 4 * 4      # every launch of 2+ ranks apart too
    monkeypatch.setattr(choi2021, "cuda_aware_mpis", lambda: {"openmpi": True})
    assert any("--path direct" in " ".join(s.args) for s in choi2021.gpu_steps(False))


def test_choi2021_gpu_panels():
    from ddlcomm.recipes import choi2021
    cpu = dict(library="MPICH", memory="numpy", containers=0, ranks=3)
    gpu = dict(library="Open MPI", memory="device", path="host-staged", ranks=3, ranks_per_gpu=[3, 3, 3])
    assert choi2021._panel(cpu) == "MPICH" and choi2021._panel(gpu) == "GPU: Open MPI host-staged"
    assert choi2021._panel(dict(gpu, library="NCCL", path="host")) == "GPU: NCCL"
    assert choi2021._placement(gpu) == "all on the host"
    assert choi2021._placement(dict(gpu, containers=3)) == "one container per rank"
    assert choi2021._placement(dict(cpu, containers=1)) == "all in one container"


def test_choi2021_report_draws_the_gpu_panels(tmp_path):
    from ddlcomm.recipes import choi2021
    from ddlcomm.report import recipe as rr
    def pt(lib, path, memory, ranks):
        return dict(library=lib, backend="mpi", collective="allreduce", phase="allreduce", ranks=ranks,
                    containers=0, memory=memory, path=path, t_avg_us=1.0, t_p50_us=1.0, t_p99_us=1.0,
                    check="passed")
    pts = [pt("MPICH", "host", "numpy", r) for r in (1, 2)] + \
        [pt(lib, path, "device", r) for lib, path in (("Open MPI", "host-staged"), ("Open MPI", "nccl-chief"),
                                                     ("NCCL", "host"), ("Gloo", "host")) for r in (2, 3)]
    gpu = [p for p in pts if p["memory"] == "device"]
    fig = rr._figure(gpu, "GPU all-reduce", choi2021._panel, choi2021._workers, choi2021._placement,
                     "workers", [n for _, n in choi2021.MPIS] + choi2021.GPU_PANELS)
    assert [ax.get_title() for ax in fig.axes] == ["GPU: Open MPI host-staged", "GPU: Open MPI nccl-chief",
                                                    "GPU: NCCL", "GPU: Gloo"]
    assert {choi2021._figure(p) for p in pts} == {"all-reduce", "GPU all-reduce"}


def test_training_recipes():
    shi = get_recipe("shi2018").steps(False)
    assert {s.command for s in shi} == {"train"}
    assert all("--ranks 1,2,4" in " ".join(s.args) and "--overlap both" in " ".join(s.args) for s in shi)
    from ddlcomm.recipes import awan2019
    awan = get_recipe("awan2019").steps(False)
    # Two separable halves: all-reduce latency (bench), then training (train).
    assert awan == awan2019.latency_steps(False) + awan2019.training_steps(False)
    assert [s.command for s in awan] == ["bench"] * 3 + ["train"] * 3
    assert {s.env for s in awan} == {"openmpi", "mpich"}
    assert {" ".join(s.args).split("--backend ")[1].split()[0] for s in awan} == {"mpi", "gloo"}
    latency = " ".join(awan2019.latency_steps(False)[0].args)
    assert "--algorithm library,ring,rhd" in latency and "--sizes 4B:256MiBx4" in latency


def test_awan2019_report_has_both_halves(tmp_path):
    from ddlcomm.recipes import awan2019
    points = [dict(collective="allreduce", backend=b, library=lib, algorithm=a, bytes=s, ranks=2,
                   form="buffer", t_avg_us=1.0 + s / 1e3, t_p50_us=1.0, t_p99_us=2.0,
                   check="passed", run_id=1)
              for b, lib in (("mpi", "Open MPI"), ("mpi", "MPICH"), ("gloo", "Gloo"))
              for a in ("library", "ring", "rhd") for s in (4, 1 << 10, 1 << 20)]
    page = awan2019.report(get_recipe("awan2019"), points, tmp_path)
    assert '<a href="latency/index.html">The all-reduce latency half</a>' in page.read_text()
    latency = (tmp_path / "latency" / "index.html").read_text()
    assert "MPICH" in latency and "<svg" in latency and "1MiB" in latency
    assert 'href="points.csv"' in latency                 # every recipe page links its points
    assert len((tmp_path / "latency" / "points.csv").read_text().splitlines()) == len(points) + 1


def test_awan2019_report_prices_the_kind_cache(tmp_path):
    """Device points priced their look-ups: a page of them, the cache on against off."""
    from ddlcomm.recipes import awan2019
    points = [dict(collective="allreduce", backend="mpi", library="Open MPI", algorithm=a,
                   memory="device", kind_cache=cache, bytes=s, ranks=2, form="buffer",
                   t_avg_us=900.0, t_p50_us=900.0, t_p99_us=950.0, check="passed", run_id=1,
                   kind_lookup_us_per_call=0.4 if cache == "on" else 6.0)
              for a in ("ring", "rhd") for cache in ("on", "off") for s in (4, 1 << 10, 64 << 10)]
    page = awan2019.report(get_recipe("awan2019"), points, tmp_path)
    assert 'href="lookups/index.html"' in page.read_text()
    lookups = (tmp_path / "lookups" / "index.html").read_text()
    assert "GPU: Open MPI" in lookups and "kind cache off" in lookups and "<svg" in lookups
    assert "kind look-ups per call (µs)" in lookups
    # a run without priced look-ups (the CPU half alone) has no such page
    other = tmp_path / "cpu"
    awan2019.report(get_recipe("awan2019"), [dict(p, memory="pageable", kind_cache=None,
                                                  kind_lookup_us_per_call=None) for p in points], other)
    assert not (other / "lookups").exists()


def test_unknown_recipe():
    with pytest.raises(UsageError, match="woo2020"):
        get_recipe("smith1999")


def test_recipe_report_panels(tmp_path):
    from ddlcomm.report.recipe import write_recipe_report
    points = [dict(collective="allreduce", bytes=1 << 20, ranks=r, form=f, memory="pageable",
                   containers=k, t_avg_us=100.0 * r, t_p50_us=90.0, t_p99_us=200.0,
                   check="passed", run_id=1)
              for r in (2, 4) for f in ("c", "buffer") for k in (0, 2)]
    page = write_recipe_report("t", points, tmp_path, figure_of=lambda p: p["collective"],
                               panel_of=lambda p: "host" if not p["containers"] else "2 containers",
                               x_of=lambda p: p["ranks"], line_of=lambda p: p["form"],
                               x_label="processes", panel_order=["host", "2 containers"],
                               unavailable=[("hbw", "no high-bandwidth memory")])
    html = page.read_text()
    assert "<svg" in html and "no high-bandwidth memory" in html and "2 containers" in html
    assert (tmp_path / "allreduce.png").read_bytes()[:4] == b"\x89PNG"


def test_session_tag_and_points(tmp_path):
    from ddlcomm.recipes.base import session_points, session_tag
    from ddlcomm.results import Store
    recipe = get_recipe("woo2020")
    assert session_tag(recipe, None).startswith("woo2020:")
    assert session_tag(recipe, "woo2020:abc") == "woo2020:abc"
    with pytest.raises(UsageError, match="is not a session of woo2020"):
        session_tag(recipe, "choi2021:abc")
    db = tmp_path / "d.db"
    Store(db).close()
    with pytest.raises(UsageError, match="no points of session woo2020:abc"):
        session_points(db, "woo2020:abc")


def test_report_only_without_a_database(tmp_path):
    from ddlcomm.recipes.base import reproduce
    with pytest.raises(UsageError, match="no results database"):
        reproduce(get_recipe("woo2020"), tmp_path / "none.db", report_only="woo2020:abc",
                  out=tmp_path / "out")


def test_report_only_reads_a_database_on_a_read_only_mount(tmp_path):
    """It refused one: "--db ... is not writable" (the check of a run's database)."""
    import subprocess
    import sys
    Store(tmp_path / "r.db").close()
    cmd = [sys.executable, "-m", "ddlcomm", "reproduce", "woo2020", "--report-only", "woo2020:abc",
           "--db", str(tmp_path / "r.db"), "--out", "/tmp"]
    res = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" '
                          '&& shift && exec "$@"', "_", str(tmp_path), *cmd],
                         capture_output=True, text=True, timeout=60)
    if "ddlcomm" not in res.stderr:
        pytest.skip(f"no mount namespace here: {res.stderr.strip()[-200:]}")
    assert res.returncode == 2 and "no points of session woo2020:abc" in res.stderr, res.stderr


@pytest.mark.parametrize("args, said", [
    (["--report-only", "woo2020:abc"], "no points of session woo2020:abc"),   # the name: the tag's
    ([], "reproduce needs a recipe's name"),
])
def test_reproduce_names_its_recipe_or_its_tag_does(tmp_path, args, said):
    import subprocess
    import sys
    Store(tmp_path / "r.db").close()
    res = subprocess.run([sys.executable, "-m", "ddlcomm", "reproduce", *args, "--db", str(tmp_path / "r.db")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and said in res.stderr, res.stderr


def test_awan2019_gpu_half_and_what_does_not_run(monkeypatch):
    """The GPU latency runs it would make, and unavailable() naming exactly those not run."""
    from ddlcomm.recipes import awan2019
    args = [" ".join(s.args) for s in awan2019.gpu_latency_steps(False)]
    assert all("--memory device" in a and "--collective allreduce" in a for a in args)
    assert sum("--backend nccl" in a for a in args) == 1
    assert sum("--path host-staged" in a for a in args) == 2
    assert sum("--algorithm ring,rhd,shm --kind-cache off" in a for a in args) == 3
    assert sum("--kind-cache on" in a for a in args) == 3
    train = awan2019.gpu_training_steps(False)
    assert [s.command for s in train] == ["train"] * 3
    from ddlcomm.cli import build_parser
    for step in train:                                   # the train command takes them
        args = build_parser().parse_args(["train", *step.args])
        assert args.device == "cuda" and args.ranks == "1,2,4" and args.model == "resnet50"
    assert {build_parser().parse_args(["train", *s.args]).algorithm for s in train} == \
        {"library", "shm", "ring"}
    monkeypatch.setattr(awan2019, "cuda_available", lambda: (False, "no CUDA device"))
    missing = dict(awan2019.unavailable())
    assert set(missing) == {f"GPU half: {label}" for label, _, _ in awan2019.GPU_RUNS} \
        | {f"GPU training: {label}" for label, _, _ in awan2019.GPU_TRAINING}
    assert set(missing.values()) == {"no CUDA device"}
    assert not any(s.label.startswith("GPU ") for s in awan2019.steps(False))
    monkeypatch.setattr(awan2019, "cuda_available", lambda: (True, "H100"))
    assert awan2019.unavailable() == []
    # the GPU half first: a run the GPU machine's time limit cuts short keeps it
    labels = [s.label for s in awan2019.steps(False)]
    gpu = [i for i, label in enumerate(labels) if label.startswith("GPU ")]
    assert gpu == list(range(len(gpu))) and len(gpu) < len(labels)


def test_awan2019_gpu_panels_and_lines():
    from ddlcomm.recipes import awan2019
    assert awan2019._library(dict(backend="nccl", memory="device")) == "GPU: NCCL"
    assert awan2019._library(dict(backend="mpi", library="MPICH")) == "MPICH"
    assert awan2019._line(dict(algorithm="ring", kind_cache="off")) == "ring, kind cache off"
    assert awan2019._line(dict(algorithm="library", path="host-staged")) == "library host-staged"


def test_awan2019_latency_draws_a_staged_point_whole(tmp_path):
    from ddlcomm.recipes import awan2019
    pts = [dict(collective="allreduce", backend="mpi", library="Open MPI", algorithm="library",
                path="host-staged", phase=ph, memory="device", bytes=1 << 20, ranks=2, form="buffer",
                t_avg_us=t, t_p50_us=t, t_p99_us=t, check="passed", run_id=1)
           for ph, t in (("allreduce.d2h", 10.0), ("allreduce.allreduce", 50.0), ("allreduce.h2d", 10.0),
                         ("allreduce", 70.0))]
    awan2019.report(get_recipe("awan2019"), pts, tmp_path)
    html = (tmp_path / "latency" / "index.html").read_text()
    assert html.count("<td>library host-staged</td>") == 1 and "70.0" in html


def test_a_recipe_past_its_deadline_runs_no_more_steps_and_says_so(tmp_path, monkeypatch):
    from ddlcomm.recipes import base
    monkeypatch.setenv(base.DEADLINE_ENV, "0")
    steps = [base.Step("a", ("--collective", "barrier"))]
    results = base.run_steps(steps, tmp_path / "d.db", "woo2020:x", tmp_path / "log")
    assert [(s.label, rc) for s, rc, _ in results] == [("a", base.NOT_RUN)]
    page = tmp_path / "index.html"
    page.write_text("<html><body><h1>t</h1></body></html>")
    base._append(page, base._incomplete_html([("a", "not run (deadline, SIGTERM or Ctrl-C)")]))
    assert "Runs that did not complete" in page.read_text() and "not run (deadline, SIGTERM or Ctrl-C)" in page.read_text()


def test_a_recipe_page_names_its_session_and_runs(tmp_path):
    from ddlcomm.recipes import base
    from ddlcomm.report.recipe import session_section
    db = tmp_path / "d.db"
    with Store(db) as store:
        mine = store.create_run({"host": "node<1>", "cpu_model": "EPYC", "cores": 16,
                                 "mpi_library": "Open MPI", "mpi_version": "5.0.11",
                                 "git_commit": "0123456789abcdef", "command": "ddlcomm bench",
                                 "config": {"extra": {"tag": "woo2020:abc"}},
                                 "load": {"ranks": 4, "usable_cores": 2, "wall_s": 1.0}})
        store.create_run({"host": "elsewhere", "config": {"extra": {"tag": "woo2020:zzz"}}})
    runs = base.session_runs(db, "woo2020:abc")
    assert [r["id"] for r in runs] == [mine]
    html = session_section("woo2020:abc", db, runs)
    assert f"ddlcomm reproduce woo2020 --report-only woo2020:abc --db {db}" in html
    assert "node&lt;1&gt;" in html and "Open MPI 5.0.11" in html and "0123456789ab<" in html
    assert "oversubscribed: 4 ranks on 2 usable CPUs" in html and "elsewhere" not in html


def test_full_runs_have_no_run_limit_and_hours_per_point():
    """--full (1 GiB, 1000 repetitions) could not finish: each point was ended at bench's
    120 s and each run at 900 s."""
    from ddlcomm.recipes import base
    assert base.limits(False, None) == (base.RUN_LIMIT_S, ())
    assert base.limits(False, 60.0) == (60.0, ())
    point = ("--timeout", f"{base.FULL_POINT_LIMIT_S:g}")
    assert base.limits(True, None) == (None, point)
    assert base.limits(True, 7200.0) == (7200.0, point)
    assert base._sooner(None, None) is None and base._sooner(None, 5.0) == 5.0
    assert base._sooner(900.0, 30.0) == 30.0


def test_a_rewritten_report_lists_what_its_session_could_not_run(tmp_path):
    """--report-only on another machine listed that machine's missing variants (a GPU
    machine's session rebuilt here said its GPU half was unavailable beside its GPU panels)."""
    from ddlcomm.recipes import base
    there = base.Recipe("r", "t", lambda full: [], lambda: [("GPU half", "no GPU there")], None)
    here = base.Recipe("r", "t", lambda full: [], lambda: [], None)
    assert base.session_unavailable(there, tmp_path, None) == [("GPU half", "no GPU there")]
    assert base.session_unavailable(here, tmp_path, "r:abc") == [("GPU half", "no GPU there")]
    (tmp_path / base.UNAVAILABLE_FILE).unlink()
    assert base.session_unavailable(there, tmp_path, "r:abc") == [("GPU half", "no GPU there")]


def test_a_rewritten_report_lists_the_runs_that_did_not_complete(tmp_path):
    """--report-only dropped the list (it knew only the exit codes of steps it ran)."""
    from ddlcomm.recipes import base
    results = [(base.Step("a", ()), 0, 1.0), (base.Step("b", ()), base.NOT_RUN, 0.0),
               (base.Step("c", ()), 3, 2.0)]
    ran = base.session_incomplete(tmp_path, results, None)
    assert ran == [("b", "not run (deadline, SIGTERM or Ctrl-C)"), ("c", "failed (exit 3)")]
    assert base.session_incomplete(tmp_path, [], "r:abc") == ran
    assert base.session_incomplete(tmp_path / "elsewhere", [], "r:abc") == []
    # rewritten into another folder (--out): the session's own folder has the list
    assert base.session_incomplete(tmp_path / "elsewhere", [], "r:abc", tmp_path) == ran


def test_a_session_killed_outright_leaves_its_list(tmp_path):
    """The list was written at the session's end only, and into --out only: after a kill -9,
    or rewritten without the same --out, an unfinished session read as complete (exit 0)."""
    from ddlcomm.recipes import base
    steps = [base.Step(name, ()) for name in "abc"]
    out, home = tmp_path / "out", tmp_path / "home"
    base.session_incomplete(out, [(steps[0], 0, 1.0), (steps[1], 130, 1.0)], None, home, steps)
    want = [("b", "interrupted (exit 130)"), ("c", "not completed (the session ended before it did)")]
    assert base.session_incomplete(tmp_path / "elsewhere", [], "r:abc", home) == want
    assert base.session_incomplete(out, [], "r:abc") == want


def test_report_only_of_a_missing_session_makes_no_folder(tmp_path):
    from ddlcomm.recipes.base import reproduce
    from ddlcomm.results import Store
    Store(tmp_path / "d.db").close()
    with pytest.raises(UsageError, match="no points of session"):
        reproduce(get_recipe("woo2020"), tmp_path / "d.db", report_only="woo2020:abc")
    assert not (tmp_path / "reports").exists()


def test_a_report_names_the_cores_of_the_machine_its_runs_ran_on():
    from ddlcomm.recipes import base
    assert base.cores_of([{"run_cores": 16}, {"run_cores": None}]) == 16
    assert base.cores_of([{"run_cores": None}]) == (os.cpu_count() or 1)


def test_every_run_gets_the_extra_options(tmp_path):
    from ddlcomm.recipes import base
    steps = [base.Step("bad", ("--collective", "nope"))]       # refused at once, exit 2
    results = base.run_steps(steps, tmp_path / "d.db", "woo2020:x", tmp_path / "log", None,
                             ("--timeout", "21600"))
    assert [rc for _, rc, _ in results] == [2]
    assert "--collective nope --timeout 21600 --db" in (tmp_path / "log").read_text()


def test_a_recipe_figure_draws_panels_it_was_not_told_of(tmp_path):
    """A figure whose points are all in panels outside panel_order (a GPU-only session of
    choi2021 before its GPU panels were listed) drew zero panels: matplotlib raised."""
    from ddlcomm.report.recipe import write_recipe_report
    pts = [dict(collective="allreduce", ranks=r, t_avg_us=1.0, t_p50_us=1.0, t_p99_us=1.0,
                check="passed", run_id=1, lib=lib) for r in (2, 3) for lib in ("x", "y")]
    page = write_recipe_report("t", pts, tmp_path, figure_of=lambda p: "f", panel_of=lambda p: p["lib"],
                               x_of=lambda p: p["ranks"], line_of=lambda p: "l", x_label="ranks",
                               panel_order=["z"])
    assert "<svg" in page.read_text()


def test_a_deadline_that_is_not_seconds_is_refused_before_anything_starts(tmp_path, monkeypatch):
    from ddlcomm.recipes import base
    assert base.deadline_s({}) is None and base.deadline_s({base.DEADLINE_ENV: "0"}) == 0.0
    monkeypatch.setenv(base.DEADLINE_ENV, "abc")
    with pytest.raises(UsageError, match="must be a number of seconds"):
        base.reproduce(get_recipe("shi2018"), tmp_path / "d.db")
    assert not (tmp_path / "reports").exists()


def test_choi2021_runs_each_cpu_placement_once(monkeypatch):
    """One worker's all-reduce is one rank in one container either way: it ran twice, and
    both points were drawn on one line."""
    from ddlcomm.recipes import choi2021
    monkeypatch.setattr(choi2021, "containers_here", lambda: (True, ""))
    steps = choi2021.cpu_steps(False)
    # 5 rank counts x 2 placements, less the one rank in one container per rank, per MPI
    assert len({(s.env, s.args) for s in steps}) == len(steps) == 2 * (5 * 2 - 1)
    assert "openmpi 1 rank (allreduce 1 worker), all in one container" in [s.label for s in steps]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_starts_no_more_steps(tmp_path, monkeypatch, sig):
    """Ctrl-C (a terminal's SIGINT to the whole group) during a recipe ended it with no
    report and no list of the runs it never started; now it stops as SIGTERM does."""
    import signal
    from ddlcomm.recipes import base
    ran = []

    def step(cmd, out, timeout_s, running):   # the running step gets the signal too: exit 130
        ran.append(cmd)
        os.kill(os.getpid(), getattr(signal, sig))
        return 130
    monkeypatch.setattr(base, "_run_step", step)
    before = signal.getsignal(signal.SIGINT)
    steps = [base.Step(name, ("--collective", "barrier")) for name in "abc"]
    results = base.run_steps(steps, tmp_path / "d.db", "woo2020:x", tmp_path / "log")
    assert len(ran) == 1 and [rc for _, rc, _ in results] == [130, base.NOT_RUN, base.NOT_RUN]
    assert signal.getsignal(signal.SIGINT) is before                   # handlers given back


def test_a_sigterm_to_the_recipe_alone_ends_the_running_step(tmp_path, monkeypatch):
    """`kill -TERM` of `ddlcomm reproduce` let the run going finish (it was stored passed),
    where README says it ends, marked interrupted."""
    import signal
    from ddlcomm.recipes import base
    sent = []

    class Step:                              # the step's process, as run_steps sees it
        def send_signal(self, signum):
            sent.append(signum)

    def step(cmd, out, timeout_s, running):
        running.append(Step())
        os.kill(os.getpid(), signal.SIGTERM)    # to the recipe's process alone
        running.clear()
        return 130
    monkeypatch.setattr(base, "_run_step", step)
    results = base.run_steps([base.Step(n, ()) for n in "ab"], tmp_path / "d.db", "woo2020:x",
                             tmp_path / "log")
    assert sent == [signal.SIGTERM] and [rc for _, rc, _ in results] == [130, base.NOT_RUN]


def test_a_session_that_stored_no_point_still_writes_its_report(tmp_path, monkeypatch, capsys):
    """Past its deadline (or a Ctrl-C in its first run) a session said 'no results database
    at ...' and exited 2 with no report."""
    from ddlcomm.recipes import base
    monkeypatch.setenv(base.DEADLINE_ENV, "0")
    assert base.reproduce(get_recipe("shi2018"), tmp_path / "d.db") == 1
    out = capsys.readouterr()
    assert "no run of the session started" in out.err and "0 of 3 runs completed" in out.out
    (page,) = (tmp_path / "reports").glob("shi2018-*/index.html")
    assert "not run (deadline, SIGTERM or Ctrl-C)" in page.read_text()


def test_oversubscribed_rank_counts_are_shaded_on_recipe_figures(tmp_path):
    """README: woo2020's process counts past the cores are marked; only a note said so."""
    from ddlcomm.report.recipe import _figure
    pts = [dict(collective="allreduce", bytes=1 << 20, ranks=r, form="buffer", t_avg_us=10.0 * r,
                check="passed", run_cores=2) for r in (1, 2, 3, 4)]
    fig = _figure(pts, "t", lambda p: "host", lambda p: p["ranks"], lambda p: p["form"],
                  "processes", ["host"])
    spans = [p for p in fig.axes[0].patches if p.get_label().startswith("more ranks than CPUs")]
    assert len(spans) == 1
    x0, x1 = spans[0].get_x(), spans[0].get_x() + spans[0].get_width()
    assert (x0, x1) == (2.5, 4.5)
    quiet = _figure([dict(p, run_cores=8) for p in pts], "t", lambda p: "host",
                    lambda p: p["ranks"], lambda p: p["form"], "processes", ["host"])
    assert not quiet.axes[0].patches


def test_a_recipe_figure_of_small_times_is_in_microseconds():
    from ddlcomm.report.recipe import _figure
    pts = [dict(ranks=r, form="buffer", t_avg_us=t, check="passed") for r, t in ((2, 3.0), (4, 9.0))]
    fig = _figure(pts, "t", lambda p: "host", lambda p: p["ranks"], lambda p: p["form"], "ranks", ["host"])
    assert fig.axes[0].get_ylabel() == "avg time per call (µs)"
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [3.0, 9.0]
    big = _figure([dict(p, t_avg_us=p["t_avg_us"] * 1e3) for p in pts], "t", lambda p: "host",
                  lambda p: p["ranks"], lambda p: p["form"], "ranks", ["host"])
    assert big.axes[0].get_ylabel() == "avg time per call (ms)"
    assert list(big.axes[0].get_lines()[0].get_ydata()) == [3.0, 9.0]


@pytest.mark.parametrize("name", ["choi2021", "awan2019"])
def test_a_report_speaks_of_gpu_panels_only_where_it_has_some(name, monkeypatch, tmp_path):
    """A CPU machine's awan2019 latency page described "GPU panels" it did not have."""
    import importlib
    module = importlib.import_module(f"ddlcomm.recipes.{name}")
    said = []
    monkeypatch.setattr(module, "write_recipe_report", lambda *a, notes=(), **k: said.append(notes))
    if hasattr(module, "write_train_report"):
        monkeypatch.setattr(module, "write_train_report", lambda *a, **k: None)
    if hasattr(module, "select"):
        monkeypatch.setattr(module, "select", lambda points: points)
    cpu = dict(collective="allreduce", library="Open MPI", backend="mpi", memory="numpy", ranks=2,
               bytes=4, phase=None)
    for points, gpu in (([cpu], False), ([cpu, {**cpu, "memory": "device"}], True)):
        said.clear()
        module.report(get_recipe(name), points, tmp_path)
        assert any("GPU panels" in note for note in said[0]) == gpu, said


@pytest.mark.parametrize("apart", [True, False])
def test_woo2020_runs_containers_only_where_they_can_run(monkeypatch, apart):
    """Without namespaces its 20 of 28 container steps failed one by one ('failed (exit 2)')
    and the recipe exited 1; choi2021 listed the reason instead, as woo2020 now does."""
    from ddlcomm.recipes import woo2020
    monkeypatch.setattr(woo2020, "containers_here", lambda: (apart, "" if apart else "no user namespaces"))
    steps = woo2020.steps(False)
    assert any("--containers" in s.args for s in steps) == apart and steps
    said = dict(woo2020.unavailable())
    assert ("ranks in 1, 2 and 4 containers" in said) == (not apart)
    if not apart:
        assert said["ranks in 1, 2 and 4 containers"] == "no user namespaces"
