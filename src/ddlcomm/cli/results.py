"""``ddlcomm results list|show|export|compare|versus|merge``: stored runs, one handler per action."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from ..errors import StoreError, UsageError
from ..outputs import write_text
from ..report import tables, train
from ..results import Store, compare, export, merge, versus
from ..results.store import NewerSchema
from ..collectives import get_collective
from ..comm import algorithms
from ..units import counted, format_size, parse_size
from . import common
from .common import _Parser


def add_parser(sub) -> None:
    r = sub.add_parser("results", help="list, show, export, compare, versus and merge stored runs")
    rsub = r.add_subparsers(dest="results_command", metavar="ACTION", parser_class=_Parser)
    p = rsub.add_parser("list", help="one line per stored run")
    common.add_db(p)
    p = rsub.add_parser("show", help="a run's configuration and its tables")
    p.add_argument("run", help="run id")
    common.add_db(p)
    p = rsub.add_parser("export", help="points as CSV or JSON (documented in README)")
    p.add_argument("run", nargs="?", help="run id (or --all)")
    p.add_argument("--all", action="store_true", help="every run's points")
    p.add_argument("--format", choices=["csv", "json"], default="json", help="default json")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout (`-`: stdout)")
    common.add_db(p)
    p = rsub.add_parser("compare", help="two runs side by side, ratio per size (B/A)")
    p.add_argument("run_a", help="the run id of the baseline (`ddlcomm results list`)")
    p.add_argument("run_b", help="the run id compared with it (ratios are B over A)")
    common.add_db(p)
    p = rsub.add_parser(
        "versus", help="the library against ddlcomm's own algorithms, measured side by side",
        description="Every run of the database that measured the library beside ddlcomm's own "
        "algorithms (bench --algorithm library,ring,rhd,shm,auto): per library, memory, dtype and rank "
        "count, each size's p50 of every algorithm (median over the runs), the library's time "
        "over the best own algorithm's, auto's over the library's, and the best own over the "
        "floor measured in the same run (x_add: one np.add pass; x_floor: one device copy). "
        "Ratios are taken within each run. Below each table: the lowest speed-up from "
        "--speedup-from, the highest floor ratio from --floor-from, the highest auto/library "
        "below --auto-below.")
    p.add_argument("--collective", default="allreduce", help="default: allreduce")
    p.add_argument("--from", dest="from_size", default="4B", metavar="SIZE",
                   help="sizes from this one (default 4B)")
    p.add_argument("--speedup-from", default="1MiB", metavar="SIZE", help="default 1MiB")
    p.add_argument("--floor-from", default="16MiB", metavar="SIZE", help="default 16MiB")
    p.add_argument("--auto-below", default="1MiB", metavar="SIZE", help="default 1MiB")
    p.add_argument("--markdown", action="store_true", help="Markdown tables (docs/benchmarks.md)")
    common.add_db(p)
    p = rsub.add_parser(
        "merge", help="copy every run of other databases into this one",
        description="Copy every run of each SOURCE database, with its points, into the database "
        "(--db; made if there is none), under new run ids. A run the database holds already "
        "(the same start, host, owner and command) is not taken twice, so merging again is "
        "harmless; one merged while it ran is brought up to date (its points and status). A "
        "source's runs killed mid-way keep every point they stored.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="a database to copy from")
    p.add_argument("--one-machine", action="store_true",
                   help="refuse, writing nothing, unless every run (the database's own "
                        "included) has the same CPU model and core count")
    common.add_db(p)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    action = args.results_command
    if action is None:
        raise UsageError("ddlcomm results: say what to do", "list, show, export, compare, versus or merge")
    db = common.db_path(args) if action == "merge" else common.existing_db(args)
    if action == "merge":
        args.sources = merge_sources(args.sources, db)      # before the database is made
        if args.one_machine:
            merge.check_one_machine([*([db] if db.exists() else []), *args.sources])
    with Store(db, readonly=action != "merge") as store:
        ACTIONS[action](store, args)
    return 0


def list_runs(store: Store, args: argparse.Namespace) -> None:
    print(tables.render_runs(store.runs()))


def show(store: Store, args: argparse.Namespace) -> None:
    run_id = common.run_id(args.run)
    print(tables.render_run(store.run(run_id)))
    points = store.points(run_id)
    if not points:
        print("(no points)")
    else:
        print(train.render_summary(points) if train.is_train_run(points)
              else tables.render_points(points))


def export_points(store: Store, args: argparse.Namespace) -> None:
    if args.all and args.run is not None:
        raise UsageError("results export takes a run id or --all, not both")
    if not args.all and args.run is None:
        raise UsageError("results export needs a run id or --all", "see `ddlcomm results list`")
    output = common.out_file(args.output, "-o") if args.output not in (None, "-") else None
    points = store.points(None if args.all else common.run_id(args.run))    # no such run: raises
    text = export.to_csv(points) if args.format == "csv" else export.to_json(points)
    if output is not None:
        write_text(output, text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def compare_runs(store: Store, args: argparse.Namespace) -> None:
    a, b = common.run_id(args.run_a), common.run_id(args.run_b)
    run_a, run_b = store.run(a), store.run(b)
    rows = compare.compare(store.points(a), store.points(b))
    print(tables.render_compare(rows, run_a, run_b))
    apart = compare.unmatched(rows)
    if apart:
        print(f"note: no point of run {a} matches one of run {b}: they differ in "
              f"{', '.join(apart)}", file=sys.stderr)


def merge_sources(names: list[str], db: Path) -> list[Path]:
    """The databases to merge from, each checked readable as a results database."""
    sources = []
    for name in names:
        path = Path(name).expanduser()
        if not path.is_file():
            raise UsageError(f"no database at {path}", "name SQLite files that ddlcomm wrote")
        if path.resolve() == db.resolve():
            raise UsageError(f"{path} is the database merged into (--db)", "name other databases")
        try:
            Store(path, readonly=True).close()
        except NewerSchema as exc:           # said of the source, not of --db
            raise StoreError(exc.args[0], "upgrade ddlcomm to merge it") from None
        except StoreError as exc:
            raise StoreError(exc.args[0], "merge from databases that ddlcomm wrote") from None
        sources.append(path)
    return sources


def merge_runs(store: Store, args: argparse.Namespace) -> None:
    def said(done: merge.Merged) -> None:
        print(f"{done.source}: {counted(done.runs, 'run')} ({counted(done.points, 'point')}) merged"
              + (f", {done.updated} brought up to date (merged before while running)" if done.updated else "")
              + (f", {done.already} already here" if done.already else ""), flush=True)
    try:
        merge.merge(store, args.sources, False, said)     # --one-machine: checked in run()
    except KeyboardInterrupt:
        print("ddlcomm: the runs merged so far are whole and stay; merging again takes the "
              "rest (a run already there is not taken twice)", file=sys.stderr)
        raise


def versus_runs(store: Store, args: argparse.Namespace) -> None:
    goals = {"speedup_from": parse_size(args.speedup_from, "--speedup-from"),
             "floor_from": parse_size(args.floor_from, "--floor-from"),
             "auto_below": parse_size(args.auto_below, "--auto-below")}
    get_collective(args.collective)                  # one line for a name that is none
    from_bytes = parse_size(args.from_size, "--from")
    found = versus.versus(map(export.point_record, store.points(None)), args.collective, from_bytes)
    if not found:                                    # say what was asked, not just "no run"
        own = [name for name in algorithms.names(args.collective) if name not in ("library", "auto")]
        print(f"(no run measured {args.collective}'s library beside an own algorithm or auto"
              + (f" at {format_size(from_bytes)} or more" if from_bytes > 4 else "")
              + (f": ddlcomm bench --collective {args.collective} --algorithm "
                 f"{','.join(['library', *own, 'auto'])})" if own else
                 f": ddlcomm has none for {args.collective})"))
        return
    print(tables.render_versus(found, goals, args.markdown))


#: action -> its handler (the store open, the parsed options)
ACTIONS: dict[str, Callable[[Store, argparse.Namespace], None]] = {
    "list": list_runs, "show": show, "export": export_points, "compare": compare_runs,
    "versus": versus_runs, "merge": merge_runs,
}
