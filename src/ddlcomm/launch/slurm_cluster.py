"""A real Slurm cluster on one machine: nodes are namespace containers, each with its slurmd.

Debian's packages (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``) on
one machine, arranged as a cluster of ``N`` nodes:

- the nodes are the containers of a :class:`~ddlcomm.launch.containers.ContainerSet`
  (network, IPC, UTS and mount namespaces on a bridge): each node has its own
  host name ``ddlc-<id>-c<i>`` (Slurm's NodeName), address (NodeAddr),
  ``/dev/shm`` and loopback, and runs its own ``slurmd -D -N NAME``;
- ``slurmctld`` runs in the root namespace and listens on the bridge's address
  (``SlurmctldHost=HOST(ADDR)``, on a free port); so do ``srun``/``sbatch``,
  which reach the nodes over the bridge;
- one private ``munged`` (its own key and socket, ``AuthInfo=socket=...``)
  serves everyone: its socket is a path, and paths are not namespaced.

Everything lives under ``/run/ddlcomm-slurm/<set id>/`` (``slurm.conf``, the
munge key, spool and state directories, the daemons' logs); ``SLURM_CONF``
points the clients at it (:meth:`SlurmCluster.env`).  The daemons run in the
foreground as children of the owner with ``PR_SET_PDEATHSIG``, so they end
with it even when it is killed outright; :meth:`SlurmCluster.close` ends them,
removes the containers (processes still inside end first) and the state
directory, also on an exception, SIGTERM/SIGHUP and at exit.
"""
from __future__ import annotations

import atexit
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional

from ..errors import UnsupportedError, UsageError
from . import containers
from .containers import ContainerSet
from .namespaces import which
from .processes import die_with_parent, end, first_close, owner_alive, start_time
from .spawn import free_port

#: Where clusters keep their configuration, keys, spool and logs (one dir per cluster).
STATE_ROOT = Path("/run/ddlcomm-slurm")
#: Debian's packages, and a program each must provide.
PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "slurm-client": "srun",
            "munge": "munged"}
#: Installed when missing, not required: the PMIx library that Debian's mpi/pmix
#: plugin opens by this path, in the machine's multiarch folder (``srun --mpi=pmix``,
#: which Open MPI 5 needs).
OPTIONAL_PACKAGES = {"libpmix-dev": "/usr/lib/*-linux-gnu/pmix2/lib/libpmix.so"}
#: Seconds to wait for every node to register idle.
READY_TIMEOUT_S = 60.0
PARTITION = "ddlc"
_SET_RE = re.compile(r"^\d+-\d+$")


def missing_packages(optional: bool = False) -> list[str]:
    """Debian packages whose program (or file) is not installed here."""
    if optional:
        return [pkg for pkg, path in OPTIONAL_PACKAGES.items() if not glob.glob(path)]
    return [pkg for pkg, prog in PACKAGES.items() if which(prog) is None]


def pmix_available() -> bool:
    """Whether ``srun --mpi=pmix`` can load its PMIx library here."""
    return not missing_packages(optional=True)


def install_packages() -> None:
    """Install the missing packages with apt-get (root only); UnsupportedError if that fails.

    The optional ones (PMIx) are tried as well; their absence is no error.
    """
    missing, optional = missing_packages(), missing_packages(optional=True)
    hint = f"as root: apt-get install -y {' '.join(PACKAGES)}"
    if missing and (os.geteuid() != 0 or which("apt-get") is None):
        raise UnsupportedError(f"Slurm is not installed (missing {', '.join(missing)}) and "
                               "cannot be installed here (needs root and apt-get)", hint)
    if not (missing or optional) or os.geteuid() != 0 or which("apt-get") is None:
        return
    _apt(["update", "-qq"])
    why = _apt(["install", "-y", "-qq", *missing]) if missing else ""
    if why or missing_packages():
        raise UnsupportedError(f"apt-get could not install {', '.join(missing)}: {why}", hint)
    if optional:
        _apt(["install", "-y", "-qq", *optional])


def _apt(args: list[str]) -> str:
    """Run apt-get non-interactively; '' on success, else its last line of error."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    res = subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env,
                         timeout=900, stdin=subprocess.DEVNULL)
    if res.returncode == 0:
        return ""
    return (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]


def check_available(install: bool = False) -> None:
    """Raise UnsupportedError (one line, with a hint) unless a cluster can start here."""
    containers.check_available()
    if install:
        install_packages()
    elif missing_packages():
        raise UnsupportedError(f"Slurm is not installed (missing {', '.join(missing_packages())})",
                               f"as root: apt-get install -y {' '.join(PACKAGES)}")


class SlurmCluster:
    """``with SlurmCluster(2) as cluster:`` a controller and two nodes, ready (idle).

    Attributes once open: ``nodes`` (their names), ``conf`` (slurm.conf),
    ``state`` (the private directory), ``containers`` (the ContainerSet).
    ``cpus`` is what each node declares (Slurm's CPUs=; this machine's count
    by default): the nodes share the machine's cores.
    """

    def __init__(self, nodes: int = 2, cpus: Optional[int] = None, memory_mb: int = 2048) -> None:
        if nodes < 1:
            raise UsageError("a cluster needs at least one node")
        self.count, self.memory_mb = nodes, memory_mb
        self.cpus = cpus or os.cpu_count() or 1
        self.nodes: list[str] = []
        self.state: Optional[Path] = None
        self.conf: Optional[Path] = None
        self.containers: Optional[ContainerSet] = None
        self._daemons: list[tuple[str, subprocess.Popen]] = []
        self._open = False

    # ---------------------------------------------------------------- public
    def __enter__(self) -> "SlurmCluster":
        check_available()
        cleanup_stale()
        self._open = True
        atexit.register(self.close)
        try:
            self.containers = ContainerSet(self.count, self.count).__enter__()
            self.nodes = [c.hostname for c in self.containers.containers]
            self.state = STATE_ROOT / self.containers.id
            self.state.mkdir(parents=True)
            self.conf = self.state / "slurm.conf"
            (self.state / "owner").write_text(start_time(os.getpid()) or "")
            self._start_munge()
            self._write_conf()
            self._start_daemons()
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def env(self, base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        """``base`` (os.environ by default) with SLURM_CONF pointing at this cluster."""
        assert self.conf is not None, "the cluster is not up"
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def describe(self) -> str:
        cs = self.containers
        assert cs is not None and self.conf is not None
        lines = [f"slurm cluster {cs.id}: controller {cs.bridge_address}:{self._port} "
                 f"(SLURM_CONF={self.conf}), partition {PARTITION}"]
        lines += [f"  node {c.hostname} {c.address} (slurmd, CPUs={self.cpus})"
                  for c in cs.containers]
        return "\n".join(lines)

    def close(self) -> None:
        """End the daemons, remove the containers and the state (idempotent)."""
        if not first_close(self):
            return
        for _, proc in reversed(self._daemons):
            end(proc)
        self._daemons.clear()
        if self.containers is not None:
            self.containers.close()
        if self.state is not None:
            shutil.rmtree(self.state, ignore_errors=True)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until every node is idle in ``sinfo``; UnsupportedError with the logs if not."""
        deadline, states = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            for name, proc in self._daemons:
                if proc.poll() is not None:
                    raise UnsupportedError(f"{name} ended (exit {proc.returncode}): "
                                           f"{self._log_tail(name)}")
            res = subprocess.run([which("sinfo") or "sinfo", "-h", "-N", "-o", "%N %t"],
                                 capture_output=True, text=True, env=self.env(), timeout=30)
            states = res.stdout.strip()
            idle = {line.split()[0] for line in states.splitlines()
                    if line.split()[1:] == ["idle"]}
            if idle >= set(self.nodes):
                return
            time.sleep(0.5)
        raise UnsupportedError(f"the Slurm nodes did not become idle within {timeout_s:g} s "
                               f"(sinfo: {states or 'nothing'}); {self._log_tail('slurmctld')}")

    # ---------------------------------------------------------------- daemons
    def _start_munge(self) -> None:
        assert self.state is not None
        key = self.state / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (self.state / "munge").mkdir(mode=0o755)
        self._munge_socket = self.state / "munge" / "munge.socket"
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={key}",
                               f"--socket={self._munge_socket}",
                               f"--pid-file={self.state / 'munged.pid'}",
                               f"--seed-file={self.state / 'munge.seed'}",
                               f"--log-file={self.state / 'munged.log'}"])
        deadline = time.monotonic() + 10
        while not self._munge_socket.exists():
            if time.monotonic() > deadline or self._daemons[-1][1].poll() is not None:
                raise UnsupportedError(f"munged did not start: {self._log_tail('munged')}")
            time.sleep(0.05)

    def _start_daemons(self) -> None:
        cs = self.containers
        assert cs is not None and self.conf is not None
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for c in cs.containers:
            (self.state / f"spool-{c.hostname}").mkdir()
            (self.state / f"tmp-{c.hostname}").mkdir()
            subprocess.run([*cs.exec_prefix(c), "mount", "--bind",
                            str(self.state / f"tmp-{c.hostname}"), str(self.state / "node-tmp")],
                           check=True, capture_output=True, timeout=30)
            self._spawn(f"slurmd-{c.hostname}",
                        [*cs.exec_prefix(c), which("slurmd") or "slurmd", "-D",
                         "-N", c.hostname, "-f", str(self.conf)])

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.state is not None
        argv[0] = which(argv[0]) or argv[0]
        out = open(self.state / f"{name}.out", "wb")
        with out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=str(self.state),
                                    preexec_fn=die_with_parent(), env=self.env(
                                        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}))
        self._daemons.append((name, proc))
        (self.state / f"{name}.daemon").write_text(f"{proc.pid} {start_time(proc.pid) or ''}")

    def _log_tail(self, name: str, lines: int = 5) -> str:
        assert self.state is not None
        for path in (self.state / f"{name}.log", self.state / f"{name}.out"):
            try:
                text = path.read_text(errors="replace").strip().splitlines()
            except OSError:
                continue
            if text:
                return f"{path}: " + " | ".join(text[-lines:])
        return f"no log of {name} in {self.state}"

    # ---------------------------------------------------------------- config
    def _write_conf(self) -> None:
        cs = self.containers
        assert cs is not None and self.state is not None
        self._port = free_port("")        # any address: the containers reach it
        assert self.conf is not None
        self.conf.write_text(slurm_conf(self.state, socket.gethostname().split(".")[0],
                                        cs.bridge_address, self._port, self._munge_socket,
                                        [(c.hostname, c.address) for c in cs.containers],
                                        self.cpus, self.memory_mb))
        # PMIx's client directories: its own per node (they share /tmp here, unlike
        # real nodes) through a bind mount in each node's mount namespace.
        (self.state / "node-tmp").mkdir()
        (self.conf.parent / "mpi.conf").write_text(f"PMIxCliTmpDirBase={self.state}/node-tmp\n")


def slurm_conf(state: Path, host: str, address: str, port: int, munge_socket: Path,
               nodes: list[tuple[str, str]], cpus: int, memory_mb: int) -> str:
    """slurm.conf of a cluster whose state is under ``state`` (pure).

    Without cgroup delegation: processes are tracked through /proc
    (proctrack/linuxproc), tasks are not bound (task/none), nothing is
    accounted.  ``config_overrides``: nodes declare ``cpus`` whatever they see.
    """
    lines = [
        "ClusterName=ddlc",
        f"SlurmctldHost={host}({address})",
        f"SlurmctldPort={port}", "SlurmdPort=6818",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={state}/ctld", f"SlurmdSpoolDir={state}/spool-%n",
        f"SlurmctldPidFile={state}/slurmctld.pid", f"SlurmdPidFile={state}/slurmd-%n.pid",
        f"SlurmctldLogFile={state}/slurmctld.log", f"SlurmdLogFile={state}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "SwitchType=switch/none", "MpiDefault=pmi2",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "ReturnToService=2",
        "SlurmdParameters=config_overrides", "KillWait=5", "MinJobAge=60",
        "InactiveLimit=0", "SlurmdTimeout=60", "Waittime=0",
        # a task that dies ends its step (srun --kill-on-bad-exit=1 for every step): the
        # others would otherwise wait for it until a timeout
        "KillOnBadExit=1",
    ]
    lines += [f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
              for name, addr in nodes]
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE "
                 "OverSubscribe=YES State=UP")
    return "\n".join(lines) + "\n"


def cleanup_stale() -> list[str]:
    """State directories of clusters whose owner died: their daemons ended, the dirs removed.

    A cluster's directory is named by its container set's id ``<owner pid>-<seq>``;
    the owner's start time (``owner``) tells a reused pid apart.  The containers of
    such a cluster are :func:`containers.cleanup_stale`'s.
    """
    removed: list[str] = []
    if not STATE_ROOT.is_dir() or os.geteuid() != 0:
        return removed
    for d in sorted(STATE_ROOT.iterdir()):
        if not _SET_RE.match(d.name) or not d.is_dir():
            continue
        if owner_alive(int(d.name.split("-")[0]), _read(d / "owner") or None):
            continue
        for f in d.glob("*.daemon"):
            pid, _, start = _read(f).partition(" ")
            if pid.isdigit() and owner_alive(int(pid), start or None):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed + containers.cleanup_stale()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
