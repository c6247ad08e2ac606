"""``ddlcomm report RUN``: (re)write a stored run's HTML/PNG report."""
from __future__ import annotations

import argparse

from ..errors import UsageError
from ..report import html, train
from ..results import Store
from . import common


def add_parser(sub) -> None:
    rep = sub.add_parser("report", help="(re)write the HTML/PNG report of a stored run")
    rep.add_argument("run", help="run id")
    rep.add_argument("--out", metavar="DIR",
                     help="output folder (default: reports/run-N beside the database; "
                          "reports/NAME/run-N for a database NAME.db other than ddlcomm.db)")
    common.add_db(rep)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    db = common.existing_db(args)
    run_id = common.run_id(args.run)
    out = common.out_dir(args.out, common.reports_beside(db) / f"run-{run_id}")
    with Store(db, readonly=True) as store:
        stored, points = store.run(run_id), store.points(run_id)
    if not points:
        raise UsageError(f"run {run_id} has no points to report")
    write = train.write_train_report if train.is_train_run(points) else html.write_run_report
    print(f"report: {write(stored, points, out)}")
    return 0
