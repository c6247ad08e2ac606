"""What the command modules share: the one-line-error parser and the options
every stored-results command has (``--db``, the report folder, run ids)."""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Optional

from ..bench.plan import MAX_RANKS_PER_CPU
from ..errors import UsageError
from ..outputs import writable_dir, writable_file
from ..results import default_db_path
from ..results.store import DB_ENV
from ..units import parse_positive_int

DB_HELP = ("results database (default: $DDLCOMM_DB, else "
           "$XDG_DATA_HOME/ddlcomm/ddlcomm.db, i.e. ~/.local/share/ddlcomm/ddlcomm.db)")


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line (no usage dump), and ``-1e-6`` is a value (a
    negative number in exponent form, which argparse took for an option: "expected one
    argument"), so the option's own check refuses it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # a negative number, or size ("-1MiB"), is a value (refused by its option), not a flag
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?[a-zA-Z]*$")

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(message, f"see {self.prog} --help")


def add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="PATH", help=DB_HELP)


def add_oversubscribe(p: argparse.ArgumentParser) -> None:
    """``--oversubscribe``, for the commands that start ranks themselves (bench, train)."""
    p.add_argument("--oversubscribe", action="store_true",
                   help=f"start more than {MAX_RANKS_PER_CPU} ranks per CPU this process may use anyway "
                        "(refused without it)")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Where a run goes, for the commands that own one (bench, train)."""
    add_db(p)
    p.add_argument("--tag", help="a label stored with the run (recipes find their runs by it)")
    p.add_argument("--report-dir", metavar="DIR",
                   help="where run-N/index.html goes (default: reports/ beside the database, "
                        "reports/NAME/ beside a database NAME.db other than ddlcomm.db)")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML/PNG report")


def _db(args: argparse.Namespace) -> Path:
    return Path(args.db).expanduser().resolve() if args.db else default_db_path()


def db_path(args: argparse.Namespace) -> Path:
    """The database a run writes, checked writable before the run starts."""
    # by its real path: SQLite keeps its journal beside the name a database is opened by
    return out_file(args.db, "--db", real=True) if args.db else writable_file(default_db_path(), db_flag(None))


def db_flag(given: Optional[str]) -> str:
    """What named the database, for its errors: ``--db``, else ``$DDLCOMM_DB`` or the
    default path."""
    if given:
        return "--db"
    return DB_ENV if os.environ.get(DB_ENV) else "the default database"


def out_file(text: str, flag: str, real: bool = False) -> Path:
    """A file the command will write, from ``flag``'s ``text``, checked writable up front;
    ``DIR/`` (a folder that does not exist yet) is refused, not written as a file ``DIR``.
    A link is written through (``/dev/stdout``), or resolved to its target where ``real``."""
    if not text.strip():
        raise UsageError(f"{flag} needs a file name, got an empty one")
    if text.endswith(("/", os.sep)):
        raise UsageError(f"{flag} {text} names a folder, not a file", f"give {flag} a file name")
    path = Path(text).expanduser()
    return writable_file(path.resolve() if real else path.parent.resolve() / path.name, flag)


def existing_db(args: argparse.Namespace) -> Path:
    """The database to read; UsageError if there is none yet."""
    return existing(_db(args), db_flag(args.db))


def existing(db: Path, flag: str = "--db") -> Path:
    """``db`` if it is a file there is (UsageError: none yet, or a folder)."""
    if db.is_dir():
        raise UsageError(f"{flag} {db} is a folder, not a database file", "name the .db file in it")
    if not db.exists():
        raise UsageError(f"no results database at {db}", "run `ddlcomm bench` first or pass --db")
    return db


def reports_beside(db: Path) -> Path:
    """The folder of a database's run reports: ``reports`` beside it, ``reports/NAME`` for
    a database ``NAME.db`` other than ``ddlcomm.db`` (two databases in one folder would
    otherwise write their run 1 into one ``run-1``)."""
    return db.parent / "reports" if db.name == "ddlcomm.db" else db.parent / "reports" / db.stem


def report_dir(args: argparse.Namespace, db: Path) -> Optional[Path]:
    """Where a run's report goes (None with ``--no-report``), checked writable up front."""
    if args.no_report:
        return None
    path = Path(args.report_dir).expanduser().resolve() if args.report_dir else reports_beside(db)
    return writable_dir(path, "--report-dir", default=not args.report_dir)


def out_dir(text: Optional[str], default: Optional[Path]) -> Optional[Path]:
    """An ``--out DIR`` option, or ``default``; checked writable up front."""
    if text is not None and not text.strip():
        raise UsageError("--out needs a folder, got an empty one")
    path = Path(text).expanduser().resolve() if text else default
    return writable_dir(path, "--out", default=not text) if path is not None else None


def run_id(text: str) -> int:
    """A run's id: SQLite's integers end at 2^63 - 1."""
    return parse_positive_int(text, "run id", maximum=2**63 - 1)
