"""What every rank of a communicator must decide alike: whether a condition holds on every
rank (:func:`agree_all`), and set-up agreed, so that where one rank fails every rank raises
the same error and none is left waiting in the next collective for a rank that is gone
(binding a shared-memory all-reduce: one rank's segment or mapping fails)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ..errors import DdlcommError, EveryRankError

#: Why a rank's part failed: (message, hint), or None where it went well.
Why = Optional[tuple]


def attempt(fn: Callable[..., Any], *args: Any) -> tuple[Any, Why]:
    """``(fn(*args), None)``, or ``(None, why)`` where it raised a ddlcomm error or the
    system refused (an OSError: no memory to map, a full /dev/shm)."""
    try:
        return fn(*args), None
    except DdlcommError as exc:
        return None, (exc.args[0] if exc.args else type(exc).__name__, exc.hint)
    except OSError as exc:
        return None, (str(exc), None)


def agreed(comm: Any, why: Why, what: str, payload: Any = None) -> list:
    """Every rank's ``payload`` (one all-gather), where no rank's ``why`` says it failed;
    else every rank raises EveryRankError, naming the first rank that failed and why (rank 0
    alone says it; the ranks end without aborting one another)."""
    every = comm.allgather_object((why, payload))
    for rank, (said, _) in enumerate(every):
        if said is not None:
            text, hint = said
            raise EveryRankError(f"{what}: rank {rank}: {text}", hint)
    return [mine for _, mine in every]


def agreed_alike(comm: Any, why: Why, what: str, mine: tuple, needs: str, hint: str) -> None:
    """:func:`agreed`, and ``mine`` (a tuple of printable parts) the same on every rank;
    else every rank raises EveryRankError, "``what`` needs ``needs`` on every rank", naming
    which ranks had which (:func:`who_has`)."""
    said = agreed(comm, why, what, mine)
    if len(set(said)) > 1:
        raise EveryRankError(f"{what} needs {needs} on every rank: {who_has(said)}", hint)


def who_has(said: list) -> str:
    """Which ranks said which of ``said`` (one tuple a rank, its parts printed, None left
    out), the first four kinds (pure): ``"2048 float32 sum on ranks [0, 2]; ..."``."""
    ranks: dict = {}
    for rank, what in enumerate(said):
        ranks.setdefault(what, []).append(rank)
    shown = [f"{' '.join(str(p) for p in what if p is not None)} on ranks {r}" for what, r in ranks.items()]
    return "; ".join(shown[:4]) + ("; ..." if len(shown) > 4 else "")


def agree_all(comm: Any, ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank (one all-reduce)."""
    flag = np.array([1 if ok else 0], np.int32)
    comm.allreduce(flag, flag, op="min")
    return bool(flag[0])
