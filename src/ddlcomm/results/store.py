"""The results database: one SQLite file holding runs and their measured points.

Only this module speaks SQL.  A *run* is one invocation of a benchmark (who,
when, machine, software, configuration); a *point* is the measurement of one
collective at one message size (see :data:`POINT_FIELDS`).

Two processes may write the same file at once (the launcher marks a run
failed while rank 0 is still adding points), so the database uses WAL
journalling and a 30 s busy timeout, and every write is its own transaction,
committed at once: a crash keeps every point completed before it.

The schema is versioned: :data:`MIGRATIONS` is an ordered list, entry *i*
taking the schema from version *i* to *i + 1*; the version reached is kept
in the ``meta`` table.  A later version adds a migration (e.g. ``ALTER TABLE
points ADD COLUMN ...``) and the new field to :data:`POINT_FIELDS`; never edit
a migration that has shipped.
"""
from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from contextlib import contextmanager
from datetime import datetime, timezone
from numbers import Integral, Real
from pathlib import Path
from typing import Any, Iterator

from ..errors import StoreError
from ..units import shell_join
from ..launch.processes import owner_gone, this_process
from .export import strict

#: Seconds a writer waits for another process's lock before giving up.
BUSY_TIMEOUT_S = 30.0

#: Ordered schema migrations; entry i takes the schema from version i to i+1.
MIGRATIONS: list[tuple[str, ...]] = [
    # 1: runs and points.
    (
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            started_at TEXT NOT NULL, ended_at TEXT,
            status TEXT NOT NULL, error TEXT,
            host TEXT, cpu_model TEXT, cores INTEGER, os TEXT, python TEXT,
            mpi_library TEXT, mpi_version TEXT, ddlcomm_version TEXT, git_commit TEXT,
            command TEXT, config TEXT)""",
        """CREATE TABLE points (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            backend TEXT, library TEXT, library_version TEXT,
            collective TEXT, form TEXT, algorithm TEXT, dtype TEXT, op TEXT,
            bytes INTEGER, count INTEGER, ranks INTEGER, root INTEGER, in_place INTEGER,
            iterations INTEGER, warmup INTEGER,
            t_min_us REAL, t_avg_us REAL, t_max_us REAL, t_p50_us REAL, t_p99_us REAL,
            algbw_GBps REAL, busbw_GBps REAL,
            "check" TEXT NOT NULL, error TEXT, extra TEXT,
            UNIQUE (run_id, seq))""",
    ),
    # 2: the machine's facts (ddlcomm info) with every run.
    ("ALTER TABLE runs ADD COLUMN machine TEXT",),
    # 3: the process that owns a run (host, pid, start time), to tell a stale run.
    ("ALTER TABLE runs ADD COLUMN owner TEXT",),
    # 4: how busy the machine was around the run (machine/load.py's record).
    ("ALTER TABLE runs ADD COLUMN load TEXT",),
    # 5: the last word from a running run (made, a point, an update), to tell a stale run
    # from any host: one silent for longer than its steps may take cannot be running.
    ("ALTER TABLE runs ADD COLUMN seen_at TEXT",),
]

#: Version of the schema this code writes (the number of migrations).
SCHEMA_VERSION = len(MIGRATIONS)

#: Run fields and their kinds (``str``, ``int``, ``json``), in column order.
RUN_FIELDS: dict[str, str] = {
    "started_at": "str", "ended_at": "str", "status": "str", "error": "str",
    "host": "str", "cpu_model": "str", "cores": "int", "os": "str", "python": "str",
    "mpi_library": "str", "mpi_version": "str", "ddlcomm_version": "str",
    "git_commit": "str", "command": "str", "config": "json", "machine": "json",
    "owner": "json", "load": "json", "seen_at": "str",
}

#: Point fields and their kinds (``str``, ``int``, ``float``, ``bool``, ``json``).
#: Times are microseconds; bandwidths GB/s (10^9 bytes per second); ``bytes``
#: is the message size in bytes.
POINT_FIELDS: dict[str, str] = {
    "backend": "str", "library": "str", "library_version": "str",
    "collective": "str", "form": "str", "algorithm": "str", "dtype": "str", "op": "str",
    "bytes": "int", "count": "int", "ranks": "int", "root": "int", "in_place": "bool",
    "iterations": "int", "warmup": "int",
    "t_min_us": "float", "t_avg_us": "float", "t_max_us": "float",
    "t_p50_us": "float", "t_p99_us": "float",
    "algbw_GBps": "float", "busbw_GBps": "float",
    "check": "str", "error": "str", "extra": "json",
}

RUN_STATUSES = ("running", "passed", "failed", "interrupted")
#: How a run that did not finish by itself ends (see :meth:`Store.end_if_running`).
ENDINGS = ("failed", "interrupted")
CHECK_VALUES = ("passed", "failed", "skipped")

# Keys that points() adds and add_point() therefore ignores (so a point read
# from one store can be added to another).
_POINT_READ_ONLY = ("run_id",)


#: The variable naming the database (every command's default; the owner's to its ranks).
DB_ENV = "DDLCOMM_DB"


def default_db_path() -> Path:
    """Where results go unless told otherwise.

    ``$DDLCOMM_DB`` if set, else ``$XDG_DATA_HOME/ddlcomm/ddlcomm.db``
    (``$XDG_DATA_HOME`` defaulting to ``~/.local/share``; a relative value is
    ignored, as the XDG spec asks).
    """
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "ddlcomm" / "ddlcomm.db"


#: How long a run whose steps have no stored limit may go without a word (seconds).
SILENT_S = 3600.0


def silent_limit(run: dict[str, Any]) -> float:
    """How long ``run`` may go without a word while it lives: twice its steps' limit (the
    watchdog ends a step past ``timeout_s``) and 5 minutes for starting and reporting."""
    timeout = (run.get("config") or {}).get("timeout_s") if isinstance(run.get("config"), dict) else None
    return 2 * float(timeout) + 300 if isinstance(timeout, (int, float)) and timeout > 0 else SILENT_S


def stale_why(run: dict[str, Any], now: datetime | None = None) -> str:
    """Why a ``running`` run cannot be running any more, or '' where it may be: its owner
    died on this host, or (from any host) nothing was heard from it for longer than it
    may be silent (:func:`silent_limit`; a node lost, ranks killed outright)."""
    if owner_gone(run.get("owner")):
        return "its owner died"
    seen = run.get("seen_at") or run.get("started_at")
    try:
        quiet = ((now or datetime.now(timezone.utc)) - datetime.fromisoformat(seen)).total_seconds()
    except (TypeError, ValueError):
        return ""
    if quiet <= silent_limit(run):
        return ""
    took = f"{quiet / 3600:.1f} h" if quiet >= 5400 else f"{quiet / 60:.0f} min"
    return f"nothing heard from it for {took}: its owner died or its node was lost"


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _json_default(value: Any) -> Any:
    """Let paths go into JSON (:func:`~ddlcomm.results.export.strict` made the rest plain)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _to_column(what: str, name: str, kind: str, value: Any) -> Any:
    """Check ``value`` against ``kind`` and convert it to what SQLite stores."""
    if value is None:
        return None
    ok = True
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "int":
        ok = isinstance(value, Integral)
        value = int(value) if ok else value
    elif kind == "float":
        ok = isinstance(value, Real)
        value = float(value) if ok else value
    elif kind == "bool":
        ok = value in (0, 1)       # True/False, 0/1, numpy bools
        value = int(bool(value)) if ok else value
    elif kind == "json":
        ok = isinstance(value, dict)
        if ok:
            try:
                # strict JSON (NaN as null): SQLite's json_extract refuses NaN
                value = json.dumps(strict(value), default=_json_default, sort_keys=False)
            except (TypeError, ValueError) as e:
                raise StoreError(f"{what} field {name!r} cannot be stored as JSON: {e}") from None
    if not ok:
        want = {"str": "a string", "int": "an integer", "float": "a number",
                "bool": "a boolean", "json": "a dict"}[kind]
        raise StoreError(f"{what} field {name!r} must be {want}, got {value!r}")
    return value


def _from_column(kind: str, value: Any) -> Any:
    """Undo :func:`_to_column`."""
    if kind == "bool":
        return None if value is None else bool(value)
    if kind == "json":
        return {} if value is None else json.loads(value)
    return value


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None where there is none."""
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    return st.st_dev, st.st_ino


def rescue_path(db_path: Path, run_id: int) -> Path:
    """Where a rank saves run ``run_id``'s database when its file was removed or replaced
    while the run wrote it: beside it where its folder is left, else in the working folder."""
    name = f"{db_path.name}.run{run_id}-rescued"
    return db_path.parent / name if db_path.parent.is_dir() else Path.cwd() / name


class NewerSchema(StoreError):
    """A database of a schema this ddlcomm does not know: a newer ddlcomm wrote it."""


class Store:
    """A results database at ``path`` (created, with its folders, if missing).

    Use as a context manager or call :meth:`close`.  ``path`` may be
    ``":memory:"`` for a private in-memory database (tests).
    """

    def __init__(self, path: str | os.PathLike[str], readonly: bool = False) -> None:
        self.path = str(path)
        self._db: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        if self.path != ":memory:" and not readonly:
            try:
                Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the folder of database {self.path}: {e}",
                                 "give --db (or DDLCOMM_DB) a writable path") from None
        try:
            self._db = self._connect(readonly)
            if readonly and self._check_readable():     # an older schema: read through a copy
                self._upgraded_copy()
            elif not readonly:
                self._open_schema()
            self._identity = _identity(self.path)
        except sqlite3.DatabaseError as e:
            self.close()
            msg = str(e)
            if "malformed" in msg:
                raise StoreError(f"{self.path} is a damaged SQLite database ({msg})",
                                 f"`sqlite3 {self.path} .recover | sqlite3 NEW.db` saves what it "
                                 "can; or give --db (or DDLCOMM_DB) another path") from None
            if "not a database" in msg or "encrypted" in msg:
                raise StoreError(f"{self.path} is not an SQLite database ({msg})",
                                 "move it away, or give --db (or DDLCOMM_DB) another path") from None
            raise StoreError(f"cannot open database {self.path}: {msg}") from None
        except StoreError:
            self.close()
            raise

    def _upgraded_copy(self) -> None:
        """Read a database of an older schema through a copy in memory brought up to this
        one: the file is left as it is (it was upgraded in place, and switched to WAL, by
        commands that only read it, a merge's sources too; an older ddlcomm then refused it,
        and one on read-only storage could not be read at all)."""
        mem = sqlite3.connect(":memory:", isolation_level=None)
        self._conn.backup(mem)
        self._conn.close()
        mem.row_factory = sqlite3.Row
        self._db = mem
        path, self.path = self.path, ":memory:"       # no WAL for the copy
        try:
            self._open_schema()
            self._conn.execute("PRAGMA query_only = ON")
        finally:
            self.path = path

    def _connect(self, readonly: bool) -> sqlite3.Connection:
        """The connection, rows by name, waiting up to :data:`BUSY_TIMEOUT_S` for a lock."""
        db = self._open_file(readonly)
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        return db

    def _open_file(self, readonly: bool) -> sqlite3.Connection:
        """The bare connection (isolation_level None: we issue BEGIN/COMMIT ourselves).
        Read-only (``query_only``), it takes no write lock, so a database a run is writing reads at
        once, and, as the last one to close, it still tidies SQLite's ``-wal``/``-shm``
        files away.  Where the file cannot be opened so (a read-only mount), it is opened
        ``mode=ro``, and where SQLite cannot even make its shared-memory index beside it,
        as immutable."""
        path = os.path.expanduser(self.path)
        if not readonly:
            return sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        if not os.path.exists(path):
            raise StoreError(f"no results database at {self.path}",
                             "run `ddlcomm bench` first or pass --db")
        uri = "file:" + urllib.parse.quote(os.path.abspath(path))
        for target, is_uri in ((path, False), (uri + "?mode=ro", True), (uri + "?immutable=1", True)):
            db = sqlite3.connect(target, uri=is_uri, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            try:
                db.execute("PRAGMA query_only = ON")
                db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
                return db
            except sqlite3.OperationalError:
                db.close()
        raise StoreError(f"cannot open database {self.path} to read it")

    def _check_readable(self) -> bool:
        """A read-only store: a ddlcomm database, not empty, not newer; True where its
        schema is older and is read through a copy brought up to this one (:meth:`_upgraded_copy`)."""
        version = self._version()
        self._check_not_newer(version)
        if version == 0:
            raise StoreError(f"database {self.path} is empty", "run `ddlcomm bench` into it first")
        return version < len(MIGRATIONS)

    # ------------------------------------------------------------ schema
    def _version(self) -> int:
        """Schema version stored in the file; 0 for a new, empty file."""
        db = self._conn
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in tables:
            if tables - {"sqlite_sequence"}:
                raise StoreError(f"{self.path} is an SQLite database but not a ddlcomm one",
                                 "give --db (or DDLCOMM_DB) another path")
            return 0
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        try:
            return int(row[0]) if row else 0
        except ValueError:
            raise StoreError(f"database {self.path} has a bad schema_version {row[0]!r}") from None

    def _check_not_newer(self, version: int) -> None:
        if version > len(MIGRATIONS):
            raise NewerSchema(f"database {self.path} was written by a newer ddlcomm (schema {version})",
                             f"this ddlcomm reads schema {len(MIGRATIONS)} and older; "
                             "upgrade ddlcomm, or give --db (or DDLCOMM_DB) another path")

    def _open_schema(self) -> None:
        """Refuse foreign or newer files, then migrate to :data:`SCHEMA_VERSION`."""
        self._check_not_newer(self._version())      # before writing anything
        db = self._conn
        if self.path != ":memory:":
            db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA foreign_keys = ON")
        with self._write():                          # re-read under the write lock
            version = self._version()
            self._check_not_newer(version)
            if version < len(MIGRATIONS):
                db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                for statements in MIGRATIONS[version:]:
                    for sql in statements:
                        db.execute(sql)
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                           (str(len(MIGRATIONS)),))

    def schema_version(self) -> int:
        """The schema version of the open database."""
        return self._version()

    # ------------------------------------------------------------ plumbing
    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"database {self.path} is closed")
        return self._db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed at the end, rolled back on error."""
        db = self._conn
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise StoreError(f"cannot write database {self.path}: {e}",
                             f"another process held it for more than {BUSY_TIMEOUT_S:.0f} s?"
                             if "locked" in str(e) else None) from None
        try:
            yield db
            db.execute("COMMIT")
        except BaseException as e:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise StoreError(f"cannot write database {self.path}: {e}") from None
            raise

    def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"cannot read database {self.path}: {e}") from None

    def moved(self) -> bool:
        """Whether the file at the store's path is no longer the one it opened (removed, or
        replaced): what it writes then goes to a file nobody will read."""
        return self.path != ":memory:" and _identity(self.path) != self._identity

    def save_copy(self, to: Path) -> None:
        """Write the whole open database to ``to`` (``VACUUM INTO``): what a moved store
        holds is saved from the file it still has open."""
        try:
            self._conn.execute("VACUUM INTO ?", (str(to),))
        except sqlite3.Error as e:
            raise StoreError(f"cannot save database {self.path} to {to}: {e}") from None

    def close(self) -> None:
        """Close the connection; the store cannot be used afterwards."""
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.path!r})"

    # ------------------------------------------------------------ runs
    def _run_columns(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Check run fields and convert them to column values."""
        unknown = sorted(set(fields) - set(RUN_FIELDS))
        if unknown:
            raise StoreError(f"unknown run field(s): {', '.join(unknown)}",
                             f"known: {', '.join(RUN_FIELDS)}")
        if "status" in fields and fields["status"] not in RUN_STATUSES:
            raise StoreError(f"bad run status {fields['status']!r}",
                             f"use one of {', '.join(RUN_STATUSES)}")
        cols = {}
        for name, value in fields.items():
            if name == "command" and isinstance(value, (list, tuple)):
                value = shell_join(value)
            cols[name] = _to_column("run", name, RUN_FIELDS[name], value)
        return cols

    def create_run(self, info: dict[str, Any] | None = None) -> int:
        """Add a run and return its id.

        ``info`` holds any run fields but ``id``; ``started_at`` defaults to
        now, ``status`` to ``'running'`` and ``owner`` to this process.
        ``command`` may be an argv list.
        """
        info = dict(info or {})
        info.setdefault("started_at", utc_now())
        info.setdefault("status", "running")
        info.setdefault("owner", this_process())
        info.setdefault("seen_at", info["started_at"])
        if info["status"] is None or info["started_at"] is None:
            raise StoreError("a run needs a started_at and a status")
        cols = self._run_columns(info)
        with self._write() as db:
            return self._insert_run(db, cols)

    @staticmethod
    def _insert_run(db: sqlite3.Connection, cols: dict[str, Any]) -> int:
        """Insert a run's columns (inside a write); its new id."""
        names, marks = ", ".join(cols), ", ".join("?" * len(cols))
        return int(db.execute(f"INSERT INTO runs ({names}) VALUES ({marks})",
                              tuple(cols.values())).lastrowid)

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set some fields of a run, e.g. ``mpi_library="Open MPI"`` or ``config={...}``."""
        if not fields:
            return
        if fields.get("status", "") is None or fields.get("started_at", "") is None:
            raise StoreError("a run's started_at and status cannot be cleared")
        cols = self._run_columns({"seen_at": utc_now(), **fields})
        sets = ", ".join(f"{name} = ?" for name in cols)
        with self._write() as db:
            cur = db.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*cols.values(), run_id))
            if cur.rowcount == 0:
                raise self._no_run(run_id)

    def finish_run(self, run_id: int, status: str, error: str | None = None) -> None:
        """End a run: set its ``status`` (``'passed'`` or ``'failed'``), ``error`` and ``ended_at`` = now."""
        if status not in ("passed", "failed"):
            raise StoreError(f"a run cannot finish with status {status!r}", "use 'passed' or 'failed'")
        self.update_run(run_id, status=status, error=error, ended_at=utc_now())

    def end_if_running(self, run_id: int, status: str, error: str) -> bool:
        """End a run as ``status`` (failed or interrupted, with ``error``, ended now)
        unless it has already ended.

        Returns True if the run was still ``'running'`` and is now ended, False
        if it had ended before (the first ending stands).
        """
        if status not in ENDINGS:
            raise StoreError(f"a run cannot be ended as {status!r}", f"use {' or '.join(ENDINGS)}")
        with self._write() as db:
            cur = db.execute("UPDATE runs SET status = ?, error = ?, ended_at = ? "
                             "WHERE id = ? AND status = 'running'",
                             (status, _to_column("run", "error", "str", error), utc_now(), run_id))
            if cur.rowcount:
                return True
            if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise self._no_run(run_id)
            return False

    def _no_run(self, run_id: int) -> StoreError:
        return StoreError(f"no run {run_id} in {self.path}", "`ddlcomm results list` lists the stored runs")

    def _run_dicts(self, where: str = "", args: tuple = ()) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT r.*, COUNT(p.id) AS n_points,"
            " COALESCE(SUM(p.\"check\" = 'passed'), 0) AS n_passed,"
            " COALESCE(SUM(p.\"check\" = 'failed'), 0) AS n_failed,"
            " COALESCE(SUM(p.\"check\" = 'skipped'), 0) AS n_skipped,"
            " GROUP_CONCAT(DISTINCT p.ranks) AS rank_counts,"
            " GROUP_CONCAT(DISTINCT p.backend) AS backend_names"
            f" FROM runs r LEFT JOIN points p ON p.run_id = r.id {where}"
            " GROUP BY r.id ORDER BY r.started_at DESC, r.id DESC", args)
        firsts = self._read(
            "SELECT run_id, collective, MIN(seq) AS first FROM points"
            f"{' WHERE run_id = ?' if args else ''}"
            " GROUP BY run_id, collective ORDER BY run_id, first", args)
        colls: dict[int, list[str]] = {}
        for r in firsts:
            colls.setdefault(r["run_id"], []).append(r["collective"] or "?")
        out = []
        for row in rows:
            d: dict[str, Any] = {"id": row["id"]}
            for name, kind in RUN_FIELDS.items():
                d[name] = _from_column(kind, row[name])
            for name in ("n_points", "n_passed", "n_failed", "n_skipped"):
                d[name] = int(row[name])
            d["collectives"] = ",".join(colls.get(row["id"], []))
            d["point_ranks"] = ",".join(sorted(filter(None, (row["rank_counts"] or "").split(",")),
                                               key=int))
            d["point_backends"] = row["backend_names"] or ""
            d["stale"] = stale_why(d) if d["status"] == "running" else ""
            out.append(d)
        return out

    def runs(self) -> list[dict[str, Any]]:
        """Every run, newest first, each with ``n_points``, ``n_passed``,
        ``n_failed``, ``n_skipped``, ``collectives`` (comma-separated, in the
        order first measured), ``point_ranks`` and ``point_backends`` (comma-separated) and
        ``stale``: why a ``running`` run cannot be running any more (:func:`stale_why`;
        '' where it may be)."""
        return self._run_dicts()

    def run(self, run_id: int) -> dict[str, Any]:
        """One run, with the same summary fields as :meth:`runs`."""
        found = self._run_dicts("WHERE r.id = ?", (run_id,))
        if not found:
            raise self._no_run(run_id)
        return found[0]

    # ------------------------------------------------------------ points
    def add_point(self, run_id: int, point: dict[str, Any]) -> int:
        """Store one point of run ``run_id`` (in one transaction); return its id.

        Missing fields are stored as NULL; ``check`` must be one of
        :data:`CHECK_VALUES`; fields outside the contract belong in ``extra``.
        """
        cols = self._point_columns(point)
        with self._write() as db:
            if db.execute("UPDATE runs SET seen_at = ? WHERE id = ?", (utc_now(), run_id)).rowcount == 0:
                raise self._no_run(run_id)
            return self._insert_point(db, run_id, cols)

    @staticmethod
    def _point_columns(point: dict[str, Any]) -> dict[str, Any]:
        """Check a point's fields and convert them to column values."""
        unknown = sorted(set(point) - set(POINT_FIELDS) - set(_POINT_READ_ONLY))
        if unknown:
            raise StoreError(f"unknown point field(s): {', '.join(unknown)}",
                             "put additional fields in the point's 'extra' dict")
        if point.get("check") not in CHECK_VALUES:
            raise StoreError(f"bad point check {point.get('check')!r}",
                             f"use one of {', '.join(CHECK_VALUES)}")
        cols = {name: _to_column("point", name, kind, point.get(name))
                for name, kind in POINT_FIELDS.items()}
        if cols["extra"] is None:
            cols["extra"] = "{}"
        return cols

    @staticmethod
    def _insert_point(db: sqlite3.Connection, run_id: int, cols: dict[str, Any]) -> int:
        """Insert one point's columns as run ``run_id``'s next (inside a write)."""
        names = ", ".join(f'"{n}"' for n in cols)
        marks = ", ".join("?" * len(cols))
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM points WHERE run_id = ?",
                         (run_id,)).fetchone()[0]
        cur = db.execute(f"INSERT INTO points (run_id, seq, {names}) VALUES (?, ?, {marks})",
                         (run_id, seq, *cols.values()))
        return int(cur.lastrowid)

    def import_run(self, run: dict[str, Any], points: list[dict[str, Any]]) -> tuple[int, str]:
        """Add a run read from another store (:meth:`run`) with its points (:meth:`points`),
        in one transaction, under a new id: ``(id, "added")``.  Where this store holds it
        already (the same start, host, owner and command): ``(id, "updated")`` when the
        source has gone on since (more points, or another status: it was merged while it
        ran), its fields and points then replaced; else ``(id, "already")``."""
        cols = self._run_columns({name: run.get(name) for name in RUN_FIELDS})
        rows = [self._point_columns(p) for p in points]
        with self._write() as db:
            same = db.execute("SELECT id, status, (SELECT COUNT(*) FROM points WHERE run_id = runs.id)"
                              " FROM runs WHERE started_at = ? AND host IS ? AND owner IS ?"
                              " AND command IS ?", (cols["started_at"], cols["host"], cols["owner"],
                                                    cols["command"])).fetchone()
            if same is not None:
                run_id, status, held = same
                if status == cols["status"] and held >= len(rows):
                    return run_id, "already"
                sets = ", ".join(f"{name} = ?" for name in cols)
                db.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*cols.values(), run_id))
                db.execute("DELETE FROM points WHERE run_id = ?", (run_id,))
                state = "updated"
            else:
                run_id, state = self._insert_run(db, cols), "added"
            for row in rows:
                self._insert_point(db, run_id, row)
            return run_id, state

    def points(self, run_id: int | None = None) -> list[dict[str, Any]]:
        """Points of one run (or of every run, by run id), in insertion order.

        Each is a point dict with ``run_id`` added and ``extra`` as a dict.
        """
        if run_id is None:
            rows = self._read("SELECT * FROM points ORDER BY run_id, seq")
        else:
            rows = self._read("SELECT * FROM points WHERE run_id = ? ORDER BY seq", (run_id,))
            if not rows:
                self.run(run_id)            # raises if the run does not exist
        out = []
        for row in rows:
            d: dict[str, Any] = {"run_id": row["run_id"]}
            for name, kind in POINT_FIELDS.items():
                d[name] = _from_column(kind, row[name])
            out.append(d)
        return out
