"""Memory: total and available, transparent huge pages, the hugetlb pools, /dev/shm.

What the memory kinds (``hugepage``, ``shared``) will get here.  Reads files only,
through :mod:`ddlcomm.memory.vm`'s readers."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..memory import pagescan, vm

THP_DIR = "/sys/kernel/mm/transparent_hugepage"
HUGETLB_DIR = Path("/sys/kernel/mm/hugepages")


def hugetlb(meminfo: dict[str, int]) -> dict[str, Any]:
    """The default hugetlb pool from ``/proc/meminfo`` numbers (pure): ``page_bytes``,
    ``total`` and ``free`` pages; None values where the kernel has no hugetlb."""
    size_kb = meminfo.get("Hugepagesize")
    return {"page_bytes": size_kb * 1024 if size_kb is not None else None,
            "total": meminfo.get("HugePages_Total"), "free": meminfo.get("HugePages_Free")}


def hugetlb_pools(root: Path = HUGETLB_DIR) -> list[dict[str, Any]]:
    """Every hugetlb page size (``hugepages-2048kB``, ``hugepages-1048576kB``) with its
    ``total`` and ``free`` pages, from sysfs."""
    pools = []
    for d in sorted(root.glob("hugepages-*kB")):
        try:
            kb = int(d.name[len("hugepages-"):-2])
            total = int((d / "nr_hugepages").read_text())
            free = int((d / "free_hugepages").read_text())
        except (OSError, ValueError):
            continue
        pools.append({"page_bytes": kb * 1024, "total": total, "free": free})
    return sorted(pools, key=lambda p: p["page_bytes"])


def tmpfs_huge(mounts: str, path: str) -> str | None:
    """The ``huge=`` mode of the tmpfs mounted at ``path`` (``never``, tmpfs's default, where
    the option is absent), from ``/proc/mounts`` text; None where no tmpfs is mounted there
    (pure).  The last mount of a path is the one seen."""
    found = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == path:
            options = dict(o.partition("=")[::2] for o in fields[3].split(","))
            found = (options.get("huge") or "never") if fields[2] == "tmpfs" else None
    return found


def shm_bytes(path: str = "/dev/shm", mounts_path: str = "/proc/mounts") -> dict[str, Any]:
    """Size and free bytes of the tmpfs behind ``shared`` buffers (and the shm all-reduces'
    segments), or why unknown; ``huge``: whether its pages may be huge (:func:`tmpfs_huge`:
    ``never`` means small pages, whatever THP says for private memory)."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return {"path": path, "available": False, "reason": str(exc)}
    try:
        with open(mounts_path, encoding="utf-8", errors="replace") as f:
            huge = tmpfs_huge(f.read(), path)
    except OSError:
        huge = None
    return {"path": path, "available": True, "size_bytes": st.f_blocks * st.f_frsize,
            "free_bytes": st.f_bavail * st.f_frsize, "huge": huge}


def page_scan() -> dict[str, Any]:
    """Whether this process can tell which pages of one range are huge (the kernel's
    ``PAGEMAP_SCAN``, :mod:`ddlcomm.memory.pagescan`): then every point records its ranks'
    part of NumPy's arrays on huge pages (``pages.huge_share_ranks``)."""
    if not pagescan.available():
        return {"available": False, "reason": "the kernel has no PAGEMAP_SCAN (Linux 6.7 and later): "
                                              "points record no huge pages of NumPy's arrays"}
    return {"available": True}


def facts(meminfo_path: str = "/proc/meminfo", thp_dir: str = THP_DIR) -> dict[str, Any]:
    """``total_bytes``, ``available_bytes``, ``thp`` (``enabled`` and ``defrag`` modes, and
    ``shmem_enabled``: the kernel's own shared memory's (memfd, SysV), None without THP),
    ``hugetlb`` (default pool, and ``pools`` per page size), ``shm`` (:func:`shm_bytes`),
    ``page_scan`` (:func:`page_scan`)."""
    mi = vm.meminfo(meminfo_path)
    kib = {k: mi[k] * 1024 if k in mi else None for k in ("MemTotal", "MemAvailable")}
    return {
        "total_bytes": kib["MemTotal"],
        "available_bytes": kib["MemAvailable"],
        "thp": {name: vm.thp_mode(f"{thp_dir}/{name}") for name in ("enabled", "defrag", "shmem_enabled")},
        "hugetlb": dict(hugetlb(mi), pools=hugetlb_pools()),
        "shm": shm_bytes(),
        "page_scan": page_scan(),
    }
