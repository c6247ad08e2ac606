"""Virtual-memory calls through libc (ctypes): mmap, munmap, mremap, madvise, mbind, move_pages.

Linux only.  Sizes are in bytes, addresses are plain ints.  Every mapping
:func:`map_region` makes sits between two ``PROT_NONE`` guard areas so that the kernel can never
merge it with a neighbouring mapping: ``/proc/self/smaps`` then describes
exactly this buffer's pages.

``mbind`` and ``move_pages`` go through ``libc.syscall`` with the syscall
numbers below, so that ``numa:N`` needs no libnuma (and no numactl headers).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
from dataclasses import dataclass

import numpy as np

PROT_NONE, PROT_READ, PROT_WRITE = 0x0, 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_HUGETLB = 0x4000, 0x40000
#: mmap's flags carry a hugetlb page size as its log2 from this bit on (``MAP_HUGE_2MB`` is 21
#: there); without one the kernel takes the default hugetlb size, which may be 1 GiB.
MAP_HUGE_SHIFT = 26


def map_huge(page_bytes: int) -> int:
    """``MAP_HUGETLB`` with the pool of ``page_bytes`` pages named (pure)."""
    return MAP_HUGETLB | (page_bytes.bit_length() - 1) << MAP_HUGE_SHIFT
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
MPOL_BIND = 2
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
PAGE_BYTES: int = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

#: Syscall numbers (from the kernel's unistd tables); aarch64 and riscv64 share the generic table.
_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"mbind": 237, "move_pages": 279},
    "aarch64": {"mbind": 235, "move_pages": 239},
    "riscv64": {"mbind": 235, "move_pages": 239},
}

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The C library, with argument types set for the calls used here."""
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mremap.restype = ctypes.c_void_p
        lib.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.syscall.restype = ctypes.c_long
        _libc = lib
    return _libc


def _oserror(call: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}")


def round_up(nbytes: int, multiple: int) -> int:
    """``nbytes`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    return max(multiple, -(-nbytes // multiple) * multiple)


@dataclass(frozen=True)
class Mapping:
    """A mapping of ``length`` bytes at ``address`` inside a guarded reservation."""

    address: int
    length: int
    reserve_address: int
    reserve_length: int

    def unmap(self) -> None:
        """Unmap the buffer and both guard areas (each piece on its own, so hugetlb splits cleanly)."""
        lib = libc()
        end, reserve_end = self.address + self.length, self.reserve_address + self.reserve_length
        for start, stop in ((self.reserve_address, self.address), (self.address, end),
                            (end, reserve_end)):
            if stop > start and lib.munmap(ctypes.c_void_p(start), stop - start) != 0:
                raise _oserror("munmap")


def map_region(length: int, *, align: int = PAGE_BYTES, flags: int = MAP_PRIVATE | MAP_ANONYMOUS,
               fd: int = -1) -> Mapping:
    """Map ``length`` bytes (a multiple of ``align``) read-write at an ``align``-aligned address.

    ``flags`` are the mmap flags of the buffer itself (``MAP_HUGETLB``, ``MAP_SHARED`` with
    ``fd``...).  Raises :class:`OSError` with the kernel's errno when the kernel refuses.
    """
    lib = libc()
    reserve_length = length + align + PAGE_BYTES
    base = lib.mmap(None, reserve_length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise _oserror("mmap (reserve)")
    start = round_up(base + PAGE_BYTES, align)
    got = lib.mmap(ctypes.c_void_p(start), length, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd, 0)
    if got != start:
        error = _oserror("mmap")
        lib.munmap(ctypes.c_void_p(base), reserve_length)
        raise error
    return Mapping(start, length, base, reserve_length)


def replace(address: int, length: int, flags: int, fd: int = -1, advice: int = 0) -> None:
    """Put a new mapping (``flags``, ``fd``; ``madvise(advice)`` first where not 0) holding a copy
    of the ``length`` bytes at ``address`` in their place: same addresses and values, other
    pages (``mremap`` moves it there, unmapping what was).  Raises :class:`OSError`; the old
    pages stay where anything fails."""
    lib = libc()
    new = lib.mmap(None, length, PROT_READ | PROT_WRITE, flags, fd, 0)
    if new in (None, ctypes.c_void_p(-1).value):
        raise _oserror("mmap")
    try:
        if advice:
            madvise(new, length, advice)
        ctypes.memmove(new, address, length)
        if lib.mremap(ctypes.c_void_p(new), length, length, MREMAP_MAYMOVE | MREMAP_FIXED,
                      ctypes.c_void_p(address)) != address:
            raise _oserror("mremap")
    except BaseException:
        lib.munmap(ctypes.c_void_p(new), length)
        raise


def madvise(address: int, length: int, advice: int) -> None:
    """``madvise(2)``; raises :class:`OSError` on failure."""
    if libc().madvise(ctypes.c_void_p(address), length, advice) != 0:
        raise _oserror("madvise")


THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_ENABLED) -> str | None:
    """The transparent-huge-page mode (``always``, ``madvise``, ``never``), None without THP."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def huge_page_bytes() -> int:
    """The PMD (huge) page size in bytes: 2 MiB on x86_64 and on aarch64 with 4 KiB pages."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return meminfo().get("Hugepagesize", 2048) * 1024


def hugetlb_pages(page_bytes: int, root: str = "/sys/kernel/mm/hugepages") -> int:
    """Pages reserved in the hugetlb pool of ``page_bytes`` pages (``nr_hugepages`` of
    ``hugepages-<kB>kB``; /proc/meminfo's HugePages_Total counts the default pool only, which
    may be of 1 GiB pages); 0 where there is none."""
    try:
        with open(f"{root}/hugepages-{page_bytes // 1024}kB/nr_hugepages", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """``/proc/meminfo`` as numbers (``kB`` fields in KiB, page counts as counts)."""
    out: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields = value.split()
                if fields and fields[0].isdigit():
                    out[key] = int(fields[0])
    except OSError:
        pass
    return out


def _syscall_number(name: str) -> int:
    table = _SYSCALLS.get(platform.machine())
    if table is None:
        raise OSError(errno.ENOSYS, f"{name}: syscall number unknown on {platform.machine()}")
    return table[name]


def mbind(address: int, length: int, node: int) -> None:
    """Bind the pages of ``[address, address+length)`` to NUMA ``node`` (MPOL_BIND).

    Must run before the pages are first touched: pages already present stay
    where they are.
    """
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    # The kernel reads maxnode - 1 bits, hence the + 1 (as libnuma does).
    result = libc().syscall(ctypes.c_long(_syscall_number("mbind")), ctypes.c_void_p(address),
                            ctypes.c_ulong(length), ctypes.c_long(MPOL_BIND), mask,
                            ctypes.c_ulong(words * 64 + 1), ctypes.c_uint(0))
    if result != 0:
        raise _oserror("mbind")


def page_nodes(address: int, length: int, page_bytes: int = PAGE_BYTES) -> np.ndarray:
    """NUMA node of each page in ``[address, address+length)``, by ``move_pages(2)`` with nodes=NULL.

    Returns an int32 array, one entry per ``page_bytes``: the node, or a negative
    errno (``-ENOENT``: the page is not present, i.e. was never touched).
    """
    pages = np.arange(address, address + length, page_bytes, dtype=np.uint64)
    status = np.full(len(pages), -errno.ENOENT, dtype=np.int32)
    if len(pages):
        result = libc().syscall(ctypes.c_long(_syscall_number("move_pages")), ctypes.c_long(0),
                                ctypes.c_ulong(len(pages)), ctypes.c_void_p(pages.ctypes.data),
                                ctypes.c_void_p(None), ctypes.c_void_p(status.ctypes.data),
                                ctypes.c_int(0))
        if result < 0:
            raise _oserror("move_pages")
    return status
