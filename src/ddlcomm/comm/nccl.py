"""Backend ``nccl``: torch.distributed with NCCL, on CUDA tensors (``--memory device``).

Everything but the device is :class:`~ddlcomm.comm.torchdist.TorchDistCommunicator`'s.
What is NCCL's own:

* Each rank uses GPU ``local_rank % gpus`` (:func:`ddlcomm.memory.gpu.use_gpu`).
* Ranks that share a GPU are let in as :func:`ddlcomm.comm.ncclinfo.shared_gpu_env`
  says (NCCL >= 2.30: ``NCCL_MULTI_RANK_GPU_ENABLE=1``; else one ``NCCL_HOSTID``
  per rank of a GPU; else refused).  The ranks learn who shares their GPU (by
  its uuid) through the process group's store, before NCCL's communicator
  exists: torch creates it at the first collective (no ``device_id`` at
  ``init_process_group``), here a barrier at start-up, so that a refusal by
  NCCL is one clear error.
* Timing: NCCL returns once the work is queued on a CUDA stream; :meth:`sync`
  waits for the current stream (OSU's ``-d cuda`` convention) and the timing
  loop calls it after every timed call.
* Transport: NCCL is told to log at ``NCCL_DEBUG=INFO`` into a file (unless the
  user chose a level), and every point records the transports read from it.
* gather: torch builds it from NCCL's send/recv in one group call.  Any-source
  receive (``recv_any``, ps-async's server) does not exist in NCCL: refused.
* Host arrays (the harness' own bookkeeping: times, agreement, objects) are
  copied to the GPU and back around each call; measured points hand device tensors.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import BackendUnavailable, UnsupportedError
from ..launch.env import LaunchInfo
from ..memory.gpu import cuda_available, use_gpu
from . import ncclinfo, torchdist
from .torchdist import TorchDistCommunicator, _tensor

#: Primitives whose NumPy arguments are staged through the GPU.
_STAGED = ("_send", "_recv", "_sendrecv", "_broadcast", "_gather", "_allgather", "_reduce",
           "_allreduce", "_reduce_scatter", "_alltoall")


def check_here() -> None:
    """Refuse (BackendUnavailable) where NCCL cannot run: no CUDA torch, no GPU, no NCCL."""
    ok, why = cuda_available()
    if not ok:
        raise BackendUnavailable(f"backend nccl needs a CUDA GPU: {why}",
                                 "run on a machine with an NVIDIA GPU, or use the gloo or mpi backend")
    torchdist._import_torch("nccl")


def _staging(name: str):
    """``name``'s primitive with NumPy arguments copied to the GPU and written back."""
    parent = getattr(TorchDistCommunicator, name)

    def primitive(self, *args):
        if not any(a.__class__ is np.ndarray for a in args):
            return parent(self, *args)
        copies: dict[int, object] = {}
        moved = [self._to_gpu(a, copies) for a in args]
        parent(self, *moved)
        for a, m in zip(args, moved):
            if a.__class__ is np.ndarray and a.flags.writeable:
                _tensor(a).copy_(m)
    primitive.__name__ = name
    return primitive


class NCCLCommunicator(TorchDistCommunicator):
    """torch.distributed with NCCL: CUDA tensors on GPU ``local_rank % gpus``."""

    name = "nccl"
    backend = "nccl"
    memories = ("device",)

    def _before_init(self, info: LaunchInfo) -> dict:
        torch = torchdist.torch
        self.place = use_gpu(self.local_rank)      # the argument, else the launcher's
        self.device = torch.device("cuda", self.place["gpu"])
        self._stream_sync = torch.cuda.current_stream(self.device).synchronize
        logging = ncclinfo.debug_env(os.environ)
        os.environ.update(logging)
        self._log = ncclinfo.log_path(os.environ, socket.gethostname(), os.getpid())
        #: ddlcomm's own log (not one the user named) is removed at close
        self._own_log = self._log if logging.get("NCCL_DEBUG_FILE") == ncclinfo.DEFAULT_LOG else None
        self._log_note = None if logging or self._log else \
            f"not read: NCCL_DEBUG={os.environ.get('NCCL_DEBUG')} was set without NCCL_DEBUG_FILE"
        return {}

    def __init__(self, local_rank: Optional[int] = None,
                 timeout_s: float = torchdist.DEFAULT_TIMEOUT_S) -> None:
        super().__init__(local_rank, timeout_s)
        if self.rendezvous is None:       # the caller's process group: its device, its setup
            self.device = torchdist.torch.device("cuda", torchdist.torch.cuda.current_device())
            self.place, self._log, self._log_note = {"gpu": self.device.index}, None, "not read"
            self._own_log = None
            self._stream_sync = torchdist.torch.cuda.current_stream(self.device).synchronize
            self.sharing = ncclinfo.SharedGpu({}, "the caller's process group")
            return
        self.sharing = self._let_in_sharers()
        try:
            self._barrier()               # NCCL's communicator is created here
        except Exception as exc:          # noqa: BLE001 - NCCL's refusal, said in one line
            torchdist.leave_at_exit()     # a group whose NCCL never started: not destroyed
            raise BackendUnavailable(f"NCCL refused to start on GPU {self.place['gpu']} "
                                     f"({self.sharing.how}): {type(exc).__name__}: {exc}",
                                     "use one rank per GPU" if self.sharing.env else
                                     "see NCCL's log (NCCL_DEBUG=INFO, NCCL_DEBUG_FILE)") from None

    def _let_in_sharers(self) -> ncclinfo.SharedGpu:
        """Count the ranks on this GPU (through the process group's store) and set NCCL's
        variables for them before NCCL starts."""
        dist = torchdist.dist
        # The default group's store is torch-private API, but the only channel the ranks
        # share before NCCL exists (stable since torch 1.x).
        store = dist.distributed_c10d._get_default_store()
        mine = self.place["gpu_uuid"]       # the physical GPU, as NCCL's duplicate test sees it
        store.set(f"ddlcomm/gpu/{self.rank}", mine)
        places = [store.get(f"ddlcomm/gpu/{r}").decode() for r in range(self.size)]
        self.place["ranks_per_gpu"] = places.count(mine)
        slot = places[:self.rank].count(mine)         # this rank's place among its GPU's ranks
        version = ncclinfo.parse_version(self.library_version)
        sharing = ncclinfo.shared_gpu_env(version, self.place["ranks_per_gpu"], slot,
                                          socket.gethostname(), os.environ)
        os.environ.update(sharing.env)
        return sharing

    def close(self) -> None:
        super().close()
        if self._own_log is not None:
            Path(self._own_log).unlink(missing_ok=True)
            self._own_log = None

    # ------------------------------------------------------------ identity
    @property
    def library(self) -> str:
        return "NCCL"

    @property
    def library_version(self) -> str:
        version = torchdist.torch.cuda.nccl.version()
        dotted = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        return f"{dotted} (torch {torchdist.torch.__version__})"

    def point_facts(self) -> dict:
        """How the ranks on a GPU were let in, the sync, and the transports NCCL logged so far
        (the runner stores each rank's GPU and how many ranks shared it)."""
        facts = {"gpu_sharing": self.sharing.how, "sync": "cuda stream after each timed call"}
        if self._log_note is not None:
            facts["nccl_transport"] = self._log_note
            return facts
        try:
            pairs = ncclinfo.parse_transports(Path(self._log).read_text(errors="replace").splitlines())
        except OSError as exc:
            facts["nccl_transport"] = f"not read: {exc}"
            return facts
        facts["nccl_transport"] = pairs
        facts["nccl_transports"] = ncclinfo.transport_kinds(pairs) if self.size > 1 else \
            ["none (one rank: NCCL connects nothing)"]
        return facts

    # ------------------------------------------------------------ primitives
    def _to_gpu(self, buf, copies: dict):
        """A NumPy array's copy on this rank's GPU (one copy per array); anything else as is."""
        if buf.__class__ is not np.ndarray:
            return buf
        moved = copies.get(id(buf))
        if moved is None:
            moved = copies[id(buf)] = _tensor(buf).to(self.device)
        return moved

    def _bind(self, coll, sendbuf, recvbuf, op, root):
        if sendbuf.__class__ is np.ndarray:         # host arrays: the staged primitives
            return super(TorchDistCommunicator, self)._bind(coll, sendbuf, recvbuf, op, root)
        return super()._bind(coll, sendbuf, recvbuf, op, root)

    def _barrier(self) -> None:
        torchdist.dist.barrier(device_ids=[self.device.index])

    def _recv_any(self, buf, tag):
        raise UnsupportedError("backend nccl has no receive from any source (NCCL needs the "
                               "sender's rank)", "use --backend mpi or gloo for ps-async")

    def _isend(self, buf, dest, tag):
        return _SyncedWork(super()._isend(self._device_only(buf), dest, tag), self.sync)

    def _irecv(self, buf, source, tag):
        return _SyncedWork(super()._irecv(self._device_only(buf), source, tag), self.sync)

    def _iallreduce(self, sendbuf, recvbuf, op):
        # NCCL's Work is done when the GPU is: is_completed() is test(), wait() then sync.
        work_wait, test = super()._iallreduce(self._device_only(sendbuf),
                                              self._device_only(recvbuf), op)

        def wait() -> None:
            work_wait()
            self.sync()
        return wait, test

    @staticmethod
    def _device_only(buf):
        if buf.__class__ is np.ndarray:
            raise UnsupportedError("backend nccl's non-blocking calls take CUDA tensors, not host "
                                   "arrays", "use --memory device")
        return buf


class _SyncedWork:
    """An NCCL Work whose ``wait()`` returns once the operation is done, as a request's does
    (NCCL's own ``wait()`` only makes the current stream wait for it)."""

    def __init__(self, work, sync) -> None:
        self._work, self._sync = work, sync

    def wait(self) -> None:
        self._work.wait()
        self._sync()

    def is_completed(self) -> bool:
        return self._work.is_completed()


for _name in _STAGED:
    setattr(NCCLCommunicator, _name, _staging(_name))


class NCCLGroup:
    """Some ranks of an NCCL communicator (``torch.distributed.new_group``), for the
    nccl-chief path's workers.  Every rank of ``comm`` creates it (NCCL's rule); the
    calls are for its members, roots given as ranks of ``comm``."""

    def __init__(self, comm: NCCLCommunicator, ranks) -> None:
        self.ranks = list(ranks)
        self.member = comm.rank in self.ranks
        self.group = torchdist.dist.new_group(self.ranks)
        self.sync = comm.sync

    def broadcast(self, tensor, root: int) -> None:
        """``root``'s tensor to every member, finished on return."""
        torchdist.dist.broadcast(tensor, src=root, group=self.group)
        self.sync()

    def allgather(self, out, tensor) -> None:
        """Every member's ``tensor`` in member order into ``out``, finished on return."""
        torchdist._all_gather_flat(out, tensor, group=self.group)
        self.sync()
