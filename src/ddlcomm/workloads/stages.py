"""A step's collectives along a data path, as separately timed parts (see ``paths.py``).

:class:`Stage` is one collective of a step: named parts run in order, each
timed apart (``d2h``, the collective, ``h2d``...).  :class:`PathRun` is a path
opened in one rank; :class:`DataPath` the base of the paths' registry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ..measure.timing import clock
from .sides import Side

Part = tuple[str, Callable[[], Any]]


def nothing() -> None:
    return None


@dataclass
class Stage:
    """One collective of a step along a path: its parts in order, each timed apart.

    Every rank has the same parts (a part with nothing to do on a rank is a
    no-op there), so the ranks' phase tables line up.
    """

    collective: str
    parts: Sequence[Part]
    #: bytes this rank copies in each copy part (``{"d2h": n, "h2d": p * n}``): a gather's root
    #: copies the whole table back, other ranks nothing. Parts not named move the message.
    #: Every rank names the same parts (their bytes are agreed on over the ranks).
    copies: Mapping[str, int] = field(default_factory=dict)

    def phases(self) -> tuple[str, ...]:
        """The stage's phase names: its parts when there are several, then the whole
        collective (last, where :func:`ddlcomm.measure.timing.calibrate` reads a call's time)."""
        if len(self.parts) == 1:
            return (self.collective,)
        return (*(f"{self.collective}.{name}" for name, _ in self.parts), self.collective)

    def run(self) -> list[float]:
        """Run every part; the durations of :meth:`phases` (the whole last)."""
        times = []
        for _, call in self.parts:
            t0 = clock()
            call()
            times.append(clock() - t0)
        return [*times, sum(times)] if len(times) > 1 else times

    def copied(self) -> dict[str, int]:
        """Bytes this rank copies per copy phase (``{"broadcast.d2h": n, ...}``)."""
        return {f"{self.collective}.{name}": n for name, n in self.copies.items()}


def copied(stages: Sequence[Stage]) -> dict[str, int]:
    """Bytes this rank copies per copy phase over the stages (one per message)."""
    total: dict[str, int] = {}
    for stage in stages:
        for phase, n in stage.copied().items():
            total[phase] = total.get(phase, 0) + n
    return total


def run_stages(stages: Sequence[Stage]) -> list[Sequence[float]]:
    """Run the stages (one per message); each one's phase times (add them up with
    :func:`added` once the step's clock has stopped)."""
    return [stage.run() for stage in stages]


def added(runs: Sequence[Sequence[float]]) -> list[float]:
    """Each phase's time over the messages' runs (:func:`run_stages`), added up."""
    return [sum(phase) for phase in zip(*runs)]


class PathRun:
    """A path opened in one rank: where its data lives, and its collectives as stages.

    A context manager: leaving the ``with`` block closes it (frees what it allocated)."""

    def __init__(self, side: Side, facts: Optional[dict] = None) -> None:
        self.side = side
        self._facts = facts or {}

    def facts(self, comm) -> dict:
        """Stored with every record of the point: asked on every rank when the records are
        made, after the point's calls (a path may ask its ranks over ``comm``)."""
        return self._facts

    def stage(self, comm, collective: str, send, recv=None, op: Optional[str] = None,
              root: int = 0) -> Stage:
        raise NotImplementedError

    def copy_bars(self, comm, mine: Mapping[str, int]) -> dict[str, dict[str, float]]:
        """The bandwidth bars of the copy phases (``mine``: the bytes this rank copies in
        each), by phase; none where the path measures none (called on every rank)."""
        return {}

    def close(self) -> None:
        """Free what the path allocated for the point."""

    def __enter__(self) -> "PathRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DataPath:
    """A data path: its name, what it needs, and how it runs in a rank."""

    name = "?"
    description = "?"
    needs_gpu = False
    #: What the run's backends are handed: "host" arrays or "device" tensors (None: the
    #: run's --memory kind decides, as without a path).
    backend_memory: Optional[str] = "host"
    #: It moves single collectives too (``--collective X --path NAME``), not only a PS step.
    for_collectives: bool = True

    def check(self, plan) -> None:
        """Refuse, before any rank starts, what this path cannot run here (with the reason)."""

    def open(self, comm, plan, alloc, server: bool) -> PathRun:
        """This path in one rank, for one point (``alloc``: the run's host allocator;
        ``server``: the workload's rank 0 is a PS server)."""
        raise NotImplementedError
