"""What ddlcomm decides about NCCL before and after it starts (pure: no torch, no NCCL).

* :func:`shared_gpu_env`: the environment that lets several ranks use one
  GPU.  NCCL up to 2.29 refuses two ranks on one device ("Duplicate GPU
  detected", ncclInvalidUsage).  NCCL >= 2.30 allows it with
  ``NCCL_MULTI_RANK_GPU_ENABLE=1``; before that, a different ``NCCL_HOSTID``
  per rank makes NCCL treat the ranks as separate hosts (its socket transport
  over loopback: correct, not representative of a GPU's own transport);
  otherwise the run is refused with the reason.
* :func:`debug_env` and :func:`log_path`: where NCCL writes its ``NCCL_DEBUG=INFO``
  lines, from which :func:`parse_transports` reads the transport NCCL chose
  between each pair of ranks (``P2P/IPC``, ``SHM/direct/direct``, ``NET/Socket/0``...).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from ..errors import UnsupportedError

#: The first NCCL that lets ranks share a GPU when told (``NCCL_MULTI_RANK_GPU_ENABLE=1``).
MULTI_RANK_MIN = (2, 30, 0)
#: ddlcomm's own NCCL log when the user chose none (``%p``: NCCL puts the pid there).
DEFAULT_LOG = "/tmp/ddlcomm-nccl.%h.%p.log"

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
# "host:pid:tid [dev] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"
_CHANNEL = re.compile(r"NCCL INFO Channel \S+ ?: (\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\]"
                      r"(?: \[(?:send|receive)\])? via (.*\S)")     # the rest of the line


def parse_version(text: Optional[str]) -> Optional[tuple[int, int, int]]:
    """``"2.28.9"`` (or ``"NCCL version 2.28.9+cuda13.0"``) -> ``(2, 28, 9)``; None if there is none."""
    m = _VERSION.search(text or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


@dataclass(frozen=True)
class SharedGpu:
    """How the ranks on one GPU are let in: the variables to set and what that means."""

    env: dict
    how: str


def shared_gpu_env(version: Optional[tuple[int, int, int]], ranks_on_gpu: int, slot: int,
                   host: str, environ: Mapping[str, str]) -> SharedGpu:
    """The NCCL variables a rank needs when ``ranks_on_gpu`` ranks share its GPU (``slot``:
    its place among them, 0 to ``ranks_on_gpu - 1``).

    One rank per GPU needs none.  Raises :class:`UnsupportedError` saying why and
    what would make it run when neither way applies.
    """
    if ranks_on_gpu <= 1:
        return SharedGpu({}, "one rank per GPU")
    shown = ".".join(map(str, version)) if version else "of unknown version"
    if version is None:
        raise UnsupportedError(f"{ranks_on_gpu} ranks share one GPU and ddlcomm cannot tell "
                               "NCCL's version (needed to choose how NCCL lets them)",
                               "use one rank per GPU (--ranks = number of GPUs)")
    if version >= MULTI_RANK_MIN:
        if environ.get("NCCL_MULTI_RANK_GPU_ENABLE", "1") == "0":
            raise UnsupportedError(f"{ranks_on_gpu} ranks share one GPU but "
                                   "NCCL_MULTI_RANK_GPU_ENABLE=0 is set",
                                   "unset it, or use one rank per GPU")
        return SharedGpu({"NCCL_MULTI_RANK_GPU_ENABLE": "1"},
                         f"NCCL {shown}: NCCL_MULTI_RANK_GPU_ENABLE=1 (ranks share the device)")
    if "NCCL_HOSTID" in environ:
        raise UnsupportedError(
            f"{ranks_on_gpu} ranks share one GPU, which NCCL {shown} (before 2.30) refuses "
            f"unless each rank has its own NCCL_HOSTID, but NCCL_HOSTID={environ['NCCL_HOSTID']} "
            "is set for every rank", "unset NCCL_HOSTID, or use one rank per GPU")
    # One NCCL "host" per slot: the k-th rank of every GPU is in host k, so no two ranks of
    # one GPU are on one host (NCCL refuses a GPU twice on a host, init.cc) and ranks of
    # different GPUs of the node keep P2P/NVLink among them. On more than one host NCCL looks
    # for multi-node NVLink (MNNVL), which these never have: off unless the user chose.
    env = {"NCCL_HOSTID": f"{host}-ddlcomm-slot{slot}"}
    if "NCCL_MNNVL_ENABLE" not in environ:
        env["NCCL_MNNVL_ENABLE"] = "0"
    return SharedGpu(env, f"NCCL {shown} (before 2.30): NCCL_HOSTID per rank of a GPU, so NCCL "
                     "sees separate hosts and uses its network transport between ranks of a GPU")


def debug_env(environ: Mapping[str, str]) -> dict:
    """The variables that make NCCL log its transports to a file, leaving the user's choices.

    Empty when the user set ``NCCL_DEBUG`` themselves (their level and file are kept).
    """
    if "NCCL_DEBUG" in environ:
        return {}
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": environ.get("NCCL_DEBUG_FILE", DEFAULT_LOG)}


def log_host(host: str) -> str:
    """The host name NCCL puts for ``%h``: ``gethostname()`` up to its first ``.`` (NCCL's
    ``getHostName(..., '.')``), ``%`` and ``/`` made ``-`` (NCCL >= 2.29)."""
    return host.split(".", 1)[0].replace("%", "-").replace("/", "-")


def log_path(environ: Mapping[str, str], host: str, pid: int) -> Optional[str]:
    """The file this process's NCCL writes to, None for stdout.

    Expanded in one pass as NCCL does (``ncclDebugInit``, src/debug.cc of 2.28.9): ``%h``
    the host, ``%p`` the pid, ``%%`` one ``%``; ``%`` before any other character is kept
    with it."""
    template = environ.get("NCCL_DEBUG_FILE")
    if not template:
        return None
    fields = {"%": "%", "h": log_host(host), "p": str(pid)}
    return re.sub(r"%(.)", lambda m: fields.get(m.group(1), m.group(0)), template, flags=re.S)


def parse_transports(lines: Iterable[str]) -> dict[str, str]:
    """``{"0->1": "P2P/IPC", ...}``: the transport of each connection NCCL logged.

    Reads NCCL's ``NCCL_DEBUG=INFO`` lines ``... NCCL INFO Channel 00/0 : 0[0] ->
    1[0] via P2P/IPC``; where channels of one pair differ, their transports are
    joined with ``+`` in the order first seen.
    """
    out: dict[str, str] = {}
    for line in lines:
        m = _CHANNEL.search(line)
        if m is None:
            continue
        pair, how = f"{m.group(1)}->{m.group(2)}", m.group(3)
        seen = out.get(pair)
        if seen is None:
            out[pair] = how
        elif how not in seen.split("+"):
            out[pair] = f"{seen}+{how}"
    return out


def transport_kinds(pairs: Mapping[str, str]) -> list[str]:
    """The distinct transports of :func:`parse_transports`' answer, sorted."""
    return sorted({how for joined in pairs.values() for how in joined.split("+")})
