"""Backends over ``torch.distributed``: the shared communicator, and ``gloo``.

:class:`TorchDistCommunicator` is everything the torch.distributed backends
share (rendezvous, the bound calls, the primitives); ``gloo`` is it with the
Gloo backend, ``nccl`` (:mod:`ddlcomm.comm.nccl`) with NCCL.

Host buffers stay NumPy arrays at the interface; each call wraps them with
``torch.from_numpy`` (a view, no copy) and hands the tensor to
``torch.distributed``; CUDA tensors (``--memory device``) are handed over as
they are: Gloo takes them too in collectives (it copies through host memory itself),
not in point-to-point calls (:class:`GlooCommunicator`).  Every ddlcomm dtype is native to Gloo, float16
included (Gloo reduces half floats itself), and so is every op but ``avg``,
which is ``sum`` followed by the base class's division.

Costs that belong to this backend, not to ddlcomm:

* ``torch.distributed``'s reductions and broadcast work in place, so an
  out-of-place ``allreduce`` or ``reduce`` first copies ``sendbuf`` into
  ``recvbuf``, and a non-root's ``reduce`` copies ``sendbuf`` into a scratch
  buffer, because Gloo writes partial results into the non-roots' tensors
  (seen on torch 2.13).
* Inside ``ProcessGroupGloo`` (its source, torch >= 2.3): ``reduce_scatter``
  clones the input, allreduces all of it and copies out this rank's block,
  so it moves about twice the bytes of a real reduce-scatter; ``gather`` and
  ``allgather`` receive into a flat temporary that is then copied into
  ``recvbuf`` (passed as per-rank views: no copy of ddlcomm's own);
  ``alltoall`` writes into ``recvbuf`` directly.
* Each collective is handed to a Gloo worker thread and waited for, which adds
  latency that MPI's direct calls do not have.

Ranks meet in :func:`init_process_group`: through ``MASTER_ADDR`` and
``MASTER_PORT`` (torchrun, ``ddlcomm bench --ranks N``), under srun through
the step's first node and a port derived from the job's ids, or, under
mpirun, through a TCP store whose address travels by MPI.
"""
from __future__ import annotations

import atexit
import datetime
import functools
import importlib.util
import os
import socket
import sys
import warnings
from typing import Any, Callable, Optional

import numpy as np

from ..dtypes import DTYPES
from ..errors import BackendUnavailable, RankFailure, UnsupportedError, UsageError, first_line
from ..launch.env import LaunchInfo, detect, slurm_rendezvous
from .base import Communicator
from .mpi import _import_mpi

#: Seconds a rank waits for the others at start-up and in any one collective.
DEFAULT_TIMEOUT_S = 300.0
#: Launchers whose ranks can meet through MPI when MASTER_ADDR/MASTER_PORT are unset.
MPI_LAUNCHERS = ("openmpi", "hydra", "pmix")

# Set by _import_torch, so that importing this module needs no torch.
torch = None
dist = None
_OPS: dict = {}                 # np.ufunc -> torch.distributed.ReduceOp
_all_gather_flat = None         # (output, input): gather into one flat tensor
_reduce_scatter_flat = None     # (output, input, op=): reduce-scatter from one flat tensor


def _import_torch(backend: str = "gloo"):
    """Import torch and torch.distributed once, or raise BackendUnavailable with the fix;
    then check that this torch has ``backend`` (``"gloo"`` or ``"nccl"``)."""
    global torch, dist, _all_gather_flat, _reduce_scatter_flat
    if dist is None:
        try:
            # torch is optional: imported only when a torch.distributed backend is created
            import torch as _torch
            import torch.distributed as _dist  # torch is optional (as above)
        except ImportError:
            raise BackendUnavailable(f"backend {backend} needs PyTorch",
                                     "pip install 'ddlcomm[torch]' (torch==2.13.0 here)") from None
        if not _dist.is_available():
            raise BackendUnavailable(f"backend {backend}: this PyTorch ({_torch.__version__}) "
                                     "was built without torch.distributed",
                                     "pip install 'ddlcomm[torch]' (torch==2.13.0 here)")
        _OPS.update({np.add: _dist.ReduceOp.SUM, np.multiply: _dist.ReduceOp.PRODUCT,
                     np.minimum: _dist.ReduceOp.MIN, np.maximum: _dist.ReduceOp.MAX})
        # torch 2.13 renamed the flat forms *_single; older torch has *_tensor only.
        _all_gather_flat = (getattr(_dist, "all_gather_single", None)
                            or _dist.all_gather_into_tensor)
        _reduce_scatter_flat = (getattr(_dist, "reduce_scatter_single", None)
                                or _dist.reduce_scatter_tensor)
        torch, dist = _torch, _dist
    if not getattr(dist, f"is_{backend}_available")():
        raise BackendUnavailable(f"backend {backend}: this PyTorch ({torch.__version__}) "
                                 f"was built without {backend.upper()}",
                                 "install a PyTorch build that has it (NCCL: a CUDA build)")
    return torch, dist


def _tensor(array):
    """A flat tensor viewing ``array``'s memory (no copy); a tensor is handed over as it is."""
    if array.__class__ is not np.ndarray:
        return array.view(-1)
    if array.ndim != 1:
        array = array.reshape(-1)
    # bfloat16, ml_dtypes' (the one kind "V" dtype a buffer passes check_buffer with): torch
    # reads it through int16.  Not by name: ``dtype.name`` builds a string on each call (3.5 us,
    # a Gloo message's whole Python cost)
    if array.dtype.kind == "V":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if array.flags.writeable:
        return torch.from_numpy(array)
    # Read-only arrays (pickled objects' bytes) are only ever sent: silence
    # torch's warning that it cannot mark the tensor read-only.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


# ------------------------------------------------------------------ rendezvous
def init_process_group(info: LaunchInfo, timeout_s: float = DEFAULT_TIMEOUT_S,
                       backend: str = "gloo", **options) -> str:
    """Join this rank to the default process group of ``backend``; return how the ranks met.

    ``options`` go to ``torch.distributed.init_process_group`` (NCCL's ``device_id``).

    (a) ``MASTER_ADDR`` and ``MASTER_PORT`` set (torchrun, ddlcomm's own
    spawner): ``env://`` with rank and size from ``info``.  (b) Ranks that
    are the tasks of an srun step (Slurm's rank and size are theirs, whatever
    PMI srun also offers): ``tcp://`` to the step's first node, on the port
    :func:`~ddlcomm.launch.env.slurm_rendezvous` derives from the job's ids.
    (c) Started by an MPI launcher with mpi4py importable: rank 0 opens a TCP
    store on a port the OS picks (127.0.0.1 when every rank is on its host,
    else its host's address) and sends ``tcp://ADDR:PORT`` to the others by
    MPI broadcast.  (d) Otherwise :class:`BackendUnavailable`.
    """
    _import_torch(backend)
    join = functools.partial(dist.init_process_group, backend, rank=info.rank,
                             world_size=info.size,
                             timeout=datetime.timedelta(seconds=timeout_s), **options)
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        join(store=_env_store(info, datetime.timedelta(seconds=timeout_s)))
        return f"env://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    slurm = slurm_rendezvous() if _srun_tasks(info) else None
    if slurm is not None:
        url = f"tcp://{slurm[0]}:{slurm[1]}"
        join(init_method=url)
        return url
    if info.launcher in MPI_LAUNCHERS and _has_mpi4py():
        store, url = _store_through_mpi(info, datetime.timedelta(seconds=timeout_s))
        join(store=store)
        return url
    raise BackendUnavailable(
        f"backend {backend} cannot find its peers (started by {info.launcher}, "
        "no MASTER_ADDR/MASTER_PORT)",
        "set MASTER_ADDR and MASTER_PORT, or start the ranks under torchrun or mpirun "
        "(with mpi4py installed)")


#: How many times this process joined through ``env://`` (every rank counts alike).
_JOINS = {"env": 0}
#: ``env://``'s store of this process per (address, port, ranks, rank, agent's): opened at the
#: first join and kept for the next ones.
_ENV_STORES: dict[tuple, Any] = {}


def _env_store(info: LaunchInfo, timeout: datetime.timedelta):
    """``env://``'s store, as torch opens it (rank 0 hosts it, or torchrun's agent does),
    under a prefix of its own for each join in this process: a second ``ddlcomm.init``
    after ``close`` met the first one's keys and hung (torch's own ``env://`` fails so).
    The store itself is opened once and kept: rank 0 opening a new one on the port while
    the last one still listened let a fast rank join the old one, and both waited for
    ever (2 of 40 runs of 20 joins)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    key = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.size, info.rank, agent)
    store = _ENV_STORES.get(key)
    if store is None:
        store = _ENV_STORES[key] = dist.TCPStore(key[0], key[1], info.size, info.rank == 0 and not agent,
                                                 timeout=timeout)
    else:
        store.set_timeout(timeout)
    _JOINS["env"] += 1
    return dist.PrefixStore(f"ddlcomm/{_JOINS['env']}", store)


def _srun_tasks(info: LaunchInfo) -> bool:
    """Whether the ranks are an srun step's tasks, not mpirun's inside an allocation.

    Open MPI's mpirun starts its daemons with srun, so its ranks inherit a step's
    variables that number daemons, not ranks: its ranks meet through MPI.
    """
    env = os.environ
    return (info.launcher != "openmpi" and "SLURM_STEP_ID" in env
            and env.get("SLURM_PROCID") == str(info.rank)
            and env.get("SLURM_NTASKS") == str(info.size))


def _has_mpi4py() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def _store_through_mpi(info: LaunchInfo, timeout: datetime.timedelta):
    """Rank 0 opens a TCPStore on a free port; its address reaches the others by MPI."""
    comm = _import_mpi().COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    store, url = None, None
    if comm.Get_rank() == 0:
        try:
            addr = "127.0.0.1" if len(set(hosts)) == 1 else _host_address()
            # Port 0: the OS picks a free one while the store holds it (no race).
            store = dist.TCPStore(addr, 0, info.size, True, timeout=timeout,
                                  wait_for_workers=False)
            url = f"tcp://{addr}:{store.port}"
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, not hang
            url = f"error: {type(exc).__name__}: {exc}"
    url = comm.bcast(url, root=0)
    if url.startswith("error: "):
        raise BackendUnavailable(f"torch.distributed: rank 0 could not open its rendezvous store "
                                 f"({url[7:]})",
                                 "set MASTER_ADDR (an address of rank 0's host the others "
                                 "can reach) and MASTER_PORT")
    if store is None:
        addr, _, port = url[len("tcp://"):].rpartition(":")
        store = dist.TCPStore(addr, int(port), info.size, False, timeout=timeout)
    return store, url


def _host_address() -> str:
    """An address of this host that other hosts can reach (not loopback)."""
    name = socket.gethostname()
    for *_, sockaddr in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM):
        if not sockaddr[0].startswith("127."):
            return sockaddr[0]
    raise OSError(f"host name {name!r} resolves only to loopback addresses")


# ------------------------------------------------------------------ communicator
# ---------------------------------------------------------------- bound calls
# Each collective's torch.distributed call on tensors ``s`` (send) and ``r`` (receive,
# None where this rank receives nothing), torch op ``rop``, ``root``, ``p`` ranks.
def _bind_broadcast(s, r, rop, root: int, p: int) -> Callable[[], object]:
    return functools.partial(dist.broadcast, s, root)


def _reduce_into(fn: Callable, s, r) -> Callable[[], object]:
    """``fn`` reduces in place: in place when ``r is s``, else on a copy of ``s``."""
    if r is s:
        return functools.partial(fn, s)
    target = r if r is not None else s.clone()     # non-root reduce: scratch

    def copy_and_reduce() -> None:
        target.copy_(s)
        fn(target)
    return copy_and_reduce


def _bind_allreduce(s, r, rop, root: int, p: int) -> Callable[[], object]:
    return _reduce_into(functools.partial(dist.all_reduce, op=rop), s, r)


def _bind_reduce(s, r, rop, root: int, p: int) -> Callable[[], object]:
    return _reduce_into(functools.partial(dist.reduce, dst=root, op=rop), s, r)


def _bind_gather(s, r, rop, root: int, p: int) -> Callable[[], object]:
    views = list(r.view(p, s.numel()).unbind(0)) if r is not None else None
    return functools.partial(dist.gather, s, views, dst=root)


_BINDERS: dict[str, Callable[..., Callable[[], object]]] = {
    "broadcast": _bind_broadcast,
    "allreduce": _bind_allreduce,
    "reduce": _bind_reduce,
    "gather": _bind_gather,
    "allgather": lambda s, r, rop, root, p: functools.partial(_all_gather_flat, r, s),
    "alltoall": lambda s, r, rop, root, p: functools.partial(dist.all_to_all_single, r, s),
    "reduce_scatter": lambda s, r, rop, root, p: functools.partial(_reduce_scatter_flat, r, s,
                                                                   op=rop),
}


#: Whether the default process group is one ddlcomm made, and how many communicators use it:
#: a second communicator shares it, and closing the first no longer ends the second.
_OURS: dict = {"made": False, "users": 0}


def _destroy_ours() -> None:
    """At a clean exit, the group ddlcomm made and no close destroyed: left to the
    interpreter's teardown, torch's threads sometimes ended the process with SIGABRT
    ("terminate called without an active exception", 1 run in 5 under torchrun) after
    its work was done.  Not after an uncaught exception (``sys.last_value``): a peer may
    still wait in a call, and destroying the group then waits for it."""
    if _OURS["made"] and dist.is_initialized() and getattr(sys, "last_value", None) is None:
        _OURS["made"] = False
        dist.destroy_process_group()


atexit.register(_destroy_ours)      # (a no-op where ddlcomm made no group: torch stays unloaded)


def leave_at_exit() -> None:
    """Leave ddlcomm's group undestroyed at exit: one whose backend refused to start,
    where destroying it (since torch 2.6 a blocking finalize for NCCL) could wait for
    peers that are gone."""
    _OURS["made"] = False


#: What torch.distributed's backends say where a peer is gone (its connection closed: the
#: rank died or ended) or did not answer within the timeout, against what a library user
#: catches as one error on every backend (:class:`~ddlcomm.errors.RankFailure`).
_PEER_GONE = {"Connection closed by peer": "closed its connection (it died or ended)",
              "Connection reset by peer": "closed its connection (it died or ended)",
              "Broken pipe": "closed its connection (it died or ended)",
              "Timed out": "did not answer within the timeout",
              "timeout caused pair closure": "did not answer within an earlier call's timeout"}


def peer_failure(backend: str, exc: BaseException) -> Optional[RankFailure]:
    """``exc`` of a call on ``backend`` as the RankFailure it stands for where its first line
    says a peer is gone or silent (pure); None for any other error (raised as it is)."""
    line = first_line(exc)
    key = next((key for key in _PEER_GONE if key in line), None)
    if key is None:
        return None
    end = line.find(". ", line.index(key))          # torch's advice after it: not ours to give
    return RankFailure(f"backend {backend}: another rank {_PEER_GONE[key]}: "
                       f"{line if end < 0 else line[:end]}", "that rank's own output says why")


def _raise_if_peer_failure(backend: str, exc: RuntimeError) -> None:
    """Raise :func:`peer_failure`'s RankFailure for ``exc`` where it is one (from ``exc``)."""
    failure = peer_failure(backend, exc)
    if failure is not None:
        raise failure from exc


def _peers_checked(call: Callable) -> Callable:
    """``call`` (a communicator's primitive) raising :func:`peer_failure`'s RankFailure in
    place of the backend's error about a lost peer."""
    @functools.wraps(call)
    def checked(self, *args):
        try:
            return call(self, *args)
        except RuntimeError as exc:
            _raise_if_peer_failure(self.name, exc)
            raise
    return checked


class _CheckedWork:
    """A torch.distributed Work whose ``wait()`` raises :func:`peer_failure`'s RankFailure
    in place of the backend's error about a lost peer."""

    def __init__(self, work, backend: str) -> None:
        self._work, self._backend = work, backend

    def wait(self) -> object:
        try:
            return self._work.wait()
        except RuntimeError as exc:
            _raise_if_peer_failure(self._backend, exc)
            raise

    def is_completed(self) -> bool:
        return self._work.is_completed()


class TorchDistCommunicator(Communicator):
    """Communicator over torch.distributed's default process group; a subclass names the
    torch.distributed backend (``backend``) and may choose a device before the ranks meet."""

    name = "?"
    #: torch.distributed's name of the backend
    backend = "?"
    dtypes = tuple(n for n in ("float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8")
                   if n in DTYPES)
    unsupported: dict[str, str] = {}

    def __init__(self, local_rank: Optional[int] = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Join (or reuse) the default process group.

        ``timeout_s`` bounds the start-up and each collective (the backend's timeout).
        """
        _import_torch(self.backend)
        info = detect()
        #: how the ranks met (a URL), or None when the caller's process group was reused
        self.rendezvous: Optional[str] = None
        if local_rank is None:
            local_rank = info.local_rank if info is not None and info.local_rank is not None else 0
        self.local_rank = local_rank
        #: ``sync()``'s work: None until a CUDA tensor is bound (host backends: never)
        self._stream_sync: Optional[Callable[[], None]] = None
        if dist.is_initialized():
            backend = dist.get_backend()
            if backend != self.backend:
                raise BackendUnavailable(f"torch.distributed is already running backend {backend}",
                                         "destroy that process group first, or keep using it")
        elif info is None:
            raise BackendUnavailable(
                f"backend {self.name} needs a launcher to start its ranks (torchrun, mpirun, srun)",
                f"or let ddlcomm start them: ddlcomm bench --backend {self.name} --ranks N")
        else:
            options = self._before_init(info)
            self.rendezvous = init_process_group(info, timeout_s, self.backend, **options)
            _OURS["made"] = True
        #: whether the group is ddlcomm's (made by this communicator or another), counted
        self._ours = _OURS["made"]
        _OURS["users"] += self._ours
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def _before_init(self, info: LaunchInfo) -> dict:
        """Set up what the backend needs before the ranks meet; the options for
        ``init_process_group``."""
        return {}

    # ------------------------------------------------------------ identity
    @property
    def library_version(self) -> str:
        return f"torch {torch.__version__}"

    def abort(self, code: int = 1) -> None:
        """Exit this rank at once; the launcher (torchrun, mpirun, ddlcomm) ends the others."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    def close(self) -> None:
        # A process group the caller set up before us is theirs to destroy; ours goes with
        # the last communicator that uses it (torch has one default group per process).
        if self._ours:                  # (once: a closed communicator's close does nothing)
            _OURS["users"] -= 1
            if _OURS["users"] == 0:
                _OURS["made"] = False
                if dist.is_initialized():
                    dist.destroy_process_group()

    def sync(self) -> None:
        """Wait for the current CUDA stream once a device tensor was bound (OSU ``-d cuda``)."""
        if self._stream_sync is not None:
            self._stream_sync()

    def _bind(self, coll, sendbuf, recvbuf, op, root):
        """Tensors, views, op and scratch built once: a bound call is one torch call (+ copy)."""
        bind = _BINDERS.get(coll.name)
        if bind is None:
            return super()._bind(coll, sendbuf, recvbuf, op, root)
        s = _tensor(sendbuf)
        r = _tensor(recvbuf) if recvbuf is not None else None
        if s.is_cuda and self._stream_sync is None:
            self._stream_sync = torch.cuda.current_stream(s.device).synchronize
        return bind(s, r, _OPS[op.ufunc] if op is not None else None, root, self.size)

    # ------------------------------------------------------------ primitives
    def _barrier(self) -> None:
        dist.barrier()

    def _p2p_tensor(self, buf):
        """``buf`` as the tensor a point-to-point call hands over (:func:`_tensor`); a
        backend refuses here the buffers its point-to-point cannot take."""
        return _tensor(buf)

    def _send(self, buf, dest, tag):
        dist.send(self._p2p_tensor(buf), dest, tag=tag)

    def _recv(self, buf, source, tag):
        dist.recv(self._p2p_tensor(buf), source, tag=tag)

    def _sendrecv(self, sendbuf, dest, recvbuf, source, tag):
        s, r = self._p2p_tensor(sendbuf), self._p2p_tensor(recvbuf)
        if dest == source == self.rank:       # no pair to itself: a local copy
            if s.numel() != r.numel():
                raise UsageError(f"sendrecv with itself: {s.numel()} elements sent, "
                                 f"{r.numel()} expected")
            r.copy_(s)
            return
        # One batch: NCCL runs it as one group (a receive and a send to the same peer, posted
        # apart, would queue on one stream and deadlock); Gloo posts both before any wait.
        ops = [dist.P2POp(dist.irecv, r, source, tag=tag), dist.P2POp(dist.isend, s, dest, tag=tag)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def _isend(self, buf, dest, tag):
        t = self._p2p_tensor(buf)
        self._not_self(dest)
        # The returned Work holds the tensor (a view of buf) until it completes.
        return _CheckedWork(dist.isend(t, dest, tag=tag), self.name)

    def _irecv(self, buf, source, tag):
        t = self._p2p_tensor(buf)
        self._not_self(source)
        return _CheckedWork(dist.irecv(t, source, tag=tag), self.name)

    def _not_self(self, peer: int) -> None:
        if peer == self.rank:
            raise UnsupportedError(f"backend {self.name} cannot send a message from rank {peer} "
                                   "to itself",
                                   "copy the buffer locally, or use sendrecv (which does)")

    def _recv_any(self, buf, tag):
        # Gloo's any-source receive sleeps on a condition variable: no core spins.
        return dist.recv(self._p2p_tensor(buf), None, tag=tag)

    def _broadcast(self, buf, root):
        dist.broadcast(_tensor(buf), root)

    def _gather(self, sendbuf, recvbuf, root):
        s = _tensor(sendbuf)
        views = None
        if recvbuf is not None:
            views = list(_tensor(recvbuf).view(self.size, s.numel()).unbind(0))
        dist.gather(s, views, dst=root)

    def _allgather(self, sendbuf, recvbuf):
        _all_gather_flat(_tensor(recvbuf), _tensor(sendbuf))

    def _reduce(self, sendbuf, recvbuf, op, root):
        s = _tensor(sendbuf)
        if recvbuf is None:
            buf = s.clone()                   # the backend writes partial sums into non-roots'
        else:
            buf = _tensor(recvbuf)
            if recvbuf is not sendbuf:
                buf.copy_(s)                  # torch.distributed reduces in place
        dist.reduce(buf, dst=root, op=_OPS[op.ufunc])

    def _in_place(self, sendbuf, recvbuf):
        """recvbuf's tensor holding sendbuf's data (torch.distributed reduces in place)."""
        r = _tensor(recvbuf)
        if recvbuf is not sendbuf:
            r.copy_(_tensor(sendbuf))
        return r

    def _allreduce(self, sendbuf, recvbuf, op):
        dist.all_reduce(self._in_place(sendbuf, recvbuf), op=_OPS[op.ufunc])

    def _iallreduce(self, sendbuf, recvbuf, op):
        # Run by the backend's own threads or stream; the Work holds the tensor until done.
        work = dist.all_reduce(self._in_place(sendbuf, recvbuf), op=_OPS[op.ufunc], async_op=True)
        return _CheckedWork(work, self.name).wait, work.is_completed

    def _reduce_scatter(self, sendbuf, recvbuf, op):
        _reduce_scatter_flat(_tensor(recvbuf), _tensor(sendbuf), op=_OPS[op.ufunc])

    def _alltoall(self, sendbuf, recvbuf):
        dist.all_to_all_single(_tensor(recvbuf), _tensor(sendbuf))


# The calls a library user makes (bound calls, the benchmarks' timed path, are left as
# they are: there a rank's failure is reported by the run, fail_message).
for _name in ("_barrier", "_send", "_recv", "_sendrecv", "_recv_any", "_broadcast", "_gather",
              "_allgather", "_reduce", "_allreduce", "_reduce_scatter", "_alltoall"):
    setattr(TorchDistCommunicator, _name, _peers_checked(getattr(TorchDistCommunicator, _name)))


class GlooCommunicator(TorchDistCommunicator):
    """torch.distributed with Gloo: host arrays, and CUDA tensors (``--memory device``) in
    collectives, which Gloo copies through pinned host memory itself.

    Gloo's point-to-point does not: ``ProcessGroupGloo::send``/``recv`` hand the tensor's
    data pointer to the TCP transport as host memory, with no device check and no staging
    (torch's backend table: Gloo send/recv on GPU ✘), so a CUDA tensor there is refused."""

    name = "gloo"
    backend = "gloo"
    memories = ("host", "device")

    @property
    def library(self) -> str:
        return "Gloo"

    def _p2p_tensor(self, buf):
        """Refuses a CUDA tensor, which Gloo's point-to-point would read as host memory."""
        if buf.__class__ is not np.ndarray and getattr(buf, "is_cuda", False):
            raise UnsupportedError("backend gloo's point-to-point calls take host memory only: Gloo "
                                   "would read the CUDA tensor's device pointer as host memory",
                                   "copy the tensor to the host first, or use --backend nccl")
        return super()._p2p_tensor(buf)
