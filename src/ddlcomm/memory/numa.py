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
from typing import Optional

from ..errors import UnsupportedError, UsageError
from ..units import parse_id_list
from .base import Buffer, from_mapping, require_linux
from .pageable import map_small_pages
from . import vm

NODE_DIR = "/sys/devices/system/node"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def nodes_with_memory() -> list[int]:
    """NUMA nodes with memory ([0] on a kernel without NUMA)."""
    text = _read(f"{NODE_DIR}/has_memory") or _read(f"{NODE_DIR}/online")
    return parse_id_list(text) if text else [0]


def allowed_nodes() -> Optional[list[int]]:
    """The nodes this process's cpuset lets it allocate on (``Mems_allowed_list``), None
    where the kernel does not say."""
    allowed = re.search(r"^Mems_allowed_list:\s*(\S+)", _read("/proc/self/status") or "", re.M)
    return parse_id_list(allowed.group(1)) if allowed else None


def available_nodes() -> list[int]:
    """NUMA nodes with memory that this process may allocate on ([0] on a kernel without NUMA)."""
    permitted = allowed_nodes()
    return [n for n in nodes_with_memory() if permitted is None or n in permitted]


def check(arg: str | None, hbw_fallback: str | None) -> None:
    require_linux("numa")
    node = int(arg or 0)
    nodes = available_nodes()
    if node not in nodes:
        listed = ", ".join(map(str, nodes)) or "none"
        hint = f"use numa:{nodes[0]}" if nodes else "use pageable"
        if node in nodes_with_memory():
            raise UsageError(f"NUMA node {node} has memory, but this process's cpuset does not allow "
                             f"it (nodes allowed here: {listed})", hint)
        raise UsageError(f"NUMA node {node} does not exist here (nodes with memory: {listed})", hint)


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
