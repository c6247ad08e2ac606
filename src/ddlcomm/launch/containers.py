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
:func:`cleanup_stale`, which every new set runs first.

All of this needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); :func:`check_available`
says so in one line before anything is created.
"""
from __future__ import annotations

import atexit
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import UnsupportedError, UsageError
from .placement import cpu_sets, format_cpulist, numa_nodes, split_ranks
from .processes import first_close, owner_alive, pid_alive, start_time

#: Where sets keep their namespace files, hosts file and launch agent.
STATE_DIR = Path("/run/ddlcomm")
#: Where ``ip netns`` keeps network namespaces.
NETNS_DIR = Path("/run/netns")
#: Every name a set creates starts with this (netns, hostname).
PREFIX = "ddlc"
#: Link alias of every bridge and veth a set creates: ``ddlcomm owner=PID set=ID``.
ALIAS_PREFIX = "ddlcomm owner="
#: The private /16 whose /24s the sets use (one /24 per set, only inside its bridge).
SUBNET_BASE = "10.231"
#: Interface of each container (the inner end of its veth pair), as in Docker.
CONTAINER_IFACE = "eth0"
CMD_TIMEOUT_S = 30.0
KILL_GRACE_S = 3.0
#: How long removing a cpuset cgroup waits for its ended processes to leave it.
CGROUP_RMDIR_S = 10.0

_NETNS_RE = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-c\d+$")
_SET_RE = re.compile(r"^(\d+)-(\d+)$")
_ALIAS_RE = re.compile(r"ddlcomm owner=(\d+) set=(\S+)")


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


# ------------------------------------------------------------ shell helpers
def _tool(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}",
                                                    f"/usr/bin/{name}", f"/bin/{name}")
                                       if os.access(p, os.X_OK)), None)
    if path is None:
        raise UnsupportedError(f"--containers needs `{name}`, which is not installed",
                               "install iproute2 and util-linux")
    return path


def _sh(cmd: Sequence[str], check: bool = True, timeout: float = CMD_TIMEOUT_S,
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


def _mounted(path: Path) -> bool:
    target = str(path)
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == target for line in f)
    except OSError:
        return False


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


def _end_processes(netns_files: Sequence[Path], cgroups: Sequence[Path] = (),
                   grace_s: float = KILL_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL, the processes left in these network namespaces and cgroups."""
    pids = [p for f in netns_files for p in _pids_in_netns(f)]
    pids += [p for cg in cgroups for p in _cgroup_pids(cg)]
    pids = sorted(set(pids) - {os.getpid()})
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(pid_alive(p) and not _zombie(p) for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if pid_alive(p) and not _zombie(p)]
        if not pids:
            break
    return pids


def _cgroup_pids(cg: Path) -> list[int]:
    """The processes in cgroup ``cg`` (none when it is gone)."""
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _ensure_state_dir() -> None:
    """/run/ddlcomm as a private bind mount of itself (unshare --mount=FILE needs it)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if not _mounted(STATE_DIR):
        _sh([_tool("mount"), "--bind", str(STATE_DIR), str(STATE_DIR)], what="state directory")
    _sh([_tool("mount"), "--make-private", str(STATE_DIR)], what="state directory")


def _links() -> list[tuple[str, str]]:
    """(name, alias) of every link of the root namespace."""
    res = _sh([_tool("ip"), "-o", "link", "show"], check=False)
    out = []
    for line in res.stdout.splitlines():
        m = re.match(r"\d+:\s+([^:@\s]+)", line)
        if m:
            alias = re.search(r"\balias (.*?)(?:\\|$)", line)
            out.append((m.group(1), alias.group(1).strip() if alias else ""))
    return out


def _netns_names() -> list[str]:
    res = _sh([_tool("ip"), "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Networks already addressed or routed in the root namespace."""
    nets = []
    for cmd in (["-4", "-o", "addr", "show"], ["-4", "route", "show", "table", "all"]):
        res = _sh([_tool("ip"), *cmd], check=False)
        for tok in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", res.stdout):
            try:
                nets.append(ipaddress.ip_network(tok, strict=False))
            except ValueError:
                pass
    return nets


# ------------------------------------------------------------ cpuset cgroups
def _mountinfo() -> list[tuple[str, str, str]]:
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


def _cpuset_root() -> Optional[tuple[Path, str]]:
    """Mount point of the cgroup hierarchy with the cpuset controller, and "v1" or "v2"."""
    for mp, fstype, opts in _mountinfo():
        if fstype == "cgroup" and "cpuset" in opts.split(","):
            return Path(mp), "v1"
    for mp, fstype, _ in _mountinfo():
        if fstype == "cgroup2":
            try:
                if "cpuset" in (Path(mp) / "cgroup.controllers").read_text().split():
                    return Path(mp), "v2"
            except OSError:
                continue
    return None


def _own_cgroup(root: tuple[Path, str]) -> Path:
    """This process's cgroup directory in that hierarchy (new cpusets go beneath it)."""
    mp, kind = root
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (kind == "v1" and "cpuset" in controllers.split(",")) or \
                    (kind == "v2" and controllers == ""):
                return mp / path.lstrip("/")
    except (OSError, ValueError):
        pass
    return mp


def _make_cpuset(name: str, cpus: Sequence[int], mems: Optional[Sequence[int]],
                 notes: list[str]) -> Optional[Path]:
    """A cpuset cgroup ``name`` with these cpus (and memory nodes); None, with a note, if not."""
    root = _cpuset_root()
    if root is None:
        notes.append("no cpuset cgroup here: containers are bound with taskset, "
                     "which MPI's own binding may override")
        return None
    parent = _own_cgroup(root)
    cg = parent / name
    try:
        if root[1] == "v2":
            sub = parent / "cgroup.subtree_control"
            if "cpuset" not in sub.read_text().split():
                sub.write_text("+cpuset")
            all_mems = (parent / "cpuset.mems.effective").read_text().strip()
        else:
            all_mems = (parent / "cpuset.mems").read_text().strip()
        cg.mkdir()
        (cg / "cpuset.cpus").write_text(format_cpulist(cpus))
        (cg / "cpuset.mems").write_text(format_cpulist(mems) if mems else all_mems)
        return cg
    except OSError as exc:
        if cg.is_dir():
            _rmdir_cgroup(cg)
        notes.append(f"cannot make a cpuset cgroup ({exc.strerror or exc}): containers are "
                     "bound with taskset, which MPI's own binding may override")
        return None


def _rmdir_cgroup(cg: Path, wait_s: float = CGROUP_RMDIR_S) -> bool:
    """rmdir a cgroup, killing what is still in it until it is empty.

    EBUSY lasts while a process is in it: a command started just before the
    set's end can join after the set's processes were ended (``exec_prefix``
    joins on its way in), and on a loaded machine a killed process can take
    seconds to be gone.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cg.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            for pid in set(_cgroup_pids(cg)) - {os.getpid()}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)


def _cgroup_remount() -> str:
    """Shell commands that mount the host's cgroup hierarchies again on a fresh /sys.

    A container gets its own sysfs (so ``/sys/class/net`` lists its own
    interfaces); the cgroup mounts under it are remade so that hwloc (MPI's
    binding) sees the container's cpuset, as inside a Docker container.
    """
    cmds = []
    for mp, fstype, opts in _mountinfo():
        if not (mp == "/sys/fs/cgroup" or mp.startswith("/sys/fs/cgroup/")) or "\\" in mp:
            continue
        q = shlex.quote(mp)
        if fstype == "tmpfs" and mp == "/sys/fs/cgroup":
            cmds.append(f"mount -t tmpfs -o mode=755,nosuid,nodev,noexec cgroup {q}")
        elif fstype == "cgroup":
            o = ",".join(x for x in opts.split(",") if x not in ("rw", "ro"))
            cmds.append(f"{{ mkdir -p {q}; mount -t cgroup -o {shlex.quote(o)} cgroup {q}; }}")
        elif fstype == "cgroup2":
            cmds.append(f"{{ mkdir -p {q}; mount -t cgroup2 cgroup2 {q}; }}")
    return "; ".join(cmds) or "true"


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
    for tool in ("ip", "nsenter", "unshare", "mount", "umount"):
        _tool(tool)
    probe = (f"{_tool('ip')} link add ddlcprobe0 type bridge && "
             f"{_tool('ip')} link add ddlcprobe1 type veth peer name ddlcprobe2 && "
             f"mount -t tmpfs tmpfs /dev/shm && hostname ddlc-probe")
    try:
        res = subprocess.run([_tool("unshare"), "--net", "--ipc", "--uts", "--mount",
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
        prefix += [_tool("nsenter"), "--wd=.", f"--net={NETNS_DIR / c.netns}",
                   f"--ipc={c.nsdir / 'ipc'}", f"--uts={c.nsdir / 'uts'}",
                   f"--mount={c.nsdir / 'mnt'}", "--"]
        if c.cpus is not None and c.cgroup is None:
            prefix += [_tool("taskset"), "-c", format_cpulist(c.cpus)]
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
        _, left = _remove_set(self.id, [c.netns for c in self.containers if c.netns],
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
        _ensure_state_dir()
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
        ip = _tool("ip")
        used = _used_networks()
        start = (pid * 31 + self._seq0) % 254
        for k in range(254):
            x = (start + k) % 254 + 1
            net = ipaddress.ip_network(f"{SUBNET_BASE}.{x}.0/24")
            if any(net.overlaps(u) for u in used if u.prefixlen > 0):
                continue
            bridge = f"ddlcbr{x}"
            res = _sh([ip, "link", "add", bridge, "type", "bridge"], check=False)
            if res.returncode != 0:
                if "exists" in res.stderr:
                    continue
                raise UnsupportedError(f"cannot create bridge {bridge}: {res.stderr.strip()}")
            self.bridge, self.subnet = bridge, str(net)
            self.bridge_address = str(net.network_address + 1)
            _sh([ip, "link", "set", bridge, "alias", f"{ALIAS_PREFIX}{pid} set={self.id}"])
            _disable_ipv6(bridge)
            _sh([ip, "addr", "add", f"{self.bridge_address}/24", "dev", bridge])
            _sh([ip, "link", "set", bridge, "up"])
            return
        raise UnsupportedError(f"no free /24 left in {SUBNET_BASE}.0.0/16",
                               "remove stale ddlcbr* bridges (ddlcomm cleans its own)")

    def _create_container(self, i: int, c: Container) -> None:
        ip, pid = _tool("ip"), os.getpid()
        _sh([ip, "netns", "add", c.netns], what=f"netns {c.netns}")
        veth = f"ddlcv{self.bridge[6:]}-{i}"
        c.veth = veth
        self._write_state()
        _sh([ip, "link", "add", veth, "type", "veth", "peer", "name", CONTAINER_IFACE,
             "netns", c.netns], what="veth pair")
        _sh([ip, "link", "set", veth, "alias", f"{ALIAS_PREFIX}{pid} set={self.id}"])
        _disable_ipv6(veth)
        _sh([ip, "link", "set", veth, "master", self.bridge, "up"])
        _sh([_tool("nsenter"), f"--net={NETNS_DIR / c.netns}", "--", "sh", "-c",
             f"echo 1 > /proc/sys/net/ipv6/conf/{CONTAINER_IFACE}/disable_ipv6 || true"],
            check=False)
        _sh([ip, "-n", c.netns, "addr", "add", f"{c.address}/24", "dev", CONTAINER_IFACE])
        _sh([ip, "-n", c.netns, "link", "set", CONTAINER_IFACE, "up"])
        _sh([ip, "-n", c.netns, "link", "set", "lo", "up"])
        if c.cpus is not None:
            c.cgroup = _make_cpuset(c.netns, c.cpus, c.mems, self.notes)
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
            "umount -l /sys && mount -t sysfs sysfs /sys && { %s; } || true" % _cgroup_remount(),
            "umount -l /run/netns 2>/dev/null || true",
            f"umount -l {shlex.quote(str(STATE_DIR))} 2>/dev/null || true",
        ])
        self._write_state()
        _sh([_tool("unshare"), f"--ipc={c.nsdir / 'ipc'}", f"--uts={c.nsdir / 'uts'}",
             f"--mount={c.nsdir / 'mnt'}", "--propagation", "private",
             _tool("nsenter"), f"--net={NETNS_DIR / c.netns}", "--", "sh", "-c", setup],
            what=f"namespaces of {c.netns}")

    def _hosts(self) -> str:
        lines = ["127.0.0.1\tlocalhost", f"{self.bridge_address}\t{PREFIX}-{self.id}-host"]
        lines += [f"{c.address}\t{c.hostname}" for c in self.containers]
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


# ------------------------------------------------------------ removal
def _remove_set(ident: str, netns: Sequence[str], nsdirs: Sequence[Path],
                veths: Sequence[str], bridge: str,
                cgroups: Sequence[Path] = ()) -> tuple[list[str], list[str]]:
    """Remove a set's processes, namespaces, links, cgroups and state: (removed, left)."""
    ip, umount = _tool("ip"), _tool("umount")
    removed: list[str] = []
    left: list[str] = []
    _end_processes([NETNS_DIR / n for n in netns], cgroups)

    def del_link(link: str) -> None:
        res = _sh([ip, "link", "del", link], check=False)
        gone = res.returncode == 0 or "Cannot find device" in res.stderr
        (removed if gone else left).append(f"link {link}")

    # Host ends of the veth pairs first: that removes both ends at once, whereas
    # a deleted netns takes its veth with it only later (the kernel's cleanup).
    names = {name for name, _ in _links()}
    for link in veths:
        if link in names:
            del_link(link)
    for cg in cgroups:
        if cg.is_dir():
            (removed if _rmdir_cgroup(cg) else left).append(f"cgroup {cg}")
    for d in nsdirs:
        for kind in ("ipc", "uts", "mnt"):
            f = d / kind
            if _mounted(f):
                if _sh([umount, str(f)], check=False).returncode != 0 and \
                        _sh([umount, "-l", str(f)], check=False).returncode != 0:
                    left.append(str(f))
    present = _netns_names()
    for n in netns:
        if n in present or (NETNS_DIR / n).exists():
            ok = _sh([ip, "netns", "del", n], check=False).returncode == 0
            (removed if ok else left).append(f"netns {n}")
    if bridge and bridge in {name for name, _ in _links()}:
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
    log.  Sets of live owners are never touched.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None and not os.path.exists("/usr/sbin/ip"):
        return []
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
        gone, _ = _remove_set(d.name, state.get("netns", []), nsdirs,
                              state.get("veth", []), state.get("bridge", ""),
                              [Path(p) for p in state.get("cgroups", [])])
        removed += gone
    return removed


def _stale_netns(is_dead: _DeadOwners) -> list[str]:
    """Network namespaces of dead owners without a state directory."""
    removed = []
    for n in _netns_names():
        m = _NETNS_RE.match(n)
        if m and is_dead(f"{m.group(1)}-{m.group(2)}", int(m.group(1))):
            _end_processes([NETNS_DIR / n])
            if _sh([_tool("ip"), "netns", "del", n], check=False).returncode == 0:
                removed.append(f"netns {n}")
    return removed


def _stale_cgroups(is_dead: _DeadOwners) -> list[str]:
    """Cpuset cgroups named like the namespaces of dead owners."""
    root = _cpuset_root()
    if root is None:
        return []
    removed = []
    base = _own_cgroup(root)
    for cg in (base.glob(f"{PREFIX}-*-c*") if base.is_dir() else []):
        m = _NETNS_RE.match(cg.name)
        if m and cg.is_dir() and is_dead(f"{m.group(1)}-{m.group(2)}", int(m.group(1))):
            _end_processes([], [cg])
            if _rmdir_cgroup(cg):
                removed.append(f"cgroup {cg}")
    return removed


def _stale_links(is_dead: _DeadOwners) -> list[str]:
    """Links (bridges, host ends of veth pairs) of dead owners, by their alias."""
    removed = []
    for name, alias in _links():
        m = _ALIAS_RE.search(alias)
        if m and is_dead(m.group(2), int(m.group(1))):
            if _sh([_tool("ip"), "link", "del", name], check=False).returncode == 0:
                removed.append(f"link {name}")
    return removed
