"""A collective bound to its buffers that can say what ran."""
from __future__ import annotations

from typing import Callable


class BoundCall:
    """``call()`` runs the bound collective; ``facts()`` says what ran (a dict stored
    with the point: the reduction kernel, transports, kind look-ups, time by phase)."""

    def __init__(self, run: Callable[[], None], facts: Callable[[], dict]) -> None:
        self._run, self.facts = run, facts

    def __call__(self) -> None:
        self._run()
