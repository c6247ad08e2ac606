"""The C library's heap in a process that computes: whether memory it frees stays for reuse.

glibc adapts two thresholds as a process frees memory. Freeing a block that had its own
mapping (one above the mmap threshold) raises that threshold to the block's size (up to
:data:`MMAP_BYTES`), and the trim threshold, past which freed memory at the heap's top goes
back to the kernel, to twice that. So how many of a training step's temporaries are
faulted in anew each step (zero-filled pages, in the step's time) depends on the largest
block any code happened to free before. Open MPI's all-reduce of a 25 MiB bucket frees a
25 MiB temporary; ddlcomm's own all-reduces, and Gloo's, allocate nothing that size. After
the former ResNet-50's CPU backward took 18 page faults a step, after the latter 16,000,
and 1.3-1.5x the time (docs/benchmarks.md, "The heap under training").

``steady`` sets both thresholds before training, so every configuration computes on the
same heap whatever its collective allocates; ``glibc`` leaves the C library's adaptive
defaults (``train``'s default is steady, ``bench``'s glibc: there the object form's calls,
which allocate, pay those faults, 1.3-3.7x their time at 1-16 MiB on 2 ranks). A C library
without ``mallopt`` (not glibc) keeps its own: the run records ``libc``. An allocator
preloaded in glibc's stead (jemalloc, tcmalloc through ``LD_PRELOAD``) never hears of
mallopt: the run records ``preloaded``.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

from ..units import format_size

#: --heap's choices.
HEAPS = ("steady", "glibc")
#: What a run records where the C library has no mallopt: its own heap, untouched.
OTHER_LIBC = "libc"
#: What a run records where malloc is not the C library's (an allocator preloaded).
PRELOADED = "preloaded"
#: mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Freed memory at the heap's top is kept up to this many bytes.
TRIM_BYTES = 1 << 30
#: Blocks from this size up get a mapping of their own: glibc's largest mmap threshold on
#: 64-bit (DEFAULT_MMAP_THRESHOLD_MAX; mallopt refuses more).
MMAP_BYTES = 32 << 20


def steady_thresholds() -> str:
    """What ``steady`` sets, in words (the commands' --help)."""
    return (f"glibc's trim threshold {format_size(TRIM_BYTES)}, "
            f"mmap threshold {format_size(MMAP_BYTES)}")


def _mallopt() -> Optional[Callable[[int, int], int]]:
    """glibc's mallopt, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def _malloc_of(lib: ctypes.CDLL) -> Optional[int]:
    return ctypes.cast(lib.malloc, ctypes.c_void_p).value


def preloaded() -> bool:
    """Whether the malloc this process calls is not glibc's own (one preloaded before it)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return _malloc_of(ctypes.CDLL(None)) != _malloc_of(libc)


def apply(heap: str) -> str:
    """Set this process's heap as ``heap`` (one of :data:`HEAPS`) says; returns the heap the
    process computes on: ``heap``, :data:`PRELOADED` where malloc is not glibc's, or
    :data:`OTHER_LIBC` where mallopt is missing or refused."""
    if heap not in HEAPS:
        raise ValueError(f"unknown heap {heap!r}: choose from {', '.join(HEAPS)}")
    mallopt = _mallopt()
    if mallopt is None:
        return OTHER_LIBC
    if preloaded():
        return PRELOADED
    if heap == "glibc":
        return heap
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1 and mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1
    return heap if ok else OTHER_LIBC
