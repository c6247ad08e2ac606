"""What one training configuration is, and the job a set of ranks runs (pure)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from ..units import format_size


@dataclass(frozen=True)
class TrainConfig:
    """One measured configuration: a network trained one way for ``iters`` iterations."""

    model: str
    arch: str = "allreduce"          # allreduce | ps
    overlap: bool = False
    wait: str = "spin"               # spin | sleep: how all-reduces in flight are waited for
    fusion: int = 25 << 20           # bucket bytes; 0: one bucket per gradient
    batch: int = 128                 # images per worker per iteration
    image_size: int = 32
    iters: int = 20
    warmup: int = 3
    lr: float = 0.05
    seed: int = 1
    threads: int = 1                 # torch intra-op threads per rank
    peer: str = "ddlcomm"            # ddlcomm | ddp (torch DistributedDataParallel over gloo)
    data: Optional[str] = None       # folder of .npz files; None: synthetic
    prefetch: int = 4
    comm_reps: int = 10
    check: bool = True

    def label(self) -> str:
        if self.peer == "ddp":
            how = f"ddp (gloo) bucket {format_size(self.fusion)}"
        else:
            how = (f"{self.arch}{' overlap' if self.overlap else ''}"
                   f"{' wait-sleep' if self.wait == 'sleep' else ''} fusion {format_size(self.fusion)}")
        return f"{self.model} batch {self.batch} {how}"

    def with_(self, **changes) -> "TrainConfig":
        return replace(self, **changes)


@dataclass
class TrainJob:
    """What the owner hands every rank of one launch (through the environment, as JSON)."""

    backend: str
    ranks: int
    configs: list[TrainConfig] = field(default_factory=list)
    timeout_s: float = 900.0

    @property
    def needs_gloo(self) -> bool:
        return any(c.peer == "ddp" for c in self.configs) and self.backend != "gloo"

    def to_json(self) -> str:
        return json.dumps({"backend": self.backend, "ranks": self.ranks, "timeout_s": self.timeout_s,
                           "configs": [asdict(c) for c in self.configs]})

    @classmethod
    def from_json(cls, text: str) -> "TrainJob":
        d = json.loads(text)
        return cls(d["backend"], d["ranks"], [TrainConfig(**c) for c in d["configs"]], d["timeout_s"])
