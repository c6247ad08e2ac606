"""Signs that a point measured the scheduler rather than the collective (pure).

On a busy or oversubscribed machine a rank that waits is descheduled, and
gets its CPU back only at a scheduler tick: Linux's CFS, with the common
``HZ=250``, ticks every 4 ms, so the point's median lands on 4, 8, 16 ms
whatever the message.  Two signs are flagged:

* ``quanta``: p50 within :data:`QUANTUM_TOLERANCE` of a quantum of one of the
  first :data:`MAX_QUANTA` multiples of :data:`SCHED_QUANTUM_US` (past those,
  every time lies close to some multiple and the sign says nothing);
* ``spread``: p99 above :data:`WIDE_SPREAD` times p50: the iterations
  disagree so much that the median says little.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

#: The scheduler quantum, µs: one tick of CFS at HZ=250 (the default of most
#: distributions' kernels); a descheduled rank resumes on a tick.
SCHED_QUANTUM_US = 4000.0
#: How close to a multiple of the quantum a p50 must be to be flagged, as a share of one
#: quantum (0.03: 120 µs at 4 ms).
QUANTUM_TOLERANCE = 0.03
#: The largest multiple of the quantum still read as a sign (8: up to 32 ms).
MAX_QUANTA = 8
#: p99/p50 above which a point's spread is called wide.
WIDE_SPREAD = 2.0

#: Flag name -> its marker in tables and its explanation (legends).
FLAGS: dict[str, tuple[str, str]] = {
    "quanta": ("Q", f"p50 sits on a multiple of the {SCHED_QUANTUM_US / 1000:g} ms scheduler "
                    "quantum: ranks waited for the scheduler (a busy or oversubscribed machine)"),
    "spread": ("S", f"p99 is more than {WIDE_SPREAD:g}x p50: iterations disagree widely "
                    "(noise from other processes, or a bimodal point)"),
}


def on_quanta(p50_us: Optional[float], quantum_us: float = SCHED_QUANTUM_US,
              tolerance: float = QUANTUM_TOLERANCE) -> bool:
    """Whether ``p50_us`` lies within ``tolerance`` quanta of 1..MAX_QUANTA quanta."""
    if not p50_us:
        return False
    k = round(p50_us / quantum_us)
    return 1 <= k <= MAX_QUANTA and abs(p50_us - k * quantum_us) <= tolerance * quantum_us


def wide_spread(p50_us: Optional[float], p99_us: Optional[float], limit: float = WIDE_SPREAD) -> bool:
    """Whether p99 is more than ``limit`` times p50 (False when either is missing)."""
    return bool(p50_us and p99_us and p50_us > 0 and p99_us > limit * p50_us)


def point_flags(point: Mapping[str, Any]) -> list[str]:
    """Names of :data:`FLAGS` that ``point`` (with ``t_p50_us``, ``t_p99_us``) raises."""
    p50, p99 = point.get("t_p50_us"), point.get("t_p99_us")
    return [name for name, raised in (("quanta", on_quanta(p50)), ("spread", wide_spread(p50, p99)))
            if raised]


def markers(flags: list[str]) -> str:
    """The table marker of some flags, e.g. ``"QS"``; ``""`` for none."""
    return "".join(FLAGS[f][0] for f in flags)
