"""The CPUs: model, logical CPUs, the physical cores under them and this process's
affinity, the last-level cache, NUMA nodes with their CPUs and memory (sysfs).  Reads
files only."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any, Sequence

from ..launch.placement import numa_nodes, physical_cores
from ..units import parse_id_list
from ..memory.numa import available_nodes

NODE_DIR = Path("/sys/devices/system/node")
CPU_DIR = Path("/sys/devices/system/cpu")


def cpu_model(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str | None:
    """The CPU's 'model name' from ``cpuinfo``, else ``platform.processor()``, else None."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def last_level_cache(cpu: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Bytes of the highest-level data or unified cache of ``cpu`` (sysfs), None if unknown."""
    best: tuple[int, int] | None = None
    for index in Path(cpu).glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
        try:
            nbytes = int(size.rstrip("KMGkmg")) * unit
        except ValueError:
            continue
        if best is None or level > best[0]:
            best = (level, nbytes)
    return best[1] if best else None


def cpu_ranges(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8, 10, 11]`` -> ``"0-3,8,10-11"`` (the kernel's list format; pure)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            lo, hi = ordered[start], ordered[i - 1]
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
            start = i
    return ",".join(parts)


def node_memory_bytes(text: str) -> int | None:
    """MemTotal in bytes from a node's ``meminfo`` ("Node 0 MemTotal:  1234 kB"; pure)."""
    m = re.search(r"MemTotal:\s*(\d+)\s*kB", text)
    return int(m.group(1)) * 1024 if m else None


def _node_memory(node: int, node_dir: Path) -> int | None:
    try:
        return node_memory_bytes((node_dir / f"node{node}" / "meminfo").read_text())
    except OSError:
        return None


def affinity() -> list[int]:
    """The CPUs this process may run on (all logical CPUs where the OS cannot say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def online(cpu_dir: Path = CPU_DIR) -> list[int]:
    """The online logical CPUs (sysfs), else 0 .. os.cpu_count() - 1."""
    try:
        return parse_id_list((cpu_dir / "online").read_text())
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


def facts(node_dir: Path = NODE_DIR) -> dict[str, Any]:
    """``model``, ``logical`` CPUs and the ``physical_cores`` under the online ones (with
    two hardware threads per core, ranks past the cores share them), ``affinity`` (this
    process's CPU list), ``usable`` (their count) and ``usable_cores`` (the physical
    cores under them), ``last_level_cache_bytes``, and ``numa``: per node its ``cpus``,
    ``memory_bytes`` and whether this process may put memory there."""
    allowed = set(available_nodes())
    mine = affinity()
    return {
        "model": cpu_model(),
        "logical": os.cpu_count(),
        "physical_cores": physical_cores(online()),
        "affinity": cpu_ranges(mine),
        "usable": len(mine),
        "usable_cores": physical_cores(mine),
        "last_level_cache_bytes": last_level_cache(),
        "numa": [{"node": node, "cpus": cpu_ranges(cpus), "memory_bytes": _node_memory(node, node_dir),
                  "memory_allowed": node in allowed}
                 for node, cpus in sorted(numa_nodes().items())],
    }
