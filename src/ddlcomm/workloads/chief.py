"""The ``nccl-chief`` data path (README, "Workloads"; Choi et al.): MPI between the PS server and one
chief worker, NCCL among the workers.

The run's backend (MPI) links the server (rank 0) and the chief (rank 1); an
NCCL communicator over every rank, created once per process at the first
point that needs it (through :func:`ddlcomm.comm.registry.create`), carries
the workers' collectives inside a group of ranks 1..p-1.  Tests run the same
plumbing with Gloo on CPU tensors standing in for NCCL on the GPU
(``NCCLChief(backend="gloo", device="cpu")``): it checks the steps and their
records, not NCCL.

* PS broadcast: ``mpi`` (server -> chief, into pinned memory), ``h2d`` (the
  chief's copy to its GPU), ``nccl`` (the chief's broadcast to the workers).
* PS gather: ``nccl`` (all-gather among the workers), ``d2h`` (the chief's
  copy of the table to pinned memory), ``mpi`` (chief -> server).
* all-reduce (no server): NCCL's all-reduce over every rank.
"""
from __future__ import annotations

from ..comm import registry
from ..comm.buffers import tensor_dtype
from ..comm.nccl import NCCLGroup
from ..errors import DdlcommError, UsageError
from .sides import HostSide, TorchSide
from .stages import PathRun, Stage, nothing

CHIEF = 1
TAG = 21
_shared: dict = {}


def check_plan(plan) -> None:
    """The run's backends must hold an MPI communicator, there must be a chief (rank 1),
    and NCCL must run here."""
    others = [b for b in plan.backends if not registry.get_spec(b).mpi_handle]
    if others:
        raise UsageError(f"--path nccl-chief links the server and the chief over MPI: "
                         f"not over {', '.join(others)}", "use --backend mpi")
    if plan.ranks is not None and plan.ranks <= CHIEF:
        raise UsageError(f"--path nccl-chief needs a chief worker (rank {CHIEF}) beside rank 0: "
                         f"--ranks {plan.ranks} has none", f"use --ranks {CHIEF + 1} or more")
    try:
        registry.check("nccl")
    except DdlcommError as exc:
        raise type(exc)(f"--path nccl-chief runs NCCL among the workers, and {exc.args[0]}",
                        "use --path host on a machine without a GPU" if "GPU" in exc.args[0]
                        else exc.hint) from None


def _nccl(backend: str, world_size: int):
    """This process's ``backend`` (NCCL) communicator over every rank and its workers' group
    (created once)."""
    if backend not in _shared:
        nccl = registry.create(backend)
        _shared[backend] = nccl, NCCLGroup(nccl, range(CHIEF, world_size))
    return _shared[backend]


def close_shared() -> None:
    """Close the communicators this process's nccl-chief points created (a rank that ends
    with ``os._exit``, as ddlcomm's do, need not; a process that finalises torch must)."""
    while _shared:
        nccl, _ = _shared.popitem()[1]
        nccl.close()


class ChiefRun(PathRun):
    """nccl-chief in one rank: the server's data on the host, the workers' on their GPU
    (``device``; ``backend``: NCCL, or what stands in for it in tests)."""

    def __init__(self, world, server: bool, backend: str = "nccl", device: str = "cuda") -> None:
        self.world = world
        self.nccl, self.workers = _nccl(backend, world.size)
        self.is_server = server and world.rank == 0
        self._gpu = TorchSide(device)
        side = HostSide(self._pinned_alloc) if self.is_server else self._gpu
        super().__init__(side)

    def facts(self, comm) -> dict:
        """How NCCL let the ranks in, and the transports its communicators connected as the
        chief's log has them (the workers' group logs its own ranks, from 0): the chief's,
        since the server (rank 0, which makes the records) runs no NCCL call in a PS step;
        read after the point's calls, since NCCL connects a pair at its first use."""
        said = comm.broadcast_object(self.nccl.point_facts() if comm.rank == CHIEF else None,
                                     root=CHIEF)
        return {"chief": CHIEF, **said}

    def _pinned_alloc(self, dtype, count):
        return self._gpu.pinned(dtype, count)

    def stage(self, comm, collective, send, recv=None, op=None, root=0) -> Stage:
        build = {"broadcast": self._broadcast, "gather": self._gather,
                 "allreduce": self._allreduce}.get(collective)
        if build is None:
            raise UsageError(f"--path nccl-chief has no {collective}")
        return build(send, recv, op, root)

    def _broadcast(self, params, recv, op, root) -> Stage:
        rank, world = self.world.rank, self.world
        # every rank names the same copy parts: their bytes are agreed on over the ranks
        if self.is_server:
            return Stage("broadcast", (("mpi", lambda: world.send(params, CHIEF, TAG)),
                                       ("h2d", nothing), ("nccl", nothing)), copies={"h2d": 0})
        if rank == CHIEF:
            host = self._gpu.pinned(*_dtype_count(params))
            return Stage("broadcast", (("mpi", lambda: world.recv(host, 0, TAG)),
                                       ("h2d", lambda: self._gpu.to_device(host, params)),
                                       ("nccl", lambda: self.workers.broadcast(params, CHIEF))),
                         copies={"h2d": host.nbytes})
        return Stage("broadcast", (("mpi", nothing), ("h2d", nothing),
                                   ("nccl", lambda: self.workers.broadcast(params, CHIEF))),
                     copies={"h2d": 0})

    def _gather(self, grads, table, op, root) -> Stage:
        world, nworkers = self.world, world_workers(self.world)
        if self.is_server:
            rows = table[table.size // world.size:]            # rows 1..p-1: the workers'
            return Stage("gather", (("nccl", nothing), ("d2h", nothing),
                                    ("mpi", lambda: world.recv(rows, CHIEF, TAG))), copies={"d2h": 0})
        dtype, n = _dtype_count(grads)
        gathered = self._gpu.alloc(dtype, n * nworkers)
        if world.rank != CHIEF:
            return Stage("gather", (("nccl", lambda: self.workers.allgather(gathered, grads)),
                                    ("d2h", nothing), ("mpi", nothing)), copies={"d2h": 0})
        host = self._gpu.pinned(dtype, n * nworkers)
        return Stage("gather", (("nccl", lambda: self.workers.allgather(gathered, grads)),
                                ("d2h", lambda: self._gpu.to_host(gathered, host)),
                                ("mpi", lambda: world.send(host, 0, TAG))), copies={"d2h": host.nbytes})

    def _allreduce(self, grads, recv, op, root) -> Stage:
        call = self.nccl.bind("allreduce", grads, recv, op=op or "sum")
        sync = self.nccl.sync

        def call_and_sync() -> None:
            call()
            sync()
        return Stage("allreduce", (("allreduce", call_and_sync),))


def world_workers(world) -> int:
    return world.size - CHIEF


def _dtype_count(tensor):
    return tensor_dtype(tensor), tensor.numel()
