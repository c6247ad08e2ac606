"""Ranks in separate containers made of Linux namespaces (``--containers K``).

Docker's engine need not run: a container is a set of namespaces, and that is
what ranks in different Docker containers on one machine are separated by.
Each :class:`Container` here has

- its own *network* namespace (``ip netns``, listed by ``ip netns list``) with
  one veth pair into a bridge in the root namespace and its own address in a
  private /24; the bridge itself has ``.1`` so that launchers in the root
  namespace (mpirun, mpiexec) reach their daemons in the containers;
- its own *IPC*, *UTS* (hostname ``ddlc-<id>-c<i>``) and *mount* namespace with
  a private tmpfs on ``/dev/shm``, its own ``/sys`` (so ``/sys/class/net``
  shows the container's interfaces) and an ``/etc/hosts`` that names every
  container of the set.

The IPC, UTS and mount namespaces are *persistent*: they are created once by
``unshare --ipc=FILE --uts=FILE --mount=FILE`` and bind-mounted on files under
``/run/ddlcomm/<id>/c<i>/`` (``/run/ddlcomm`` is made a private bind mount of
itself, as unshare(1) requires), the network namespace under ``/run/netns``.
No holder process is needed: every command of a container joins the same
namespaces with ``nsenter`` (:meth:`ContainerSet.exec_prefix`), so the ranks
of one container share ``/dev/shm`` and System V IPC, and ranks in different
containers share neither memory nor loopback: MPI must use its network path
(TCP over veth and bridge) between them, as between Docker containers.

Binding (``bind="core"`` or ``"numa"``) gives each container a cpuset cgroup
(``<cpuset hierarchy>/ddlc-<id>-c<i>``), as Docker's ``--cpuset-cpus`` and
``--cpuset-mems`` do: its processes cannot leave those cpus, and hwloc inside
(MPI's own ``--bind-to``) sees only them, because each container's fresh
``/sys`` gets the cgroup hierarchies mounted again.  Without a cpuset
controller, ``taskset`` binds instead (noted in ``ContainerSet.notes``).

Everything a set creates carries its id ``<owner pid>-<seq>``: the netns names
(``ddlc-<id>-c<i>``), the state directory, and the alias of every link
(``ddlcomm owner=<pid> set=<id>``); the cgroups are named like the netns.
The set removes it all on exit, also on an
exception, on SIGTERM/SIGHUP (turned into SystemExit while the set is open) and
at interpreter exit (atexit); processes still inside its namespaces are ended
first.  A set whose owner was killed outright is removed by
:func:`.removal.cleanup_stale`, which every new set runs first.

All of this needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); :func:`check_available`
says so in one line before anything is created.
"""
from __future__ import annotations

import atexit
import ipaddress
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import UnsupportedError, UsageError
from .cpuset import cgroup_remount, make_cpuset
from .namespaces import (ALIAS_PREFIX, CMD_TIMEOUT_S, NETNS_DIR, PREFIX, STATE_DIR,
                         ensure_state_dir, sh, tool, used_networks)
from .placement import cpu_sets, format_cpulist, numa_nodes, split_ranks
from .processes import first_close, start_time
from .removal import cleanup_stale, remove_set

#: The private /16 whose /24s the sets use (one /24 per set, only inside its bridge).
SUBNET_BASE = "10.231"
#: Interface of each container (the inner end of its veth pair), as in Docker.
CONTAINER_IFACE = "eth0"


@dataclass
class Container:
    """One container: its namespaces' names, address, hostname, cpus and ranks."""
    name: str                  # e.g. "c0"
    netns: str                 # ip netns name, e.g. "ddlc-4242-0-c0"
    address: str               # IPv4 address on the set's bridge
    hostname: str              # UTS hostname, e.g. "ddlc-4242-0-c0"
    cpus: Optional[list[int]]  # cpus it is bound to, None when unbound
    ranks: list[int]           # the MPI ranks placed in it
    mems: Optional[list[int]] = None   # NUMA nodes of its memory (binding numa), else all
    veth: str = ""             # host end of its veth pair (the inner end is eth0)
    nsdir: Optional[Path] = None       # holds the ipc, uts and mnt namespace files
    cgroup: Optional[Path] = None      # its cpuset cgroup when bound (None: taskset only)


# ------------------------------------------------------------ availability
def check_available() -> None:
    """Raise UnsupportedError (one line, with a hint) unless containers can be made here.

    Checks root, the tools (ip, nsenter, unshare, mount), and that network, IPC,
    UTS and mount namespaces, a bridge and a veth pair can be created, all
    inside a throwaway namespace that vanishes with its process: nothing
    persistent is created.
    """
    hint = "run as root on Linux (or use Docker/Podman containers), or leave out --containers"
    if not sys.platform.startswith("linux"):
        raise UnsupportedError("--containers needs Linux namespaces", hint)
    if os.geteuid() != 0:
        raise UnsupportedError("--containers needs root (to create network, IPC, UTS and "
                               "mount namespaces, a bridge and veth links)", hint)
    for name in ("ip", "nsenter", "unshare", "mount", "umount"):
        tool(name)
    probe = (f"{tool('ip')} link add ddlcprobe0 type bridge && "
             f"{tool('ip')} link add ddlcprobe1 type veth peer name ddlcprobe2 && "
             f"mount -t tmpfs tmpfs /dev/shm && hostname ddlc-probe")
    try:
        res = subprocess.run([tool("unshare"), "--net", "--ipc", "--uts", "--mount",
                              "--propagation", "private", "sh", "-c", probe],
                             capture_output=True, text=True, timeout=CMD_TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UnsupportedError("namespace probe did not end within "
                               f"{CMD_TIMEOUT_S:g} s", hint) from None
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
        raise UnsupportedError(f"namespaces, bridges or veth links are unavailable here: {why}",
                               hint)


# ------------------------------------------------------------ the set
_seq_lock = threading.Lock()
_seq = 0


class ContainerSet:
    """K containers for ``nranks`` ranks; a context manager that creates and removes them.

    ``with ContainerSet(2, 4, bind="core") as cs:`` puts ranks 0-1 in
    ``cs.containers[0]`` and 2-3 in ``cs.containers[1]``.  Attributes:
    ``containers``, ``id``, ``bridge``, ``bridge_address``, ``subnet`` (CIDR),
    ``notes`` (what the binding had to share, for the user).
    """

    def __init__(self, count: int, nranks: int, bind: str = "none") -> None:
        blocks = split_ranks(nranks, count)
        plan = cpu_sets(count, bind, sorted(os.sched_getaffinity(0)), numa_nodes())
        self.notes = list(plan.notes)
        self.count, self.nranks, self.bind = count, nranks, bind
        global _seq
        with _seq_lock:
            self._seq0 = _seq
            _seq += 1
        self.id = ""
        self.subnet = ""
        self.bridge = ""
        self.bridge_address = ""
        self.containers = [Container(name=f"c{i}", netns="", address="", hostname="",
                                     cpus=plan.cpus[i], mems=plan.mems[i], ranks=blocks[i])
                           for i in range(count)]
        self._state: Optional[Path] = None
        self._open = False
        self._old_handlers: dict[int, object] = {}

    # ---------------------------------------------------------------- public
    def __enter__(self) -> "ContainerSet":
        check_available()
        try:
            cleanup_stale()
        except Exception:  # noqa: BLE001 - leftovers of others must not stop this run
            pass
        self._open = True
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def container_of(self, rank: int) -> Container:
        """The container that holds ``rank``."""
        for c in self.containers:
            if rank in c.ranks:
                return c
        raise UsageError(f"rank {rank} is not in any container (ranks 0..{self.nranks - 1})")

    def exec_prefix(self, container: Container | int) -> list[str]:
        """argv prefix that runs a command inside ``container`` (keeping the working directory).

        When bound, the command first joins the container's cpuset cgroup
        (``sh -c 'echo $$ > CGROUP/cgroup.procs && exec "$@"'``), as Docker's
        ``--cpuset-cpus`` does, so MPI's own binding inside stays within the
        container's cpus; then ``nsenter --wd=. --net=NETNS --ipc=F --uts=F
        --mount=F --`` joins the container's persistent namespaces.  Where no
        cpuset cgroup could be made, ``taskset -c CPUS`` binds instead (MPI's
        binding may then leave those cpus; see ``notes``).
        """
        c = self.containers[container] if isinstance(container, int) else container
        if not c.netns or c.nsdir is None:
            raise UsageError("the containers do not exist yet", "use the set in a with block")
        prefix: list[str] = []
        if c.cgroup is not None:
            prefix += ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(c.cgroup / "cgroup.procs")]
        prefix += [tool("nsenter"), "--wd=.", f"--net={NETNS_DIR / c.netns}",
                   f"--ipc={c.nsdir / 'ipc'}", f"--uts={c.nsdir / 'uts'}",
                   f"--mount={c.nsdir / 'mnt'}", "--"]
        if c.cpus is not None and c.cgroup is None:
            prefix += [tool("taskset"), "-c", format_cpulist(c.cpus)]
        return prefix

    def agent_script(self) -> Path:
        """An ssh stand-in for the launchers: ``SCRIPT [ssh options] HOST COMMAND...``.

        It maps HOST (a container's address or hostname, optionally
        ``user@HOST``) to its container and runs the joined COMMAND words with
        ``sh -c`` inside it, as ssh runs them in the remote shell.  Use it as
        ``--prtemca plm_ssh_agent SCRIPT`` (Open MPI 5 / PRRTE) or
        ``-launcher ssh -launcher-exec SCRIPT`` (MPICH Hydra).  The environment
        of the launcher passes through to the command (no real ssh in between).
        """
        if self._state is None:
            raise UsageError("the containers do not exist yet", "use the set in a with block")
        return self._state / "agent"

    def close(self) -> None:
        """Remove everything this set created (idempotent; also run at exit)."""
        if not first_close(self):
            return
        self._restore_signal_handlers()
        _, left = remove_set(self.id, [c.netns for c in self.containers if c.netns],
                             [c.nsdir for c in self.containers if c.nsdir is not None],
                             [c.veth for c in self.containers if c.veth], self.bridge,
                             [c.cgroup for c in self.containers if c.cgroup is not None])
        if left:
            print(f"ddlcomm: warning: could not remove {', '.join(left)} "
                  f"(ddlcomm removes them when it next runs)", file=sys.stderr, flush=True)

    def describe(self) -> str:
        """One line per container: name, hostname, address, cpus, ranks."""
        lines = [f"containers {self.id}: bridge {self.bridge} {self.bridge_address}, "
                 f"subnet {self.subnet}"]
        for c in self.containers:
            cpus = "all" if c.cpus is None else format_cpulist(c.cpus)
            cpus += "" if c.mems is None else f" mems {format_cpulist(c.mems)}"
            cpus += f" (cgroup {c.cgroup})" if c.cgroup else ""
            lines.append(f"  {c.name}: {c.hostname} {c.address} cpus {cpus} "
                         f"ranks {c.ranks[0]}-{c.ranks[-1]}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    # ---------------------------------------------------------------- creation
    def _create(self) -> None:
        ensure_state_dir()
        pid = os.getpid()
        seq = self._seq0
        while True:     # claim a free id: mkdir is atomic
            ident = f"{pid}-{seq}"
            try:
                (STATE_DIR / ident).mkdir()
                break
            except FileExistsError:
                seq += 1
        self.id, self._state = ident, STATE_DIR / ident
        (self._state / "owner.json").write_text(json.dumps(
            {"pid": pid, "start": start_time(pid), "id": ident}))
        for i, c in enumerate(self.containers):
            c.netns = c.hostname = f"{PREFIX}-{ident}-c{i}"
        self._claim_subnet(pid)
        net = ipaddress.ip_network(self.subnet)
        for i, c in enumerate(self.containers):
            c.address = str(net.network_address + 2 + i)
        self._write_state()
        (self._state / "hosts").write_text(self._hosts())
        for i, c in enumerate(self.containers):
            self._create_container(i, c)
        self._write_agent()

    def _claim_subnet(self, pid: int) -> None:
        """Pick a /24 of 10.231.0.0/16 that is unused here; creating the bridge claims it."""
        if self.count > 253:
            raise UsageError(f"{self.count} containers: at most 253 fit in one /24")
        ip = tool("ip")
        used = used_networks()
        start = (pid * 31 + self._seq0) % 254
        for k in range(254):
            x = (start + k) % 254 + 1
            net = ipaddress.ip_network(f"{SUBNET_BASE}.{x}.0/24")
            if any(net.overlaps(u) for u in used if u.prefixlen > 0):
                continue
            bridge = f"ddlcbr{x}"
            res = sh([ip, "link", "add", bridge, "type", "bridge"], check=False)
            if res.returncode != 0:
                if "exists" in res.stderr:
                    continue
                raise UnsupportedError(f"cannot create bridge {bridge}: {res.stderr.strip()}")
            self.bridge, self.subnet = bridge, str(net)
            self.bridge_address = str(net.network_address + 1)
            self._label(bridge)
            _disable_ipv6(bridge)
            sh([ip, "addr", "add", f"{self.bridge_address}/24", "dev", bridge])
            sh([ip, "link", "set", bridge, "up"])
            return
        raise UnsupportedError(f"no free /24 left in {SUBNET_BASE}.0.0/16",
                               "remove stale ddlcbr* bridges (ddlcomm cleans its own)")

    def _create_container(self, i: int, c: Container) -> None:
        ip = tool("ip")
        sh([ip, "netns", "add", c.netns], what=f"netns {c.netns}")
        veth = f"ddlcv{self.bridge[6:]}-{i}"
        c.veth = veth
        self._write_state()
        sh([ip, "link", "add", veth, "type", "veth", "peer", "name", CONTAINER_IFACE,
             "netns", c.netns], what="veth pair")
        self._label(veth)
        _disable_ipv6(veth)
        sh([ip, "link", "set", veth, "master", self.bridge, "up"])
        sh([tool("nsenter"), f"--net={NETNS_DIR / c.netns}", "--", "sh", "-c",
             f"echo 1 > /proc/sys/net/ipv6/conf/{CONTAINER_IFACE}/disable_ipv6 || true"],
            check=False)
        sh([ip, "-n", c.netns, "addr", "add", f"{c.address}/24", "dev", CONTAINER_IFACE])
        sh([ip, "-n", c.netns, "link", "set", CONTAINER_IFACE, "up"])
        sh([ip, "-n", c.netns, "link", "set", "lo", "up"])
        if c.cpus is not None:
            c.cgroup = make_cpuset(c.netns, c.cpus, c.mems, self.notes)
            self._write_state()
        c.nsdir = self._state / c.name
        c.nsdir.mkdir()
        for kind in ("ipc", "uts", "mnt"):
            (c.nsdir / kind).touch()
        # Inside the new mount namespace: own /dev/shm, /sys of the netns, our hosts
        # file; then drop the views of /run/netns and /run/ddlcomm (they would keep
        # other containers' namespaces referenced).
        setup = "; ".join([
            "set -e",
            f"hostname {shlex.quote(c.hostname)}",
            "mount -t tmpfs -o mode=1777,nosuid,nodev ddlcomm-shm /dev/shm",
            f"mount --bind {shlex.quote(str(self._state / 'hosts'))} /etc/hosts",
            "umount -l /sys && mount -t sysfs sysfs /sys && { %s; } || true" % cgroup_remount(),
            "umount -l /run/netns 2>/dev/null || true",
            f"umount -l {shlex.quote(str(STATE_DIR))} 2>/dev/null || true",
        ])
        self._write_state()
        sh([tool("unshare"), f"--ipc={c.nsdir / 'ipc'}", f"--uts={c.nsdir / 'uts'}",
             f"--mount={c.nsdir / 'mnt'}", "--propagation", "private",
             tool("nsenter"), f"--net={NETNS_DIR / c.netns}", "--", "sh", "-c", setup],
            what=f"namespaces of {c.netns}")

    def _label(self, link: str) -> None:
        """Alias ``link`` with its owner and set, ``ddlcomm owner=PID set=ID``: how
        :func:`.removal.cleanup_stale` knows a dead owner's links."""
        sh([tool("ip"), "link", "set", link, "alias", f"{ALIAS_PREFIX}{os.getpid()} set={self.id}"])

    def _hosts(self) -> str:
        """The containers' /etc/hosts: the bridge's address and each container's, each also
        in its IPv4-mapped IPv6 form (``::ffff:A.B.C.D``), as a dual-stack listener (torch's
        TCPStore) sees an IPv4 peer: unnamed there, glibc asked DNS, and c10d warned once a
        rank ("The hostname of the client socket cannot be retrieved. err=-3")."""
        names = [(self.bridge_address, f"{PREFIX}-{self.id}-host")]
        names += [(c.address, c.hostname) for c in self.containers]
        lines = ["127.0.0.1\tlocalhost"]
        lines += [f"{address}\t{name}" for address, name in names]
        lines += [f"::ffff:{address}\t{name}" for address, name in names]
        return "\n".join(lines) + "\n"

    def _write_state(self) -> None:
        assert self._state is not None
        state = {"id": self.id, "bridge": self.bridge, "subnet": self.subnet,
                 "netns": [c.netns for c in self.containers if c.netns],
                 "veth": [c.veth for c in self.containers if c.veth],
                 "cgroups": [str(c.cgroup) for c in self.containers if c.cgroup is not None]}
        (self._state / "state.json").write_text(json.dumps(state))

    def _write_agent(self) -> None:
        assert self._state is not None
        cases = []
        for c in self.containers:
            cmd = shlex.join(self.exec_prefix(c))
            cases.append(f"  {c.address}|{c.hostname}) set -- {cmd} sh -c \"$cmd\" ;;")
        script = f"""#!/bin/sh
# ddlcomm launch agent of container set {self.id}: an ssh stand-in for
# mpirun/mpiexec.  Usage: agent [ssh options] HOST COMMAND...
# Runs COMMAND (its words joined by spaces, as ssh does) with sh -c inside the
# container HOST names (its address or hostname).
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 1 ]; then echo "ddlcomm agent: no host given" >&2; exit 255; fi
host=${{1#*@}}; shift
cmd="$*"
case "$host" in
{chr(10).join(cases)}
  *) echo "ddlcomm agent: $host is not a container of set {self.id}" >&2; exit 255 ;;
esac
exec "$@"
"""
        path = self._state / "agent"
        path.write_text(script)
        path.chmod(0o755)

    # ---------------------------------------------------------------- signals
    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP end the owner through SystemExit, so finally/with clean up."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._old_handlers[sig] = signal.signal(sig, _raise_exit)
            except (ValueError, OSError):
                pass

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except (ValueError, OSError, TypeError):
                pass
        self._old_handlers.clear()


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _disable_ipv6(link: str) -> None:
    """No IPv6 chatter (router solicitations, DAD) on our links; best effort."""
    try:
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1")
    except OSError:
        pass
