"""Data paths: where a rank's data lives and how it reaches the collective (README, "Workloads").

Each path is a class in :data:`PATHS`, looked up by name:

``host``
    data in host memory (the run's ``--memory`` kind); the collective on it.
``host-staged``
    data on the device; each collective is three timed phases: ``d2h`` (device
    to pinned host memory, by the ranks that send), the collective on the
    pinned host buffers over any backend, ``h2d`` (back to the device, by the
    ranks that receive).
``direct``
    device buffers handed to the MPI itself: only when the MPI says at run time
    that it is CUDA-aware (``MPIX_Query_cuda_support``); otherwise refused with
    the evidence.  A GPU pointer is never handed to a CPU-only library.
``nccl-chief``
    the PS server (rank 0) keeps its data in pinned host memory and sends to
    one chief worker (rank 1) over MPI; the chief copies to its GPU; the
    workers broadcast among themselves with NCCL.  For the gather the workers
    all-gather with NCCL, the chief copies the table to the host and sends it
    to the server over MPI.  All-reduce: NCCL among all ranks.

A path is opened in a rank (:meth:`DataPath.open`) into a :class:`PathRun`:
its :class:`Side` (where this rank's data lives, and the few operations a
workload does on it) and its :meth:`~PathRun.stage` (one collective of a step
as named, separately timed parts).  The device paths are parameterised by a
torch device: tests run their plumbing with CPU tensors standing in for the
GPU (``HostStaged(device="cpu")``; ``NCCLChief(backend="gloo", device="cpu")``
with Gloo standing in for NCCL), which checks the staging and the phase
records, not a GPU.
"""
from __future__ import annotations

from typing import Sequence

from ..collectives import get_collective
from ..errors import UnsupportedError, UsageError
from ..machine import mpi as mpi_facts
from ..memory import on_device
from ..memory.gpu import cuda_available
from . import chief
from .sides import HostSide, TorchSide, pinned_alloc
from .stages import DataPath, PathRun, Stage, nothing

# ------------------------------------------------------------------ paths
class _HostRun(PathRun):
    def stage(self, comm, collective, send, recv=None, op=None, root=0) -> Stage:
        kwargs = {"op": op} if op is not None else {}
        return Stage(collective, ((collective, comm.bind(collective, send, recv, root=root,
                                                         **kwargs)),))


class Host(DataPath):
    name = "host"
    description = "data in host memory, collectives on host buffers"
    backend_memory = None

    def open(self, comm, plan, alloc, server: bool) -> PathRun:
        if on_device(plan.memory):
            return _DirectRun(TorchSide("cuda"))       # the backend takes device tensors
        return _HostRun(HostSide(alloc))


class _StagedRun(PathRun):
    """Each collective: device -> pinned host, the collective there, pinned host -> device."""

    def __init__(self, side: TorchSide, alloc_pinned) -> None:
        super().__init__(side)
        self._pinned = alloc_pinned

    def copy_bars(self, comm, mine):
        return self.side.copy_bars(comm, mine)

    def stage(self, comm, collective, send, recv=None, op=None, root=0) -> Stage:
        side, row = self.side, get_collective(collective)
        hsend = self._pinned(send)
        hrecv = None if recv is None else hsend if recv is send else self._pinned(recv)
        coll = comm.bind(collective, hsend, hrecv, root=root, **({"op": op} if op else {}))
        # Only a broadcast's root sends data; the root gets nothing back it did not have.
        sends = not row.in_send or comm.rank == root
        receives = row.receives(comm.rank, root) and sends != row.in_send
        out, hout = row.result_of(send, recv), row.result_of(hsend, hrecv)

        def d2h() -> None:
            side.to_host(send, hsend)

        def h2d() -> None:
            side.to_device(hout, out)
        return Stage(collective, (("d2h", d2h if sends else nothing), (collective, coll),
                                  ("h2d", h2d if receives else nothing)),
                     copies={"d2h": hsend.nbytes if sends else 0,
                             "h2d": hout.nbytes if receives else 0})


class HostStaged(DataPath):
    name = "host-staged"
    description = "copy device to host, collective on pinned host buffers, copy back"
    needs_gpu = True

    def __init__(self, device: str = "cuda") -> None:
        #: the torch device the data lives on ("cpu" stands in for a GPU in tests)
        self.device = device

    def open(self, comm, plan, alloc, server: bool) -> PathRun:
        side = TorchSide(self.device)
        return _StagedRun(side, pinned_alloc(side))


class _DirectRun(PathRun):
    def stage(self, comm, collective, send, recv=None, op=None, root=0) -> Stage:
        call = comm.bind(collective, send, recv, root=root, **({"op": op} if op else {}))
        sync = comm.sync

        def call_and_sync() -> None:
            call()
            sync()
        return Stage(collective, ((collective, call_and_sync),))


class Direct(DataPath):
    name = "direct"
    description = "device buffers handed to a CUDA-aware MPI"
    needs_gpu = True
    backend_memory = "device"

    def check(self, plan) -> None:
        """Only MPI backends, and only an MPI that says at run time it is CUDA-aware."""
        refuse_cuda_unaware(plan.backends)

    def open(self, comm, plan, alloc, server: bool) -> PathRun:
        return _DirectRun(TorchSide("cuda"))


class NCCLChief(DataPath):
    name = "nccl-chief"
    description = "server to a chief worker over MPI, NCCL among the workers"
    needs_gpu = True
    for_collectives = False

    def __init__(self, backend: str = "nccl", device: str = "cuda") -> None:
        #: the workers' backend and the torch device their data lives on (tests stand gloo
        #: and "cpu" in for a GPU)
        self.backend, self.device = backend, device

    def check(self, plan) -> None:
        chief.check_plan(plan)

    def open(self, comm, plan, alloc, server: bool) -> PathRun:
        return chief.ChiefRun(comm, server, self.backend, self.device)


def refuse_cuda_unaware(backends: Sequence[str]) -> None:
    """UnsupportedError unless every backend is MPI and this MPI is CUDA-aware, with the
    evidence (:func:`ddlcomm.machine.mpi.facts`: a probe in a child process)."""
    others = [b for b in backends if b != "mpi"]
    if others:
        raise UsageError(f"--path direct hands device buffers to MPI: not to {', '.join(others)}",
                         "use --backend mpi (nccl and gloo take device memory on --path host "
                         "with --memory device)")
    facts = mpi_facts.facts()
    if facts.get("cuda_aware") is not True:
        evidence = "; ".join(facts.get("evidence") or ["no evidence"])
        raise UnsupportedError(f"--path direct needs a CUDA-aware MPI; this one "
                               f"({facts.get('library_version') or facts.get('reason')}) is "
                               f"not (cuda_aware: {facts.get('cuda_aware')}): {evidence}",
                               "use --path host-staged, or an MPI built with CUDA"
                               if cuda_available()[0] else
                               "an MPI built with CUDA, on a GPU machine (this one has none: "
                               "--path host)")


PATHS: dict[str, DataPath] = {p.name: p for p in (Host(), HostStaged(), Direct(), NCCLChief())}


def get_path(name: str) -> DataPath:
    """The data path ``name`` (UsageError naming the choices)."""
    try:
        return PATHS[name]
    except KeyError:
        raise UsageError(f"unknown data path {name!r}", f"choose from {', '.join(PATHS)}") from None


def check_path(name: str, plan) -> DataPath:
    """The data path ``name`` if it can run ``plan`` here, else an error saying why."""
    path = get_path(name)
    path.check(plan)              # first: the path's own reason (an MPI not CUDA-aware) says most
    if path.needs_gpu:
        ok, why = cuda_available()
        if not ok:
            raise UnsupportedError(f"data path {name} ({path.description}) needs a GPU: {why}",
                                   "use --path host")
    return path
