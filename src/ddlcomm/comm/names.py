"""How an ``--algorithm`` name is written: ``NAME[@PIECE][+KERNEL]`` (pure).

``ring+numpy`` picks the reduction kernel, ``shm@256KiB`` the piece a pipelined
all-reduce moves at a time.  :mod:`ddlcomm.comm.algorithms` says which names run
and :mod:`ddlcomm.comm.tuning` reads them back from stored points; both split a
name here.
"""
from __future__ import annotations

from typing import Optional

from ..errors import UsageError
from ..units import parse_size

#: ``--algorithm NAME+KERNEL`` picks the reduction kernel: ``ring+numpy``, ``rhd+c``.
KERNEL_SEP = "+"
#: ``--algorithm NAME@SIZE`` sets the piece a pipelined all-reduce moves at a time: the
#: pipelined shm's chunk (default :func:`ddlcomm.comm.shm.pipe_chunk`), the ring's and
#: rhd's pieces (default ``algorithms.PIPELINE_BYTES``); ``shm@256KiB,shm@1MiB`` measures
#: them side by side.  A multiple of 64 bytes (the shm engine's cache line).
PIECE_SEP = "@"


def split(algorithm: str) -> tuple[str, str]:
    """``"ring+numpy"`` -> ``("ring", "numpy")``; no suffix: the ``auto`` kernel; a piece
    (``"shm@256KiB"``) is not part of the name."""
    base, _, kernel = algorithm.partition(KERNEL_SEP)
    return base.partition(PIECE_SEP)[0], kernel or "auto"


def piece(algorithm: str) -> Optional[int]:
    """The piece in bytes that ``algorithm`` names (``"shm@256KiB"`` -> 262144), None where it
    names none; a size that does not parse raises UsageError."""
    named = algorithm.partition(KERNEL_SEP)[0].partition(PIECE_SEP)
    if not named[1]:
        return None
    nbytes = parse_size(named[2])
    if nbytes <= 0 or nbytes % 64:
        raise UsageError(f"{algorithm}: the piece must be a positive multiple of 64 bytes",
                         "e.g. shm@256KiB")
    return nbytes
