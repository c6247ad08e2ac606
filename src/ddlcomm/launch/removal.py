"""Removing container sets: a set's own at its close, and the leftovers of sets whose
owner died (killed outright, so its exit handlers never ran), recognised by the names
every set gives what it creates (:mod:`.namespaces`)."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

from .cpuset import cpuset_root, own_cgroup, rmdir_cgroup
from .namespaces import (ALIAS_PREFIX, NETNS_DIR, PREFIX, STATE_DIR, end_processes, links,
                         mounted, netns_names, sh, tool)
from .processes import owner_alive

_NETNS_RE = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-c\d+$")
_SET_RE = re.compile(r"^(\d+)-(\d+)$")
_ALIAS_RE = re.compile(re.escape(ALIAS_PREFIX) + r"(\d+) set=(\S+)")
CLEANUP_LOCK = STATE_DIR.parent / "ddlcomm-cleanup.lock"


def remove_set(ident: str, netns: Sequence[str], nsdirs: Sequence[Path],
               veths: Sequence[str], bridge: str,
               cgroups: Sequence[Path] = ()) -> tuple[list[str], list[str]]:
    """Remove a set's processes, namespaces, links, cgroups and state: (removed, left)."""
    ip, umount = tool("ip"), tool("umount")
    removed: list[str] = []
    left: list[str] = []
    end_processes([NETNS_DIR / n for n in netns], cgroups)

    def del_link(link: str) -> None:
        res = sh([ip, "link", "del", link], check=False)
        gone = res.returncode == 0 or "Cannot find device" in res.stderr
        (removed if gone else left).append(f"link {link}")

    # Host ends of the veth pairs first: that removes both ends at once, whereas
    # a deleted netns takes its veth with it only later (the kernel's cleanup).
    names = {name for name, _ in links()}
    for link in veths:
        if link in names:
            del_link(link)
    for cg in cgroups:
        if cg.is_dir():
            (removed if rmdir_cgroup(cg) else left).append(f"cgroup {cg}")
    for d in nsdirs:
        for kind in ("ipc", "uts", "mnt"):
            f = d / kind
            if mounted(f):
                if sh([umount, str(f)], check=False).returncode != 0 and \
                        sh([umount, "-l", str(f)], check=False).returncode != 0:
                    left.append(str(f))
    present = netns_names()
    for n in netns:
        if n in present or (NETNS_DIR / n).exists():
            ok = sh([ip, "netns", "del", n], check=False).returncode == 0
            (removed if ok else left).append(f"netns {n}")
    if bridge and bridge in {name for name, _ in links()}:
        del_link(bridge)
    if ident and not left and (STATE_DIR / ident).exists():
        shutil.rmtree(STATE_DIR / ident, ignore_errors=True)
        removed.append(str(STATE_DIR / ident))
    return removed, left


class _DeadOwners:
    """Whether the owner of set ``ident`` (process ``pid``) is gone; asked once per set."""

    def __init__(self) -> None:
        self._dead: dict[str, bool] = {}

    def __call__(self, ident: str, pid: int) -> bool:
        if ident not in self._dead:
            start = None
            try:
                start = json.loads((STATE_DIR / ident / "owner.json").read_text()).get("start")
            except (OSError, ValueError):
                pass
            self._dead[ident] = not owner_alive(pid, start)
        return self._dead[ident]


def cleanup_stale() -> list[str]:
    """Remove the leftovers of sets whose owner process no longer exists.

    Matches state directories ``/run/ddlcomm/<pid>-<seq>``, network namespaces
    ``ddlc-<pid>-<seq>-c<i>`` and links aliased ``ddlcomm owner=<pid> ...``
    whose pid is dead (or reused by a process started later).  Ends processes
    still inside those namespaces.  Returns what was removed (names), for the
    log.  Sets of live owners are never touched.  Two cleanups (two sets starting at
    once) take turns, so that one set's leftovers are removed by one of them, whole.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None and not os.path.exists("/usr/sbin/ip"):
        return []
    with open(CLEANUP_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        is_dead = _DeadOwners()
        removed = _stale_state_dirs(is_dead)     # first: they know all their names
        removed += _stale_netns(is_dead)
        removed += _stale_cgroups(is_dead)
        removed += _stale_links(is_dead)
    return sorted(set(removed))


def _stale_state_dirs(is_dead: _DeadOwners) -> list[str]:
    """Sets with a state directory of a dead owner: everything its state names."""
    removed: list[str] = []
    if not STATE_DIR.is_dir():
        return removed
    for d in sorted(STATE_DIR.iterdir()):
        m = _SET_RE.match(d.name)
        if not m or not is_dead(d.name, int(m.group(1))):
            continue
        try:
            state = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            state = {}
        nsdirs = [p for p in d.iterdir() if p.is_dir()]
        gone, _ = remove_set(d.name, state.get("netns", []), nsdirs,
                             state.get("veth", []), state.get("bridge", ""),
                             [Path(p) for p in state.get("cgroups", [])])
        removed += gone
    return removed


def _stale_netns(is_dead: _DeadOwners) -> list[str]:
    """Network namespaces of dead owners without a state directory."""
    removed = []
    for n in netns_names():
        m = _NETNS_RE.match(n)
        if m and is_dead(f"{m.group(1)}-{m.group(2)}", int(m.group(1))):
            end_processes([NETNS_DIR / n])
            if sh([tool("ip"), "netns", "del", n], check=False).returncode == 0:
                removed.append(f"netns {n}")
    return removed


def _stale_cgroups(is_dead: _DeadOwners) -> list[str]:
    """Cpuset cgroups named like the namespaces of dead owners."""
    root = cpuset_root()
    if root is None:
        return []
    removed = []
    base = own_cgroup(root)
    for cg in (base.glob(f"{PREFIX}-*-c*") if base.is_dir() else []):
        m = _NETNS_RE.match(cg.name)
        if m and cg.is_dir() and is_dead(f"{m.group(1)}-{m.group(2)}", int(m.group(1))):
            end_processes([], [cg])
            if rmdir_cgroup(cg):
                removed.append(f"cgroup {cg}")
    return removed


def _stale_links(is_dead: _DeadOwners) -> list[str]:
    """Links (bridges, host ends of veth pairs) of dead owners, by their alias."""
    removed = []
    for name, alias in links():
        m = _ALIAS_RE.search(alias)
        if m and is_dead(m.group(2), int(m.group(1))):
            if sh([tool("ip"), "link", "del", name], check=False).returncode == 0:
                removed.append(f"link {name}")
    return removed
