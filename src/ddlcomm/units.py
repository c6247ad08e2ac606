"""Parsing and formatting of byte sizes and size sweeps (pure functions).

Sizes use binary units: ``B``, ``KiB``, ``MiB``, ``GiB``, ``TiB`` (``K``,
``KB``, ``M``... are accepted as the same binary units, as OSU and nccl-tests
users type them).  A sweep is ``LO:HI`` with an optional growth factor
``xF`` (default ``x2``), or a comma-separated list of sizes.  Also: checked
number options and comma lists of names, and command lines and stored text
as a terminal should show them.
"""
from __future__ import annotations

import math
import re
import shlex
from typing import Iterable, Optional

from .errors import UsageError, option

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
#: Most iterations, warm-up calls or steps accepted: each one's time is kept (80 MB a rank).
MAX_ITERS = 10_000_000
#: Largest seed accepted (NumPy's and torch's generators both take it).
MAX_SEED = 2 ** 32 - 1
#: Longest duration accepted (a week): beyond it, timers overflow and nothing sensible waits.
MAX_SECONDS = 7 * 24 * 3600.0
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_FACTOR_RE = re.compile(r"^\s*(.+?)\s*[xX]\s*([\d.]+)\s*$")
#: One number with a unit, whatever its form: what a single size that is not whole looks like.
_NUMBER_RE = re.compile(r"^\s*[-+]?[\d.]+(?:[eE][-+]?\d+)?\s*[a-zA-Z]*\s*$")
#: What a size list can be, said where it cannot be parsed.
SIZES_HINT = "give a sweep LO:HI[xF] (e.g. 4B:64MiB or 4B:64MiBx4) or a list a,b,c, not both"


def parse_size(text: str, flag: Optional[str] = None) -> int:
    """Return the number of bytes in ``text`` (e.g. ``"4B"``, ``"64MiB"``); a refusal names
    ``flag``, the option it was given to."""
    if flag is not None:
        with option(flag):
            return parse_size(text)
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"cannot parse size {text!r}",
                         "use a whole number with an optional unit B, KiB, MiB, GiB, TiB (K and KB "
                         "also mean KiB, as in OSU's and nccl-tests' flags), e.g. 4B or 64MiB")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


#: What a size list of 0 bytes is told, where sizes are measured.
ZERO_HINT = "a barrier moves none: measure it with --collective barrier"


def parse_sizes(text: str, zero_hint: str = ZERO_HINT, flag: str = "--sizes") -> list[int]:
    """Parse a sweep: ``LO:HI`` [``xF``] (LO, LO·F, LO·F², ... up to HI) or ``a,b,c``.

    The result is sorted and free of duplicates; a size of 0 is refused with ``zero_hint``;
    a refusal names ``flag``, the option it was given to.
    """
    with option(flag):
        return _parse_sizes(text, zero_hint)


def _parse_sizes(text: str, zero_hint: str) -> list[int]:
    text = given = text.strip()
    if not text.strip(", "):
        raise UsageError("empty size list", "give e.g. 4B:64MiB or 1KiB,1MiB")
    factor = 2
    m = _FACTOR_RE.match(text)
    if m and ":" in m.group(1):
        if not m.group(2).isdigit():
            raise UsageError(f"the growth factor of {text!r} must be a whole number, "
                             f"got x{m.group(2)}", "e.g. 4B:64MiBx4")
        text, factor = m.group(1), int(m.group(2))
        if factor < 2:
            raise UsageError(f"size growth factor must be at least 2, got x{factor}")
    if ":" in text and "," in text or text.count(":") > 1:
        raise UsageError(f"cannot parse sizes {given!r}", SIZES_HINT)
    if ":" in text:
        lo_text, _, hi_text = text.partition(":")
        if not lo_text.strip() or not hi_text.strip():
            raise UsageError(f"sweep {given!r} lacks its {'start' if not lo_text.strip() else 'end'}",
                             SIZES_HINT)
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo <= 0:
            raise UsageError(f"sweep must start above 0 bytes, got {lo_text!r}")
        if hi < lo:
            raise UsageError(f"sweep {text!r} ends below its start")
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    if len(text.split(",")) == 1 and not _SIZE_RE.match(text):      # e.g. 4B-1KiB, 4B..1KiB
        if _NUMBER_RE.match(text):                  # a size of another form (1.5KiB, -4B, 1e3B)
            parse_size(text)
        raise UsageError(f"cannot parse sizes {text!r}", SIZES_HINT)
    # empty items left out, as parse_list does (a trailing comma: 4B,1KiB,)
    sizes = sorted({parse_size(part) for part in text.split(",") if part.strip()})
    if sizes[0] <= 0:
        raise UsageError("sizes must be above 0 bytes, got 0", zero_hint)
    return sizes


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: ``1 rank``, ``3 ranks``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def format_size(nbytes: float) -> str:
    """Format a byte count the short way: ``4B``, ``64KiB``, ``1.5MiB``, in the largest unit
    it reaches: exactly where at most 3 decimals hold it, else to 3 digits and marked as
    rounded (``~1.55GiB``; 1048572 B is ``~1024KiB``, never ``1024KiB`` nor ``1.02e+03KiB``)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            if nbytes * 1000 % scale == 0:
                whole, milli = divmod(int(nbytes * 1000 // scale), 1000)   # a float's too
                return f"{whole}{f'.{milli:03d}'.rstrip('0') if milli else ''}{unit}"
            value = nbytes / scale
            return f"~{value:.{max(0, 2 - int(math.log10(value)))}f}{unit}"
    return f"{nbytes}B"


def typed_size(nbytes: int) -> str:
    """:func:`format_size` where it is exact and whole (``64KiB``), else the bytes
    (``1294B``, ``1536B``: :func:`parse_size` takes no fractions): a size to type back."""
    short = format_size(nbytes)
    return f"{int(nbytes)}B" if short.startswith("~") or "." in short else short


def about_size(nbytes: float) -> str:
    """:func:`format_size` for text that already says "about" (no ``~`` mark)."""
    return format_size(nbytes).lstrip("~")


def parse_positive_int(text: str, what: str, minimum: int = 1,
                       maximum: Optional[int] = None) -> int:
    """Parse an integer option and check it is at least ``minimum`` (and at most ``maximum``)."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a whole number, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{what} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{what} must be at most {maximum}, got {value}")
    return value


def parse_seconds(text: str, what: str) -> float:
    """Parse a positive duration in seconds."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_SECONDS:
        raise UsageError(f"{what} must be above 0 and at most {MAX_SECONDS:g} seconds, got {text!r}")
    return value


def parse_list(text: str, flag: str) -> list[str]:
    """A comma list option: its items in order, none empty-only, none twice."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UsageError(f"{flag} is empty")
    if len(set(items)) != len(items):
        raise UsageError(f"{flag} names something twice: {text}")
    return items


def fusion_label(fusion: int) -> str:
    """A fusion threshold as labels show it: its size, or ``unfused`` (0: a message per tensor)."""
    return format_size(fusion) if fusion else "unfused"


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escaped(match: re.Match) -> str:
    char = match.group()
    return _ESCAPES.get(char, f"\\x{ord(char):02x}")


def printable(text: str) -> str:
    """``text`` with its control characters written as escapes (``\\n``, ``\\x1b``): a
    stored string (a tag, a host name) shown on a terminal stays on its line, uncoloured."""
    return _CONTROL.sub(_escaped, text)


def shell_join(args: Iterable[object]) -> str:
    """A command line as bash reads it back: shlex's quoting, and ``$'...'`` for an
    argument with control characters (a newline, an escape), so that it is never
    printed raw."""
    def quote(arg: str) -> str:
        if not _CONTROL.search(arg):
            return shlex.quote(arg)
        return "$'" + printable(arg.replace("\\", "\\\\").replace("'", "\\'")) + "'"
    return " ".join(quote(str(a)) for a in args)


def parse_id_list(text: str) -> list[int]:
    """The kernel's list format, as cpulist and the node lists of /sys and /proc write it:
    ``"0-2,4"`` -> ``[0, 1, 2, 4]``, sorted, each once (empty text -> []); ValueError for
    anything else (pure)."""
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ValueError(f"bad id list {text!r}")
        lo = int(m.group(1))
        ids.update(range(lo, int(m.group(2) or lo) + 1))
    return sorted(ids)
