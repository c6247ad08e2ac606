"""``numa:N``: 4 KiB pages bound to NUMA node N.

An anonymous mapping (as ``pageable``: no transparent huge pages, so that
only the node differs) bound with the ``mbind(2)`` syscall, ``MPOL_BIND``,
before any page is touched: each page is then allocated on node N when the
caller first writes it.  Called through ``libc.syscall`` rather than libnuma,
so it needs no extra library.  Nodes are those with memory that this process
may use (``/sys/devices/system/node/has_memory`` and the cpuset's
``Mems_allowed_list``).
"""
from __future__ import annotations

import errno
import re

from ..errors import UnsupportedError, UsageError
from .base import Buffer, from_mapping, require_linux
from .pageable import map_small_pages
from . import vm

NODE_DIR = "/sys/devices/system/node"


def parse_node_list(text: str) -> list[int]:
    """``"0-2,4"`` -> ``[0, 1, 2, 4]`` (the kernel's list format; empty text -> [])."""
    nodes: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ValueError(f"bad node list {text!r}")
        lo = int(m.group(1))
        nodes.update(range(lo, int(m.group(2) or lo) + 1))
    return sorted(nodes)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def available_nodes() -> list[int]:
    """NUMA nodes with memory that this process may allocate on ([0] on a kernel without NUMA)."""
    text = _read(f"{NODE_DIR}/has_memory") or _read(f"{NODE_DIR}/online")
    nodes = parse_node_list(text) if text else [0]
    status = _read("/proc/self/status") or ""
    allowed = re.search(r"^Mems_allowed_list:\s*(\S+)", status, re.M)
    if allowed:
        permitted = set(parse_node_list(allowed.group(1)))
        nodes = [n for n in nodes if n in permitted]
    return nodes


def check(arg: str | None, hbw_fallback: str | None) -> None:
    require_linux("numa")
    node = int(arg or 0)
    nodes = available_nodes()
    if node not in nodes:
        listed = ", ".join(map(str, nodes)) or "none"
        raise UsageError(f"NUMA node {node} does not exist here (nodes with memory: {listed})",
                         f"use numa:{nodes[0]}" if nodes else "use pageable")


def allocate(spec: str, arg: str | None, nbytes: int, hbw_fallback: str | None) -> Buffer:
    check(arg, hbw_fallback)
    node = int(arg or 0)
    mapping = map_small_pages(nbytes)
    try:
        vm.mbind(mapping.address, mapping.length, node)
    except OSError as exc:
        mapping.unmap()
        hint = ("a container's seccomp profile blocks mbind: docker run --cap-add SYS_NICE "
                "(or --security-opt seccomp=unconfined)" if exc.errno == errno.EPERM
                else "use a kernel with NUMA support, or the memory kind pageable")
        raise UnsupportedError(f"cannot bind memory to NUMA node {node}: {exc.strerror}", hint) from None
    return from_mapping("numa", spec, nbytes, mapping, {"method": "mbind", "node": node})
