"""The root namespace's side of ddlcomm's containers (:mod:`.containers`).

The tools they are made with (iproute2, util-linux) and running their commands
(one line on failure), what the host has (mounts, links, network namespaces,
networks in use), the state directory, and ending the processes left inside
namespaces or cgroups.  The names every set gives what it creates are here too,
so that :mod:`.removal` recognises a dead owner's leftovers.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from ..errors import UnsupportedError
from .processes import pid_alive, proc_stat, terminate

#: Where sets keep their namespace files, hosts file and launch agent.
STATE_DIR = Path("/run/ddlcomm")
#: Where ``ip netns`` keeps network namespaces.
NETNS_DIR = Path("/run/netns")
#: Every name a set creates starts with this (netns, hostname).
PREFIX = "ddlc"
#: Link alias of every bridge and veth a set creates: ``ddlcomm owner=PID set=ID``.
ALIAS_PREFIX = "ddlcomm owner="
CMD_TIMEOUT_S = 30.0
KILL_GRACE_S = 3.0


def which(name: str) -> Optional[str]:
    """The path of system tool ``name``, also in the sbin folders a user's PATH may lack;
    None where it is not installed."""
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}",
                                                   f"/usr/bin/{name}", f"/bin/{name}")
                                       if os.access(p, os.X_OK)), None)


def tool(name: str) -> str:
    """The path of system tool ``name`` (:func:`which`), or UnsupportedError."""
    path = which(name)
    if path is None:
        raise UnsupportedError(f"--containers needs `{name}`, which is not installed",
                               "install iproute2 and util-linux")
    return path


def sh(cmd: Sequence[str], check: bool = True, timeout: float = CMD_TIMEOUT_S,
       what: str = "") -> subprocess.CompletedProcess:
    """Run one setup command; on failure raise UnsupportedError with its stderr."""
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UnsupportedError(f"{what or cmd[0]}: `{shlex.join(cmd)}` did not end "
                               f"within {timeout:g} s") from None
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise UnsupportedError(f"{what or 'container setup'} failed: `{shlex.join(cmd)}`: "
                               f"{msg[-1] if msg else f'exit code {res.returncode}'}")
    return res


def mountinfo() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of every mount of this mount namespace."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                fields, rest = pre.split(), post.split()
                if len(fields) > 4 and len(rest) > 2:
                    out.append((fields[4], rest[0], rest[2]))
    except OSError:
        pass
    return out


def mounted(path: Path) -> bool:
    """Whether something is mounted on ``path`` in this mount namespace."""
    return any(mp == str(path) for mp, _, _ in mountinfo())


def ensure_state_dir() -> None:
    """/run/ddlcomm as a private bind mount of itself (unshare --mount=FILE needs it)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if not mounted(STATE_DIR):
        sh([tool("mount"), "--bind", str(STATE_DIR), str(STATE_DIR)], what="state directory")
    sh([tool("mount"), "--make-private", str(STATE_DIR)], what="state directory")


def links() -> list[tuple[str, str]]:
    """(name, alias) of every link of the root namespace."""
    res = sh([tool("ip"), "-o", "link", "show"], check=False)
    out = []
    for line in res.stdout.splitlines():
        m = re.match(r"\d+:\s+([^:@\s]+)", line)
        if m:
            alias = re.search(r"\balias (.*?)(?:\\|$)", line)
            out.append((m.group(1), alias.group(1).strip() if alias else ""))
    return out


def netns_names() -> list[str]:
    res = sh([tool("ip"), "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def used_networks() -> list[ipaddress.IPv4Network]:
    """Networks already addressed or routed in the root namespace."""
    nets = []
    for cmd in (["-4", "-o", "addr", "show"], ["-4", "route", "show", "table", "all"]):
        res = sh([tool("ip"), *cmd], check=False)
        for tok in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", res.stdout):
            try:
                nets.append(ipaddress.ip_network(tok, strict=False))
            except ValueError:
                pass
    return nets


# ------------------------------------------------------------ processes left inside
def _pids_in_netns(netns_file: Path) -> list[int]:
    """Processes whose network namespace is the one bound at ``netns_file``."""
    try:
        st = os.stat(netns_file)
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            ns = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (ns.st_ino, ns.st_dev) == (st.st_ino, st.st_dev):
            pids.append(int(entry))
    return pids


def cgroup_pids(cg: Path) -> list[int]:
    """The processes in cgroup ``cg`` (none when it is gone)."""
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie, or gone)."""
    fields = proc_stat(pid)
    return fields is None or fields[0] == "Z"


def end_processes(netns_files: Sequence[Path], cgroups: Sequence[Path] = (),
                  grace_s: float = KILL_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL, the processes left in these network namespaces and cgroups."""
    pids = [p for f in netns_files for p in _pids_in_netns(f)]
    pids += [p for cg in cgroups for p in cgroup_pids(cg)]
    pids = sorted(set(pids) - {os.getpid()})
    return terminate(pids, lambda p: not pid_alive(p) or _zombie(p), grace_s)
