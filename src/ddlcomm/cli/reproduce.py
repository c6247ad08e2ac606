"""``ddlcomm reproduce NAME``: run a named published experiment (``recipes/``)."""
from __future__ import annotations

import argparse

from ..recipes import get_recipe
from ..recipes.base import FULL_POINT_LIMIT_S, RUN_LIMIT_S, reproduce
from ..errors import UsageError
from ..units import parse_seconds
from . import common


def add_parser(sub) -> None:
    rp = sub.add_parser("reproduce", help="run a named published experiment (woo2020, choi2021, "
                                          "shi2018, awan2019)",
                        description="Run a named experiment as a series of `ddlcomm bench` and "
                                    "`ddlcomm train` runs in one database (woo2020, choi2021 and "
                                    "awan2019's latency half: bench; shi2018 and awan2019's "
                                    "training half: train) and write its report, laid out like "
                                    "the paper's "
                                    "figures. Defaults are scaled to finish in minutes here. "
                                    "$DDLCOMM_RECIPE_DEADLINE_S (seconds from the start) starts no "
                                    "run past it and ends the one running then; the report lists "
                                    "what did not complete, and the exit code is 1.")
    rp.add_argument("name", nargs="?",
                    help="woo2020, choi2021, shi2018 or awan2019 (with --report-only: its tag's)")
    rp.add_argument("--full", action="store_true",
                    help="the paper's sizes and 1000 repetitions (hours: no limit on a run, "
                         f"{FULL_POINT_LIMIT_S // 3600} h on a point)")
    rp.add_argument("--timeout", metavar="S",
                    help=f"seconds one run may take before it is ended (default {RUN_LIMIT_S:g}; "
                         "with --full none)")
    rp.add_argument("--report-only", metavar="TAG",
                    help="run nothing: rewrite the report of an earlier session (its tag, "
                         "e.g. woo2020:2685bee5, printed when it ran)")
    rp.add_argument("--out", metavar="DIR",
                    help="report folder (default: reports/TAG beside the database, ':' as '-', "
                         "e.g. reports/woo2020-2685bee5)")
    common.add_db(rp)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    name = args.name or (args.report_only or "").partition(":")[0]
    if not name:
        raise UsageError("reproduce needs a recipe's name", "woo2020, choi2021, shi2018 or awan2019, or --report-only TAG")
    recipe = get_recipe(name)
    if args.report_only and (args.full or args.timeout is not None):
        raise UsageError(f"{'--full' if args.full else '--timeout'} applies to runs, and "
                         "--report-only runs nothing", "drop one of them")
    timeout_s = None if args.timeout is None else parse_seconds(args.timeout, "--timeout")
    # --report-only reads the database (one on a read-only mount too); a run writes it
    db = common.existing_db(args) if args.report_only else common.db_path(args)
    return reproduce(recipe, db, full=args.full, report_only=args.report_only,
                     out=common.out_dir(args.out, None), timeout_s=timeout_s)
