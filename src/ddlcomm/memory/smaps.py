"""What the kernel says a range of our address space really got: ``/proc/self/smaps``.

:func:`parse_smaps` is a pure parser (unit-tested on sample text);
:func:`summarize` adds up the mappings that overlap an address range;
:func:`read_range` does both on the live file.  Sizes are in KiB, as smaps
writes them (``kB`` there means KiB).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s+(\S+)\s+\S+\s+\S+\s+\S+\s*(.*)$")
_FIELD = re.compile(r"^([A-Za-z_]+):\s*(.*?)\s*$")
#: Fields that count huge pages: THP in anonymous, shmem and file mappings, and hugetlbfs pages.
HUGE_FIELDS = ("AnonHugePages", "ShmemPmdMapped", "FilePmdMapped", "Private_Hugetlb", "Shared_Hugetlb")
#: hugetlb pages are not counted in Rss; these are added to it.
HUGETLB_FIELDS = ("Private_Hugetlb", "Shared_Hugetlb")


@dataclass
class Vma:
    """One mapping of smaps: ``[start, end)`` addresses, permissions, path and its fields.

    ``sizes`` holds the ``kB`` fields in KiB; ``other`` the rest as text
    (``THPeligible``, ``VmFlags``...).
    """

    start: int
    end: int
    perms: str
    path: str
    sizes: dict[str, int] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)


def parse_smaps(text: str) -> list[Vma]:
    """Parse the text of a ``/proc/PID/smaps`` file into its mappings, in file order."""
    vmas: list[Vma] = []
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            vmas.append(Vma(int(header.group(1), 16), int(header.group(2), 16), header.group(3),
                            header.group(4)))
            continue
        m = _FIELD.match(line)
        if m is None or not vmas:
            continue
        key, value = m.groups()
        if value.endswith(" kB") and value[:-3].strip().isdigit():
            vmas[-1].sizes[key] = int(value[:-3])
        else:
            vmas[-1].other[key] = value
    return vmas


def summarize(vmas: list[Vma], start: int, end: int) -> dict:
    """Sum the mappings that overlap ``[start, end)``.

    Returns ``rss_kb`` (resident, hugetlb included), ``huge_kb`` (resident in
    huge pages: THP or hugetlb), ``page_kb`` (the kernel page size, 4 or
    2048), ``mapped_kb``, ``vmas`` (how many mappings) and ``vm_flags`` (the
    kernel's flags: ``hg`` = MADV_HUGEPAGE, ``nh`` = MADV_NOHUGEPAGE,
    ``ht`` = hugetlb).  Whole mappings are counted: the figures are exact only
    when the range owns its mappings (ddlcomm's guarded mappings do).
    """
    hits = [v for v in vmas if v.start < end and v.end > start]
    total = lambda name: sum(v.sizes.get(name, 0) for v in hits)  # noqa: E731 - tiny local helper
    flags: list[str] = []
    for v in hits:
        flags += [f for f in v.other.get("VmFlags", "").split() if f not in flags]
    return {
        "rss_kb": total("Rss") + sum(total(f) for f in HUGETLB_FIELDS),
        "huge_kb": sum(total(f) for f in HUGE_FIELDS),
        "page_kb": max((v.sizes.get("KernelPageSize", 4) for v in hits), default=4),
        "mapped_kb": total("Size"),
        "vmas": len(hits),
        "vm_flags": " ".join(flags),
    }


def read_range(start: int, end: int, path: str = "/proc/self/smaps") -> dict:
    """:func:`summarize` for ``[start, end)`` of this process, read now."""
    with open(path, encoding="ascii", errors="replace") as f:
        return summarize(parse_smaps(f.read()), start, end)
