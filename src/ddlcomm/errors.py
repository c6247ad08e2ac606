"""Exceptions raised by ddlcomm.

Every error that a user can cause derives from :class:`DdlcommError`; the CLI
prints its message on one line and exits non-zero.  Each error may carry a
``hint`` that says how to fix it.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

#: A C++ library's source location before its message: ``[/path/gloo/.../pair.cc:537] ``.
_SOURCE_AT = re.compile(r"^\[[^\]\s]*\.(?:cc|cpp|cxx|c|h|hpp):\d+\]\s*")


def first_line(exc: BaseException) -> str:
    """Another library's error in one line: its message's first line, without a C++ source
    location before it (torch's Gloo errors carry both, and a C++ backtrace after)."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return _SOURCE_AT.sub("", first)


class DdlcommError(Exception):
    """Base class of all errors ddlcomm raises on purpose; the CLI exits with its
    ``exit_code`` (README's table: 2, bad input, unless a subclass says otherwise)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} ({self.hint})" if self.hint else base


class UsageError(DdlcommError):
    """Bad input: a value that cannot be parsed or is out of range."""


class EveryRankError(UsageError):
    """Bad input that every rank of a job finds alike (the job's size against ``--ranks``):
    the ranks end without aborting one another, and rank 0 alone says it (where they
    share a communicator, none ends before rank 0 has said it)."""


class BackendUnavailable(DdlcommError):
    """A backend's library is missing or cannot start."""


class UnsupportedError(DdlcommError):
    """A backend or collective cannot do what was asked (dtype, op, ...)."""


class RankFailure(DdlcommError):
    """A rank raised, died, or the job ended early (exit 3, README's table)."""

    exit_code = 3


class StoreError(DdlcommError):
    """The results database cannot be read or written."""


class RunLost(StoreError):
    """The database a run wrote was removed or replaced while it ran (exit 3, as a failed run)."""

    exit_code = 3


@contextmanager
def option(flag: str) -> Iterator[None]:
    """Bad input found while ``flag``'s value is read names the option (``--fusion: cannot
    parse size 'abc'``), unless its message already does: a parser shared by several
    options (sizes, lists) cannot know which one it reads."""
    try:
        yield
    except UsageError as exc:
        if flag in exc.args[0]:
            raise
        raise type(exc)(f"{flag}: {exc.args[0]}", exc.hint) from None
