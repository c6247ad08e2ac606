"""What a benchmark run will do, checked before any rank starts (pure functions)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..collectives import Collective
from ..errors import UsageError
from ..units import format_size

FORMS = ("buffer", "object")
#: Implementations ``--impl`` accepts: the two Python forms and the C reference.
IMPLS = ("c", "buffer", "object")


@dataclass(frozen=True)
class PointSpec:
    """One thing to measure: a collective or a workload, at one size, on one backend."""

    kind: str        # "collective" | "workload" | "c"
    name: str        # the collective's or the workload's name
    nbytes: int      # message bytes (for a model: the total of its gradients)
    form: str
    backend: str
    algorithm: str = "library"

    def label(self, with_backend: bool) -> str:
        where = f"{self.backend}, " if with_backend else ""
        how = "" if self.algorithm == "library" else f"{self.algorithm}, "
        return f"{self.name} ({where}{how}{self.form}, {format_size(self.nbytes)})"


@dataclass
class BenchPlan:
    """The resolved options of one ``ddlcomm bench`` run."""

    backends: list[str]
    collectives: list[str]
    sizes: list[int]
    dtype: str
    op: str
    forms: list[str]
    workloads: list[str] = field(default_factory=list)
    model: Optional[str] = None
    fusion: Optional[int] = None
    steps: Optional[int] = None
    path: str = "host"
    algorithms: list[str] = field(default_factory=lambda: ["library"])
    memory: Optional[str] = None          # None: NumPy's allocator; else a ddlcomm.memory kind
    hbw_fallback: Optional[str] = None
    containers: int = 0                   # 0: ranks on the host, no containers
    bind: str = "none"
    in_place: bool = False
    check: bool = True
    ranks: Optional[int] = None
    iters: Optional[int] = None
    warmup: Optional[int] = None
    budget_s: float = 0.2
    timeout_s: float = 120.0
    root: int = 0
    extra: dict = field(default_factory=dict)

    def points(self) -> list[PointSpec]:
        """What is measured, in order: per collective, per size, every backend in turn.

        Backends (and workloads) alternate at each size, so drift of the
        machine hits them alike.
        A barrier moves no data, so it is measured once, not once per size.
        """
        if self.workloads:
            return [PointSpec("workload", w, s, "buffer", b)
                    for s in self.sizes for w in self.workloads for b in self.backends]
        return [PointSpec("c" if f == "c" else "collective", c, s, f, b, a)
                for c in self.collectives
                for s in (self.sizes[:1] if c == "barrier" else self.sizes)
                for b in self.backends for a in self.algorithms for f in self.forms
                if a == "library" or f == "buffer"]

    def as_config(self) -> dict:
        """A JSON-able record of the plan for the run row."""
        return {k: v for k, v in self.__dict__.items()}


def parse_forms(text: str) -> list[str]:
    if text == "both":
        return list(FORMS)
    if text not in FORMS:
        raise UsageError(f"unknown form {text!r}", "choose buffer, object or both")
    return [text]


def parse_impls(text: str) -> list[str]:
    """``--impl``: a comma list of c, buffer, object (kept in the order given)."""
    impls = [part.strip() for part in text.split(",") if part.strip()]
    bad = [i for i in impls if i not in IMPLS]
    if bad or not impls or len(set(impls)) != len(impls):
        raise UsageError(f"bad --impl {text!r}", f"a comma list of {', '.join(IMPLS)}, each once")
    return impls


def memory_needed(coll: Collective, nbytes: int, ranks: int, object_form: bool) -> int:
    """Bytes one host needs for one point with all ``ranks`` on it (an estimate).

    Each rank holds its input, its output and the expected result for the
    check; the receiver of a gather holds ``ranks`` messages twice.  Pickled
    objects double what is held.
    """
    receiver = coll.receiver_bytes(nbytes, ranks)
    need = ranks * 3 * nbytes + 2 * receiver
    return need * 2 if object_form else need


def check_memory(coll: Collective, nbytes: int, ranks: int, object_form: bool,
                 available: int) -> None:
    """Refuse a point that cannot fit, before anything is allocated."""
    need = memory_needed(coll, nbytes, ranks, object_form)
    if need > available:
        raise UsageError(
            f"{coll.name} of {format_size(nbytes)} per rank at {ranks} ranks needs about "
            f"{format_size(need)} of memory, more than the {format_size(available)} available",
            "use smaller --sizes or fewer --ranks")


def mem_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (or a very large number elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62
