"""Output paths checked before anything runs, so a sweep is never lost to a path it
cannot write at the end (``--db``, ``--report-dir``, ``--out``, ``-o``)."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

from .errors import UsageError


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _cannot_write_in(folder: Path) -> Optional[str]:
    """None where a folder can really be made in ``folder`` (one is made and removed at
    once), else why not (" (reason)", or "" where permissions refuse).  root passes
    access() everywhere, but not in /proc, on a read-only mount or on a full disk."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return ""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ddlcomm-check-", dir=folder))
    except OSError as exc:
        return f" (making a folder there failed: {exc.strerror or exc})"
    return None


def _check_parent(path: Path, flag: str, subject: Optional[str] = None) -> None:
    """The folders ``path`` would be made in can be made and written (``subject``: what
    the refusal calls the path, ``flag`` where none is given)."""
    base = _nearest_existing(path.parent)
    subject = subject or flag
    if not base.is_dir():
        raise UsageError(f"{subject} {path}: {base} is a file, not a folder",
                         f"choose a {flag} path inside a folder")
    why = _cannot_write_in(base)
    if why is not None:
        raise UsageError(f"{subject} {path}: cannot write in {base}{why}",
                         f"choose a {flag} path in a folder you can write")


def writable_file(path: Path, flag: str) -> Path:
    """``path`` as a file this process can create or overwrite (UsageError if not)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder, not a file", f"give {flag} a file name")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"{flag} {path} is not writable", f"choose another {flag}")
        return path
    _check_parent(path, flag)
    return path


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (checked by :func:`writable_file`) in UTF-8, as the
    reports' files are, whatever the locale (an ASCII one failed half-way on a run's "é"),
    making its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def writable_dir(path: Path, flag: str, default: bool = False) -> Path:
    """``path`` as a folder this process can create or write in (UsageError if not);
    ``default``: ``path`` is ``flag``'s default, not given (the refusal says so)."""
    subject = f"{flag}'s default" if default else flag
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{subject} {path} is a file, not a folder", f"give {flag} a folder")
        why = _cannot_write_in(path)
        if why is not None:
            raise UsageError(f"{subject} {path} is not writable{why}", f"choose another {flag}")
        return path
    _check_parent(path, flag, subject)
    return path


def print_report(write: Callable[[Path], Path], folder: Path, run_id: int) -> Optional[Path]:
    """``write(folder)``, a run's report, and its ``report:`` line; where the folder cannot
    be written after all (root passes every access check; a full disk), one warning line
    instead: the run is stored, and ``ddlcomm report N --out DIR`` writes it elsewhere."""
    try:
        index = write(folder)
    except OSError as exc:
        print(f"warning: report not written to {folder}: {exc.strerror or exc} "
              f"(`ddlcomm report {run_id} --out DIR` writes it elsewhere)", file=sys.stderr)
        return None
    print(f"report:   {index}")
    return index

