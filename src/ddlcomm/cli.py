"""The ``ddlcomm`` command: parses, checks, and hands over to the pieces.

Every error a user can cause ends with one line on stderr and a non-zero exit:
2 for bad input, 1 when a result failed its check, 3 when a rank failed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import __version__
from .errors import DdlcommError, UsageError

COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {}


def command(name: str):
    """Register a sub-command handler by name."""
    def register(fn):
        COMMANDS[name] = fn
        return fn
    return register


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line (no usage dump)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(message, f"see {self.prog} --help")


DB_HELP = ("results database (default: $DDLCOMM_DB, else "
           "$XDG_DATA_HOME/ddlcomm/ddlcomm.db, i.e. ~/.local/share/ddlcomm/ddlcomm.db)")


def _db_path(args: argparse.Namespace) -> Path:
    from .results import default_db_path
    return Path(args.db).expanduser().resolve() if args.db else default_db_path()


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="PATH", help=DB_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ddlcomm", description=(
        "Measure, model and speed up the communication of distributed deep learning. "
        "Run `ddlcomm bench` for the default suite (broadcast, gather, allreduce; "
        "4B..64MiB; buffer and object form; 2 ranks)."))
    parser.add_argument("--version", action="version", version=f"ddlcomm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    b = sub.add_parser("bench", help="time collectives over a backend, verify and store them",
                       description=(
                           "Time collectives the way OSU and nccl-tests do (warm-up, a barrier "
                           "before each timed call, per-call times per rank), verify every point "
                           "on an untimed call, store the results and write a report. Outside a "
                           "launcher it starts --ranks ranks itself; under mpirun/srun/torchrun "
                           "it runs in the ranks it was given."))
    b.add_argument("--backend", default="mpi",
                   help="communication backend, or a comma list measured side by side in one "
                        "run, interleaved per size: mpi, gloo (default: mpi)")
    b.add_argument("--collective",
                   help="comma list of: broadcast, gather, allgather, reduce, allreduce, "
                        "reduce_scatter, alltoall, barrier (default: broadcast,gather,allreduce)")
    b.add_argument("--workload", help="data-parallel workloads instead of collectives, a comma "
                                      "list measured side by side: ps-sync, ps-async, allreduce")
    b.add_argument("--sizes",
                   help="LO:HI[xF] sweep (powers of F, default x2) or a comma list, "
                        "per-rank message bytes (default: 4B:64MiB)")
    b.add_argument("--model", help="workloads: send a model's gradients, per layer "
                                   "(alexnet, googlenet, resnet50, mobilenet, vgg16)")
    b.add_argument("--fusion", metavar="BYTES",
                   help="workloads with --model: fuse gradients into buckets of at most BYTES "
                        "(e.g. 25MiB; 0: per tensor); without it, one message per layer")
    b.add_argument("--steps", help="workloads: timed steps (ps-async: pushes per worker, default 100)")
    b.add_argument("--path", default="host",
                   help="workloads: data path, host (default) or the GPU paths host-staged, "
                        "direct, nccl-chief (need a GPU)")
    b.add_argument("--dtype", default="float32",
                   help="float16, bfloat16, float32, float64, int32, int64, uint8 (default: float32)")
    b.add_argument("--op", default="sum", help="sum, prod, min, max, avg (default: sum)")
    b.add_argument("--form", choices=["buffer", "object", "both"],
                   help="buffer calls (NumPy arrays), pickled-object calls, or both (default)")
    b.add_argument("--algorithm", default="library",
                   help="comma list of algorithms measured side by side: library (the backend's "
                        "own collective), auto, or ddlcomm's own (ring, rhd, shm, hierarchical, "
                        "binomial, linear, ...; buffer form); NAME+numpy or NAME+c picks the "
                        "reduction kernel (default: the compiled one); default library")
    b.add_argument("--impl", help="implementations side by side, a comma list of c (the C "
                                  "reference, same protocol and buffers), buffer, object; "
                                  "instead of --form")
    b.add_argument("--memory", help="memory kind of the benchmark buffers: pageable, hugepage, "
                                    "numa:N, hbw, shared, pinned, device (default: NumPy's "
                                    "allocator, recorded as numpy)")
    b.add_argument("--hbw-fallback", choices=["dram"],
                   help="with --memory hbw on a machine without high-bandwidth memory: "
                        "use DRAM instead of failing (recorded with every point)")
    b.add_argument("--containers", help="split the ranks into K containers made of Linux "
                                        "namespaces (network, IPC, mount, UTS; needs root)")
    b.add_argument("--bind", default="none", choices=["none", "core", "numa"],
                   help="bind ranks (and containers) to cores or NUMA nodes (default: none)")
    b.add_argument("--in-place", action="store_true", help="reduce in place where the collective can (allreduce, reduce; the "
                        "others run out of place, and each point records which)")
    b.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="verify every point on an untimed call (default: on)")
    b.add_argument("--ranks", help="number of ranks (default: 2, or the launcher's)")
    b.add_argument("--iters", help="timed iterations per point (default: fit --budget)")
    b.add_argument("--warmup", help="untimed warm-up calls per point (default: iters/10, 2..200)")
    b.add_argument("--budget", default="0.2",
                   help="seconds of timed calls per point when --iters is not given (default 0.2)")
    b.add_argument("--timeout", default="120",
                   help="seconds one point may take before every rank is ended (default 120)")
    b.add_argument("--root", default="0", help="root rank of rooted collectives (default 0)")
    _add_db(b)
    b.add_argument("--tag", help="a label stored with the run (recipes find their runs by it)")
    b.add_argument("--report-dir", metavar="DIR",
                   help="where run-N/index.html goes (default: reports/ beside the database)")
    b.add_argument("--no-report", action="store_true", help="do not write the HTML/PNG report")

    r = sub.add_parser("results", help="list, show, export and compare stored runs")
    rsub = r.add_subparsers(dest="results_command", metavar="ACTION", parser_class=_Parser)
    p = rsub.add_parser("list", help="one line per stored run")
    _add_db(p)
    p = rsub.add_parser("show", help="a run's configuration and its tables")
    p.add_argument("run", help="run id")
    _add_db(p)
    p = rsub.add_parser("export", help="points as CSV or JSON (documented in README)")
    p.add_argument("run", nargs="?", help="run id (or --all)")
    p.add_argument("--all", action="store_true", help="every run's points")
    p.add_argument("--format", choices=["csv", "json"], default="json")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    _add_db(p)
    p = rsub.add_parser("compare", help="two runs side by side, ratio per size (B/A)")
    p.add_argument("run_a")
    p.add_argument("run_b")
    _add_db(p)

    rp = sub.add_parser("reproduce", help="run a named published experiment (woo2020, choi2021, "
                                          "shi2018, awan2019)",
                        description="Run a named experiment as a series of `ddlcomm bench` runs in "
                                    "one database and write its report, laid out like the paper's "
                                    "figures. Defaults are scaled to finish in minutes here.")
    rp.add_argument("name", help="woo2020, choi2021, shi2018 or awan2019")
    rp.add_argument("--full", action="store_true", help="the paper's sizes and 1000 repetitions")
    rp.add_argument("--report-only", metavar="TAG",
                    help="run nothing: rewrite the report of an earlier session (its tag, "
                         "e.g. woo2020:2685bee5, printed when it ran)")
    rp.add_argument("--out", metavar="DIR", help="report folder (default: reports/NAME-TAG beside the database)")
    _add_db(rp)

    k = sub.add_parser("kernels", help="time the reduction kernels against NumPy's np.add",
                       description="Reduce two buffers in place with each kernel (NumPy's ufunc, "
                                   "ddlcomm's compiled C kernel) and dtype, rounds interleaved; "
                                   "print the median time, the bandwidth (buffer bytes per "
                                   "second) and its ratio to NumPy's float32 np.add(a, b, out=a) "
                                   "measured in the same rounds.")
    k.add_argument("--dtype", default="float32,float16,bfloat16", help="comma list of dtypes "
                   "(default: float32,float16,bfloat16)")
    k.add_argument("--size", default="256MiB", help="bytes per buffer (default 256MiB)")
    k.add_argument("--op", default="sum", help="sum, prod, min, max (default: sum)")
    k.add_argument("--rounds", default="7", help="timed passes of each kernel (default 7)")
    k.add_argument("--json", action="store_true", help="print JSON records instead of a table")

    rep = sub.add_parser("report", help="(re)write the HTML/PNG report of a stored run")
    rep.add_argument("run", help="run id")
    rep.add_argument("--out", metavar="DIR", help="output folder (default: reports/run-N beside the database)")
    _add_db(rep)
    from .model.cli import add_parser as add_model_parser
    add_model_parser(sub, _Parser)
    from .train.cli import add_parser as add_train_parser
    add_train_parser(sub, _add_db)
    return parser


# ---------------------------------------------------------------- bench
def bench_plan(args: argparse.Namespace, default_ranks: Optional[int]):
    """Check every bench option and return the plan (raises UsageError)."""
    from .bench.plan import BenchPlan
    from .collectives import check_in_place, get_collective
    from .comm import registry
    from .dtypes import get_dtype, get_op
    from .units import parse_positive_int, parse_seconds, parse_size, parse_sizes

    backends = _comma_list(args.backend, "--backend")
    for name in backends:
        registry.get_spec(name)
    dtype = get_dtype(args.dtype)
    op = get_op(args.op)
    ranks = parse_positive_int(args.ranks, "--ranks") if args.ranks is not None else default_ranks
    collectives: list[str] = []
    workloads = _comma_list(args.workload, "--workload") if args.workload is not None else []
    if not workloads:
        for flag in ("model", "fusion", "steps"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag} applies to --workload runs")
        collectives = _comma_list(args.collective or "broadcast,gather,allreduce", "--collective")
        for name in collectives:
            get_collective(name).check_request(op=op, dtype=dtype)
        if args.in_place:
            check_in_place([get_collective(name) for name in collectives])
    elif args.collective is not None:
        raise UsageError("give --collective or --workload, not both")
    sizes = parse_sizes(args.sizes or "4B:64MiB")
    if args.model is not None:
        if args.sizes is not None:
            raise UsageError("give --sizes or --model, not both", "--model sets the sizes")
        from .workloads.base import model_bytes
        sizes = [model_bytes(args.model, dtype.name)]
    elif args.fusion is not None:
        raise UsageError("--fusion applies to --model runs")
    plan = BenchPlan(
        backends=backends, collectives=collectives, sizes=sizes,
        workloads=workloads, model=args.model,
        fusion=parse_size(args.fusion) if args.fusion is not None else None,
        steps=parse_positive_int(args.steps, "--steps") if args.steps is not None else None,
        path=args.path,
        dtype=dtype.name, op=op.name, forms=_forms(args), in_place=args.in_place,
        memory=args.memory, hbw_fallback=args.hbw_fallback, bind=args.bind,
        algorithms=_comma_list(args.algorithm, "--algorithm"),
        containers=parse_positive_int(args.containers, "--containers") if args.containers else 0,
        check=args.check, ranks=ranks,
        iters=parse_positive_int(args.iters, "--iters") if args.iters else None,
        warmup=parse_positive_int(args.warmup, "--warmup", 0) if args.warmup is not None else None,
        budget_s=parse_seconds(args.budget, "--budget"),
        timeout_s=parse_seconds(args.timeout, "--timeout"),
        root=parse_positive_int(args.root, "--root", 0),
        extra={"tag": args.tag} if args.tag else {})
    if ranks is not None and plan.root >= ranks:
        raise UsageError(f"--root {plan.root} is not one of the {ranks} ranks")
    if plan.workloads:
        _check_workloads(plan)
    _check_placement(plan)
    _check_algorithms(plan)
    return plan


def _check_algorithms(plan) -> None:
    if plan.algorithms == ["library"]:
        return
    from .comm.algorithms import check
    for name in plan.collectives:
        for algorithm in plan.algorithms:
            check(name, algorithm)
    if plan.workloads:
        raise UsageError("--algorithm applies to collectives (workloads use the library's)")


def _forms(args: argparse.Namespace) -> list[str]:
    from .bench.plan import parse_forms, parse_impls
    if args.impl is not None and args.form is not None:
        raise UsageError("give --form or --impl, not both", "--impl c,buffer,object covers both")
    return parse_impls(args.impl) if args.impl is not None else parse_forms(args.form or "both")


def _check_placement(plan) -> None:
    """Memory kinds, C reference and containers: refuse now what cannot run here."""
    if plan.memory is not None:
        from . import memory
        memory.check(plan.memory, plan.hbw_fallback)
    elif plan.hbw_fallback is not None:
        raise UsageError("--hbw-fallback applies to --memory hbw")
    if "c" in plan.forms:
        if plan.backends != ["mpi"]:
            raise UsageError("--impl c needs --backend mpi (the C reference calls MPI)")
        if plan.op != "sum" or plan.dtype not in ("float32", "int32", "float64", "int64", "uint8"):
            raise UsageError("--impl c times sum reductions of float32, float64, int32, int64 "
                             "or uint8", "change --op/--dtype or leave c out of --impl")
        bad = [c for c in plan.collectives if c not in ("broadcast", "gather", "allreduce")]
        if bad:
            raise UsageError(f"--impl c has no {', '.join(bad)}",
                             "the C reference times broadcast, gather and allreduce")
    if plan.containers:
        if plan.ranks is not None and plan.containers > plan.ranks:
            raise UsageError(f"--containers {plan.containers} needs at least as many ranks",
                             f"use --ranks {plan.containers} or more")


def _check_workloads(plan) -> None:
    from .workloads import get_workload
    from .workloads.base import check_request
    from .workloads.paths import get_path
    check_request(plan)
    get_path(plan.path)
    for name in plan.workloads:
        workload = get_workload(name)
        if plan.ranks is not None and plan.ranks < workload.min_ranks:
            raise UsageError(f"{name} needs at least {workload.min_ranks} ranks "
                             "(a server and a worker)", f"use --ranks {workload.min_ranks} or more")


def _comma_list(text: str, flag: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UsageError(f"{flag} is empty")
    if len(set(items)) != len(items):
        raise UsageError(f"{flag} names something twice: {text}")
    return items


def _report_dir(args: argparse.Namespace, db: Path) -> Optional[Path]:
    if args.no_report:
        return None
    return Path(args.report_dir).expanduser().resolve() if args.report_dir else db.parent / "reports"


@command("bench")
def cmd_bench(args: argparse.Namespace, argv: list[str]) -> int:
    from .bench import session
    from .bench.plan import check_memory, mem_available
    from .collectives import get_collective
    from .comm import registry
    from .launch.env import detect

    info = detect()
    plan = bench_plan(args, default_ranks=None if info else 2)
    db = _db_path(args)
    for name in plan.backends:
        registry.check(name)
    if info is None:
        if plan.containers:
            from .launch.containers import check_available
            check_available()
        available = mem_available()
        # A workload holds what a gather holds at its server (ps-sync) or less.
        for name in plan.collectives or ["gather"]:
            check_memory(get_collective(name), max(plan.sizes), plan.ranks,
                         "object" in plan.forms and not plan.workloads, available)
        return session.launch(plan, argv, db, _report_dir(args, db))
    return session.rank_main(plan, argv, info, db, _report_dir(args, db))


# ---------------------------------------------------------------- results
def _run_id(text: str) -> int:
    from .units import parse_positive_int
    return parse_positive_int(text, "run id")


@command("results")
def cmd_results(args: argparse.Namespace, argv: list[str]) -> int:
    from .report import tables
    from .results import Store, compare, export

    action = args.results_command
    if action is None:
        raise UsageError("ddlcomm results: say what to do", "list, show, export or compare")
    db = _db_path(args)
    if not db.exists():
        raise UsageError(f"no results database at {db}", "run `ddlcomm bench` first or pass --db")
    with Store(db) as store:
        if action == "list":
            print(tables.render_runs(store.runs()))
        elif action == "show":
            run_id = _run_id(args.run)
            print(tables.render_run(store.run(run_id)))
            points = store.points(run_id)
            from .report import train
            if points:
                print(train.render_summary(points) if train.is_train_run(points)
                      else tables.render_points(points))
        elif action == "export":
            if args.all == (args.run is not None):
                raise UsageError("results export needs a run id or --all, not both")
            points = store.points(None if args.all else _run_id(args.run))
            if not args.all:
                store.run(_run_id(args.run))
            text = export.to_csv(points) if args.format == "csv" else export.to_json(points)
            if args.output:
                Path(args.output).write_text(text)
            else:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
        elif action == "compare":
            a, b = _run_id(args.run_a), _run_id(args.run_b)
            run_a, run_b = store.run(a), store.run(b)
            rows = compare.compare(store.points(a), store.points(b))
            print(tables.render_compare(rows, run_a, run_b))
    return 0


@command("reproduce")
def cmd_reproduce(args: argparse.Namespace, argv: list[str]) -> int:
    from .recipes import get_recipe
    from .recipes.base import new_tag, require_ok, run_steps
    from .results import Store
    from .results.export import point_record

    recipe = get_recipe(args.name)
    db = _db_path(args)
    tag = args.report_only or new_tag(recipe.name)
    if not tag.startswith(recipe.name + ":"):
        raise UsageError(f"tag {tag!r} is not a {recipe.name} session")
    out = Path(args.out).expanduser().resolve() if args.out else \
        db.parent / "reports" / tag.replace(":", "-")
    out.mkdir(parents=True, exist_ok=True)
    results = []
    if args.report_only is None:
        steps = recipe.steps(args.full)
        log = out / "runs.log"
        print(f"{recipe.title}: {len(steps)} runs, tag {tag}, log {log}", flush=True)
        for variant, reason in recipe.unavailable():
            print(f"  not available here: {variant}: {reason}")
        results = run_steps(steps, db, tag, log)
        require_ok(results)
    elif not db.exists():
        raise UsageError(f"no results database at {db}", "pass the --db the session used")
    with Store(db) as store:
        runs = [r for r in store.runs() if (r.get("config") or {}).get("extra", {}).get("tag") == tag]
        points = [point_record(p) for r in sorted(runs, key=lambda r: r["id"])
                  for p in store.points(r["id"])]
    if not points:
        raise UsageError(f"no points of session {tag} in {db}")
    page = recipe.report(recipe, points, out)
    failed = [s.label for s, rc, _ in results if rc != 0]
    if results:
        print(f"{len(results) - len(failed)} of {len(results)} runs completed", end=", ")
    print(f"{len(points)} points, {sum(p['check'] == 'failed' for p in points)} failed checks")
    for label in failed:
        print(f"  FAILED: {label}")
    print(f"database: {db}")
    print(f"report:   {page}")
    return 1 if failed or any(p["check"] == "failed" for p in points) else 0


@command("model")
def cmd_model(args: argparse.Namespace, argv: list[str]) -> int:
    from .model.cli import run
    return run(args, argv)


@command("train")
def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    from .train.cli import run
    db = _db_path(args)
    return run(args, argv, db, _report_dir(args, db))


@command("kernels")
def cmd_kernels(args: argparse.Namespace, argv: list[str]) -> int:
    import json

    from tqdm import tqdm

    from .dtypes import get_dtype
    from .kernels import KERNELS, OPS, available
    from .kernels.bench import measure
    from .report.tables import format_table
    from .units import format_size, parse_positive_int, parse_size

    dtypes = [get_dtype(name).name for name in _comma_list(args.dtype, "--dtype")]
    if args.op not in OPS:
        raise UsageError(f"no reduction kernel for op {args.op!r}", f"choose one of {', '.join(OPS)}")
    nbytes = parse_size(args.size)
    rounds = parse_positive_int(args.rounds, "--rounds")
    kernels = [k for k in KERNELS if not available()[k].startswith("missing")]
    with tqdm(total=rounds * (len(dtypes) * len(kernels) + 1), unit="pass", file=sys.stderr,
              desc=f"kernels {format_size(nbytes)}", leave=False) as bar:
        rows = measure(dtypes, nbytes, kernels, rounds, args.op, progress=bar)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(["dtype", "kernel", "runs on", "size", "median_ms", "GB/s", "vs np.add f32"],
                       [[r["dtype"], r["kernel"], r["runs_on"], format_size(r["bytes"]),
                         f"{r['t_ms']:.2f}", f"{r['GBps']:.2f}", f"{r['vs_np_add']:.2f}x"]
                        for r in rows]))
    for name, state in available().items():
        if state.startswith("missing"):
            print(f"kernel {name}: {state}")
    return 0


@command("report")
def cmd_report(args: argparse.Namespace, argv: list[str]) -> int:
    from .report import html
    from .results import Store

    db = _db_path(args)
    if not db.exists():
        raise UsageError(f"no results database at {db}", "run `ddlcomm bench` first or pass --db")
    run_id = _run_id(args.run)
    with Store(db) as store:
        run, points = store.run(run_id), store.points(run_id)
    if not points:
        raise UsageError(f"run {run_id} has no points to report")
    out = Path(args.out).expanduser().resolve() if args.out else db.parent / "reports" / f"run-{run_id}"
    from .report import train
    write = train.write_train_report if train.is_train_run(points) else html.write_run_report
    print(f"report: {write(run, points, out)}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return COMMANDS[args.command](args, argv)
    except DdlcommError as exc:
        print(f"ddlcomm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddlcomm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
