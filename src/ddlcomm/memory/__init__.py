"""Buffers in a chosen memory kind, and what the kernel really gave them.

Kinds, by spec string (each implemented in its own module, imported on first use)::

    pageable   4 KiB pages only (anonymous mmap + MADV_NOHUGEPAGE), like C malloc
    hugepage   2 MiB pages: MAP_HUGETLB if the hugetlb pool has pages, else THP
    numa:N     4 KiB pages bound to NUMA node N (mbind before first touch)
    hbw        high-bandwidth memory through memkind's hbw_malloc
    shared     a POSIX shared-memory segment in /dev/shm other ranks can map
    pinned     page-locked host memory (torch, needs a GPU)
    device     GPU memory (a torch CUDA tensor)

>>> from ddlcomm import memory
>>> memory.check("numa:0")                 # refuse early, before ranks start
>>> with memory.allocate("hugepage", 64 << 20) as buf:
...     a = buf.array("float32", 16 << 20); a[:] = 1
...     place = buf.placement()              # read back after writing: huge_kb, numa_nodes...

NumPy's own allocator asks for transparent huge pages on large arrays; use
``pageable`` for the 4 KiB pages that C programs get from malloc.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .base import Buffer, KindImpl

#: Values of ``hbw_fallback``: where ``hbw`` goes when there is no high-bandwidth memory.
HBW_FALLBACKS = ("dram",)


@dataclass(frozen=True)
class MemoryKind:
    """A memory kind: its name, what it implements it (``module`` or ``module:object``),
    the argument it takes after ``:`` (None: none; else a description and a regex) and a summary."""

    name: str
    target: str
    summary: str
    arg: str | None = None
    arg_pattern: str = ""
    #: It needs a GPU (each rank then uses GPU ``local_rank % gpus``).
    gpu: bool = False
    #: Its buffers live on the GPU: torch tensors, no NumPy view (``Buffer.tensor_view``).
    on_device: bool = False
    #: The part of its buffers on huge pages by construction (None: the machine's to say).
    #: A single copy between processes pins the sender's small pages one by one, several
    #: times the copy's own cost (the cost model's ``alpha_page``, ``ddlcomm.pages``).
    huge_share: float | None = None

    def impl(self) -> KindImpl:
        module, _, attr = self.target.partition(":")
        loaded = importlib.import_module(module)
        return getattr(loaded, attr) if attr else loaded  # type: ignore[return-value]


KINDS: dict[str, MemoryKind] = {k.name: k for k in (
    MemoryKind("pageable", "ddlcomm.memory.pageable", "4 KiB pages (no transparent huge pages)",
               huge_share=0.0),
    MemoryKind("hugepage", "ddlcomm.memory.hugepage", "2 MiB pages: hugetlb, else transparent huge pages",
               huge_share=1.0),
    MemoryKind("numa", "ddlcomm.memory.numa", "4 KiB pages bound to one NUMA node",
               arg="N (a NUMA node number, e.g. numa:0)", arg_pattern=r"\d{1,4}", huge_share=0.0),
    MemoryKind("hbw", "ddlcomm.memory.hbw", "high-bandwidth memory via memkind hbw_malloc"),
    MemoryKind("shared", "ddlcomm.memory.shared", "POSIX shared memory in /dev/shm",
               huge_share=0.0),
    MemoryKind("pinned", "ddlcomm.memory.gpu:PINNED", "page-locked host memory (needs a GPU)",
               gpu=True),
    MemoryKind("device", "ddlcomm.memory.gpu:DEVICE", "GPU memory (torch CUDA tensor)", gpu=True,
               on_device=True),
)}


def _choices() -> str:
    return ", ".join(f"{k.name}:N" if k.arg else k.name for k in KINDS.values())


def parse(spec: str) -> tuple[str, str | None]:
    """Split ``"numa:1"`` into ``("numa", "1")``; ``"pageable"`` gives ``("pageable", None)``."""
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError(f"empty memory kind {spec!r}", f"choose from {_choices()}")
    name, colon, arg = spec.strip().partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise UsageError(f"unknown memory kind {name!r}", f"choose from {_choices()}")
    if kind.arg is None:
        if colon:
            raise UsageError(f"memory kind {name} takes no argument, got {spec!r}", f"write just {name}")
        return name, None
    if not re.fullmatch(kind.arg_pattern, arg):
        raise UsageError(f"memory kind {name} needs {kind.arg}, got {spec!r}", f"write e.g. {name}:0")
    return name, str(int(arg))


def kind(spec: str) -> MemoryKind:
    """The :class:`MemoryKind` of ``spec`` (checked as :func:`parse` does)."""
    return KINDS[parse(spec)[0]]


def on_device(spec: str | None) -> bool:
    """Whether buffers of the memory kind ``spec`` live on the GPU (None: NumPy's, on the host)."""
    return spec is not None and kind(spec).on_device


def _spec(name: str, arg: str | None) -> str:
    return name if arg is None else f"{name}:{arg}"


def _check_fallback(hbw_fallback: str | None) -> None:
    if hbw_fallback is not None and hbw_fallback not in HBW_FALLBACKS:
        raise UsageError(f"unknown hbw fallback {hbw_fallback!r}",
                         f"choose {' or '.join(HBW_FALLBACKS)}, or none to refuse hbw without HBW")


def check(spec: str, hbw_fallback: str | None = None) -> None:
    """Raise now (UsageError / UnsupportedError) if ``spec`` cannot be allocated on this machine.

    Allocates nothing: meant for the launcher, before any rank starts.
    """
    name, arg = parse(spec)
    _check_fallback(hbw_fallback)
    KINDS[name].impl().check(arg, hbw_fallback)


def allocate(spec: str, nbytes: int, hbw_fallback: str | None = None) -> Buffer:
    """Allocate ``nbytes`` bytes of memory kind ``spec``; free with ``Buffer.free()`` or ``with``.

    ``hbw_fallback="dram"`` lets ``hbw`` fall back to pageable memory where there is no
    high-bandwidth memory (recorded as ``fallback`` in :meth:`Buffer.placement`).
    """
    name, arg = parse(spec)
    _check_fallback(hbw_fallback)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise UsageError(f"buffer size must be a whole number of bytes >= 0, got {nbytes!r}")
    return KINDS[name].impl().allocate(_spec(name, arg), arg, int(nbytes), hbw_fallback)


__all__ = ["KINDS", "HBW_FALLBACKS", "MemoryKind", "Buffer", "parse", "kind", "check", "allocate"]
