"""The launchers' command lines for containers and CPU/NUMA binding.

Pure functions: they build command lines from a :class:`~.containers.ContainerSet`
(or None for ranks on this host) and start nothing.  Each container is given
to the MPI launcher as a *host* whose address is the container's, with as many
slots as it holds ranks, and the set's agent script stands in for ssh, as
between Docker containers on one machine:

Open MPI 5 (PRRTE)::

    mpirun -n N --host A0:n0,A1:n1 --map-by slot
           --prtemca plm_ssh_agent AGENT --prtemca plm_ssh_no_tree_spawn 1
           --prtemca prte_hetero_nodes 1
           --prtemca oob_tcp_if_include SUBNET --mca btl_tcp_if_include SUBNET
           --bind-to none|core|numa[:overload-allowed] PROGRAM

  ``oob_tcp_if_include`` keeps the daemons' connections back to mpirun on
  the bridge (mpirun listens on the bridge's ``.1``); ``btl_tcp_if_include``
  the ranks' TCP traffic on the containers' ``eth0``; no tree spawn, because
  only mpirun (in the root namespace) can enter the containers;
  ``prte_hetero_nodes`` makes every daemon report its own topology, without
  which mpirun maps all containers with its own (unrestricted) cpus and binds
  a rank of a container to a core outside that container's cpuset.

MPICH (Hydra)::

    mpiexec -n N -hosts A0:n0,A1:n1 -launcher ssh -launcher-exec AGENT
            -iface BRIDGE [-bind-to core|numa] PROGRAM

  ``-iface`` makes mpiexec give its proxies the bridge's address to call back
  (the root namespace's hostname does not resolve inside a container).

The layout itself (ranks in blocks over containers, cpus of each) is
:mod:`.placement`'s; the containers are :mod:`.containers`'.
"""
from __future__ import annotations

import os
import shutil
from typing import Mapping, Optional, Sequence

from ..errors import UnsupportedError, UsageError
from .containers import CONTAINER_IFACE, ContainerSet
from .mpirun import HYDRA_OVERSUBSCRIBED, MPILauncher, host_cpus, openmpi_slots
from .placement import check_bind, cpu_sets, format_cpulist, numa_nodes

__all__ = ["mpirun_command", "spawn_prefixes", "host_bind_prefixes", "master_addr",
           "hosts_argument"]


def hosts_argument(cset: ContainerSet) -> str:
    """``A0:n0,A1:n1,...``: each container's address with its rank count (both MPIs)."""
    return ",".join(f"{c.address}:{len(c.ranks)}" for c in cset.containers)


def _overloaded(cset: Optional[ContainerSet], nranks: int, cores: int) -> bool:
    """More ranks than cpus somewhere: binding to cores must then share them."""
    if cset is None:
        return nranks > cores
    return any(len(c.ranks) > len(c.cpus if c.cpus is not None else range(cores))
               for c in cset.containers)


#: Open MPI's mapping of more ranks than cores bound to cores: dealt round the cores (rank
#: i + cores on rank i's core, as MPICH and ddlcomm's own spawn place them); by default it
#: filled a core first (4 ranks on 2 cores: 0,0,1,1; with these: 0,1,0,1, checked here).
OPENMPI_DEALT_CORES = ("--map-by", "core", "--rank-by", "span")


def _openmpi_bind(bind: str, overloaded: bool, hwthreads: bool = False) -> list[str]:
    if bind == "none":
        return ["--bind-to", "none"]
    if bind == "core" and hwthreads:        # more ranks than cores: one hardware thread each
        bind = "hwthread"
    return ["--bind-to", f"{bind}:overload-allowed" if overloaded else bind]


def _openmpi_containers(cset: ContainerSet, oversubscribed: bool) -> list[str]:
    """Open MPI's options that start its ranks in ``cset``'s containers."""
    opts = ["--host", hosts_argument(cset), "--map-by", "slot",
            "--prtemca", "plm_ssh_agent", str(cset.agent_script()),
            "--prtemca", "plm_ssh_no_tree_spawn", "1",
            "--prtemca", "prte_hetero_nodes", "1",
            "--prtemca", "oob_tcp_if_include", cset.subnet,
            "--mca", "btl_tcp_if_include", cset.subnet]
    if oversubscribed:
        # Each container sees only its own slots, so Open MPI does not know the
        # machine is oversubscribed and its ranks busy-poll without yielding:
        # 4 ranks in 2 containers on 2 cpus took 2 s per 16 MiB all-reduce
        # instead of 43 ms.  --oversubscribe implies this without containers.
        opts += ["--mca", "mpi_yield_when_idle", "1"]
    return opts


def _hydra_bind(bind: str) -> list[str]:
    # Hydra binds round-robin over the cores/nodes it sees; "none" is its default.
    return [] if bind == "none" else ["-bind-to", bind]


def mpirun_command(launcher: MPILauncher, cset: Optional[ContainerSet], nranks: int,
                   program: Sequence[str], bind: str = "none", cores: Optional[int] = None,
                   physical: Optional[int] = None) -> tuple[list[str], dict[str, str]]:
    """The launcher's argv for ``nranks`` ranks of ``program``, and extra environment.

    With ``cset`` the ranks go into its containers (see the module docstring
    for the options); without, they run on this host with only the binding
    options (and ``--oversubscribe`` for Open MPI beyond ``cores``; with containers, beyond ``cores``
    ``--mca mpi_yield_when_idle 1`` instead, since no container is
    oversubscribed by itself); MPICH gets
    :data:`~.mpirun.HYDRA_OVERSUBSCRIBED` in the extra environment beyond
    ``cores`` too, or where a container has more ranks than cpus.
    ``cores``: the cpus of this machine (default: those this process may
    use), on ``physical`` cores (default: ``cores`` where only that is given,
    else this host's); Open MPI's ranks past the physical cores take
    hardware threads as slots (:data:`~.mpirun.OPENMPI_HWTHREAD_SLOTS`) and
    binding to cores becomes binding to hardware threads.  ``bind`` is
    ``none``, ``core`` or ``numa``; binding more ranks than cpus to cores
    lets them share (``:overload-allowed`` for Open MPI).
    Pass the environment through ``launcher.environment(extra | base)``, so
    that what the caller set wins.
    """
    check_bind(bind)
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise UsageError(f"rank count must be a positive integer, not {nranks!r}")
    if cset is not None and cset.nranks != nranks:
        raise UsageError(f"the containers hold {cset.nranks} ranks, not {nranks}")
    cores, physical = (cores, physical or cores) if cores else host_cpus()
    overloaded = _overloaded(cset, nranks, cores)
    cmd = [launcher.path, "-n", str(nranks)]
    extra: dict[str, str] = {}
    hwthreads = False
    if launcher.family == "openmpi":
        if cset is None:
            slots = openmpi_slots(nranks, cores, physical)
            hwthreads = "--use-hwthread-cpus" in slots
            cmd += slots
            if "--oversubscribe" in slots and bind == "core":
                cmd += list(OPENMPI_DEALT_CORES)
        else:
            cmd += _openmpi_containers(cset, oversubscribed=nranks > cores)
        cmd += _openmpi_bind(bind, overloaded, hwthreads)
    elif launcher.family == "hydra":
        if cset is not None:
            cmd += ["-hosts", hosts_argument(cset), "-launcher", "ssh",
                    "-launcher-exec", str(cset.agent_script()), "-iface", cset.bridge]
        cmd += _hydra_bind(bind)
        if nranks > cores or overloaded:
            extra.update(HYDRA_OVERSUBSCRIBED)
    elif cset is not None or bind != "none":
        raise UnsupportedError(f"{launcher.path} is neither Open MPI's nor MPICH's launcher: "
                               "ddlcomm cannot place its ranks in containers or bind them",
                               "use Open MPI 5 or MPICH, or leave out --containers/--bind")
    return cmd + [str(p) for p in program], extra


def on_host(launcher: MPILauncher, nranks: int, program: Sequence[str],
            base: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The launcher's argv and environment (``base`` and what the launcher needs) for
    ``nranks`` ranks of ``program`` on this host, unbound: bench's rule without --bind or
    --containers, for train, the C reference and the tests."""
    cmd, extra = mpirun_command(launcher, None, nranks, program)
    return cmd, launcher.environment({**extra, **base})


def host_bind_prefixes(nranks: int, bind: str, available: Optional[Sequence[int]] = None,
                       nodes: Optional[dict[int, list[int]]] = None) -> list[list[str]]:
    """``taskset -c CPUS`` per rank on this host: ``core`` gives rank r cpu r (mod the
    cpus this process may use), ``numa`` the cpus of NUMA node r (mod the nodes);
    ``none`` nothing.  The same deal as containers get (:func:`.placement.cpu_sets`)."""
    check_bind(bind)
    if bind == "none":
        return [[] for _ in range(nranks)]
    taskset = shutil.which("taskset")
    if taskset is None:
        raise UnsupportedError("--bind needs `taskset`, which is not installed", "install util-linux")
    plan = cpu_sets(nranks, bind, sorted(os.sched_getaffinity(0)) if available is None else available,
                    numa_nodes() if nodes is None else nodes)
    return [[taskset, "-c", format_cpulist(cpus[:1] if bind == "core" else cpus)]
            for cpus in plan.cpus]


def master_addr(cset: Optional[ContainerSet]) -> str:
    """The rendezvous address for ``env://`` ranks: rank 0's container, else loopback."""
    return "127.0.0.1" if cset is None else cset.container_of(0).address


def spawn_prefixes(cset: Optional[ContainerSet], nranks: int,
                   bind: str = "none") -> list[list[str]]:
    """Per-rank argv prefix for ddlcomm's own spawner (gloo): rank r runs in its container.

    Each prefix enters the rank's container (:meth:`ContainerSet.exec_prefix`)
    and then runs ``env MASTER_ADDR=<rank 0's container address>
    GLOO_SOCKET_IFNAME=eth0 LOCAL_RANK=i LOCAL_WORLD_SIZE=n`` (i: the rank's place among
    the n of its container, as mpirun counts a host's), so it overrides the loopback
    ``MASTER_ADDR`` and the job-wide local rank that :func:`spawn.rank_env` sets
    (``MASTER_ADDR`` is also returned by :func:`master_addr`).
    With binding ``core`` each rank is pinned to one cpu of its container
    (round-robin).  Without containers the prefix is ``taskset -c CPUS`` for
    ``bind`` (:func:`host_bind_prefixes`), else empty.
    """
    if cset is None:
        return host_bind_prefixes(nranks, bind)
    if cset.nranks != nranks:
        raise UsageError(f"the containers hold {cset.nranks} ranks, not {nranks}")
    addr = master_addr(cset)
    out = []
    for r in range(nranks):
        c = cset.container_of(r)
        prefix = cset.exec_prefix(c)
        if cset.bind == "core" and c.cpus:
            prefix += ["taskset", "-c", str(c.cpus[c.ranks.index(r) % len(c.cpus)])]
        # the rank's place in its container, as mpirun's local rank counts it (each
        # container is a host), so a layout picks the same GPUs under either launcher
        out.append(prefix + ["env", f"MASTER_ADDR={addr}", f"GLOO_SOCKET_IFNAME={CONTAINER_IFACE}",
                             f"LOCAL_RANK={c.ranks.index(r)}", f"LOCAL_WORLD_SIZE={len(c.ranks)}"])
    return out
