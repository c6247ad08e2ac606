"""Gradient aggregation through any ddlcomm Communicator: all-reduce or parameter server.

Parameters and gradients live in flat float32 tensors on the training device,
one pair per fusion bucket: each torch parameter's ``.data`` and ``.grad``
are views of a slice of them (as DistributedDataParallel's
``gradient_as_bucket_view``), so autograd accumulates straight into the
bucket a collective sends and a broadcast lands straight in the parameters.
The backend is handed each bucket through a wire (:mod:`.wire`): a NumPy
view of a CPU bucket (nothing copied), a CUDA bucket as it is (nccl, gloo),
or a host copy made around each call (a host-only backend on a GPU run).

Buckets follow the order gradients become ready in backward (found on an
untimed pass and agreed by every rank), fused up to ``--fusion`` bytes.

``allreduce``: every worker averages each bucket with all others, then steps
its own optimizer.  With overlap, a gradient hook (on the main thread for
CPU backward, which autograd runs on the calling thread; on autograd's device
thread for GPU backward, where it starts calls only on a backend that may be
called from any thread) starts a
bucket's non-blocking all-reduce (:meth:`Communicator.iallreduce`) as soon as
its last gradient is ready, buckets always started in the same order on every
rank, and polls the ones in flight (MPI progresses inside calls), while
backward goes on; what is left is waited for after backward, in the
backend's own wait or (``--wait sleep``) by testing between short sleeps.

``ps``: rank 0 is the server (as in the ps workloads).  Workers gather each
bucket of gradients to it; it averages the workers' gradients, steps the one
optimizer and broadcasts the parameters back into every worker's buffers.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import numpy as np

from ..comm import algorithms
from ..comm.device import one_gpu
from ..comm.nodes import same_node
from ..dtypes import get_op
from ..errors import UsageError
from ..measure.timing import clock
from .device import HOST, Placed
from .phases import buckets as make_buckets
from .wire import ViewWire, iallreduce, wired

ARCHS = ("allreduce", "ps")
#: How a rank waits for all-reduces in flight: "spin", the backend's own wait (MPI's polls
#: a core), or "sleep": test() between sleeps of 50 µs growing to 1 ms, leaving the core to
#: the other ranks and jobs that share it.
WAITS = ("spin", "sleep")
SLEEP_MIN_S, SLEEP_MAX_S = 5e-5, 1e-3


def wait_all(requests: Sequence, how: str) -> None:
    """Wait until every request is complete, spinning in the backend or sleeping between tests."""
    if how == "spin":
        for req in requests:
            req.wait()
        return
    delay = SLEEP_MIN_S
    while not all(req.test() for req in requests):
        time.sleep(delay)
        delay = min(2 * delay, SLEEP_MAX_S)


class Buckets:
    """The model's parameters and gradients as views of flat per-bucket tensors on the
    parameters' device, each with the wire the backend is handed (:mod:`.wire`)."""

    def __init__(self, params: Sequence, order: Sequence[int], fusion_bytes: int,
                 wire: type = ViewWire) -> None:
        # torch is optional: ddlcomm.cli imports this module, only training needs torch
        import torch
        self.params = list(params)
        self.order = list(order)                          # parameter indices, ready order
        self.wire = wire
        sizes = [self.params[i].numel() * 4 for i in self.order]
        groups = make_buckets(sizes, fusion_bytes)
        self.members: list[list[int]] = [[self.order[j] for j in g] for g in groups]
        self.bucket_of: dict[int, int] = {}
        self.pbufs: list = []
        self.gbufs: list = []
        device = self.params[0].device if self.params else torch.device("cpu")
        for b, members in enumerate(self.members):
            n = sum(self.params[i].numel() for i in members)
            pbuf = torch.empty(n, dtype=torch.float32, device=device)
            gbuf = torch.zeros(n, dtype=torch.float32, device=device)
            off = 0
            for i in members:
                p = self.params[i]
                k = p.numel()
                with torch.no_grad():
                    pbuf[off:off + k].copy_(p.detach().reshape(-1))
                p.data = pbuf[off:off + k].view_as(p)
                p.grad = gbuf[off:off + k].view_as(p)
                self.bucket_of[i] = b
                off += k
            self.pbufs.append(pbuf)
            self.gbufs.append(gbuf)
        self.pwires = [wire(t) for t in self.pbufs]
        self.gwires = [wire(t) for t in self.gbufs]

    @property
    def nbytes(self) -> list[int]:
        return [g.numel() * g.element_size() for g in self.gbufs]

    def zero_grads(self) -> None:
        for g in self.gbufs:
            g.zero_()

    def flat_params(self) -> np.ndarray:
        """Every parameter, copied to one host array (the replica check compares it)."""
        if not self.pbufs:
            return np.zeros(0, np.float32)
        # torch is optional: imported only when training holds buckets
        import torch
        return torch.cat([p.detach().reshape(-1) for p in self.pbufs]).cpu().numpy()


def ready_order(model, loss_fn: Callable[[], object]) -> list[int]:
    """Indices of ``model``'s parameters in the order backward makes their gradients ready."""
    params = list(model.parameters())
    seen: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p, i=i: seen.append(i))
               for i, p in enumerate(params)]
    try:
        loss_fn().backward()
    finally:
        for h in handles:
            h.remove()
    missing = [i for i in range(len(params)) if i not in seen]
    for p in params:
        p.grad = None
    return seen + missing                              # parameters without gradients last


class AllreduceAggregator:
    """All-reduce (average) of every bucket, after backward or overlapped with it.

    ``place`` stamps the hooks' moments and waits for the device where a bucket's cost is
    timed alone.  ``any_thread``: whether the backend may be called from a thread other than
    the main one (autograd runs GPU backward, and so the hooks, on its device thread; MPI
    runs at THREAD_FUNNELED).  Hooks off the main thread are counted (``hooks_off_main``);
    where the backend may not be called from them they start nothing (``hooks_refused``) and
    the buckets are all-reduced after backward.
    """

    arch = "allreduce"

    def __init__(self, comm, bk: Buckets, overlap: bool, wait: str = "spin",
                 place: Placed = HOST, any_thread: bool = False, algorithm: str = "library") -> None:
        self.comm, self.bk, self.overlap, self.wait = comm, bk, overlap, wait
        self.place, self.any_thread, self.algorithm = place, any_thread, algorithm
        self.one_node = algorithm != "library" and same_node(comm)
        self.calls = [self._call(w) for w in bk.gwires]
        self._counts = [len(m) for m in bk.members]
        self.ready: list = []
        self.started = None          # the stamp of the first all-reduce started within backward
        self._pending: list[int] = []
        self._next = 0
        self._reqs: list = []
        self.hooks_off_main = 0
        self.hooks_refused = 0
        self._main = threading.get_ident()
        self._ident = threading.get_ident
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(i))
                         for i, p in enumerate(bk.params) if i in bk.bucket_of]

    def _call(self, wire) -> Callable[[], None]:
        """The blocking all-reduce (average) of one bucket in place: the backend's own
        (``library``, through the wire's copies), or ddlcomm's algorithm (``auto`` decided by
        the bucket's size) on the bucket where it lies: a CPU bucket's NumPy view, a GPU
        bucket itself (the device algorithms hand the backend host messages only, never a tensor)."""
        nbytes = wire.tensor.numel() * wire.tensor.element_size()
        on_host = wire.kind == "view"
        name, _ = algorithms.decide("allreduce", self.algorithm, nbytes, self.comm.size,
                                    one_node=self.one_node, library=self.comm.library,
                                    on_device=not on_host,
                                    one_device=not on_host and self.one_node and one_gpu(self.comm))
        if name == "library":
            return wired(self.comm.bind("allreduce", wire.buf, wire.buf, op="avg"), [wire], [wire])
        buf = wire.buf if on_host else wire.tensor
        return algorithms.bind(self.comm, "allreduce", name, buf, buf, get_op("avg"), 0)

    def _hook(self, index: int):
        bucket = self.bk.bucket_of[index]
        stamp = self.place.stamp

        def on_ready(_param) -> None:
            self.ready.append(stamp())
            if self._ident() != self._main:
                self.hooks_off_main += 1               # every hook on a GPU; never on a CPU
                if not self.any_thread:
                    self.hooks_refused += 1
                    return
            if self.overlap:
                self._pending[bucket] -= 1
                self._start_ready()
                # Progress what is in flight: MPI moves data only inside its calls. Not on a
                # GPU (NCCL, Gloo: their own streams and threads move it), where a finished
                # request's wait would hold this autograd thread on the whole CUDA stream.
                if not self.place.on_gpu:
                    for req in self._reqs:
                        if not req.test():
                            break
        return on_ready

    def _start_ready(self) -> None:
        # Start buckets strictly in bucket order, so every rank issues the same sequence.
        if self._next == 0 and self._pending and self._pending[0] == 0:
            self.started = self.place.stamp()
        while self._next < len(self._pending) and self._pending[self._next] == 0:
            self._reqs.append(iallreduce(self.comm, self.bk.gwires[self._next]))
            self._next += 1

    def begin(self) -> None:
        """Before backward."""
        self.ready.clear()
        self.started = None
        self._pending = list(self._counts)
        self._next, self._reqs = 0, []
        self.hooks_refused = 0

    def finish(self) -> None:
        """After backward: every bucket averaged on every rank."""
        if self.overlap and self.hooks_refused == 0:
            self._pending = [0] * len(self._pending)    # parameters without gradients count as ready
            started = self.started
            self._start_ready()
            self.started = started                      # None: nothing started within backward
            wait_all(self._reqs, self.wait)
        elif self.wait == "sleep":
            wait_all([iallreduce(self.comm, w) for w in self.bk.gwires], "sleep")
        else:
            for call in self.calls:
                call()

    def facts(self) -> dict:
        """The iteration record's fields on where the hooks ran (this rank's, every iteration
        so far: autograd runs CPU backward on the calling thread, so hooks that start MPI
        calls run on the main thread, as THREAD_FUNNELED needs; GPU backward runs them on its
        device thread) and whether they started the all-reduces within the last backward."""
        return {"hooks_on_main_thread": self.hooks_off_main == 0,
                "overlap_in_backward": bool(self.overlap and self.hooks_refused == 0)}

    def step(self, optimizer) -> None:
        """The local update, then the gradient buckets zeroed for the next backward pass."""
        optimizer.step()
        self.bk.zero_grads()

    def measure_alone(self, reps: int) -> tuple[list[tuple[int, float]], float]:
        """Each bucket's all-reduce alone on scratch copies: ((bytes, s) per bucket per rep, total s).

        Timed outside backward, a barrier before each, with the primitive the
        training used (blocking, or non-blocking then waited for) and its copies
        (staged wires), each ended by the device's sync, so the model of the run
        is fed the cost of exactly these buckets on exactly this job.
        """
        scratch = [w.scratch() for w in self.bk.gwires]
        if self.overlap or self.wait == "sleep":      # as training ran them: started, then waited for
            how, comm = self.wait, self.comm
            calls = [(lambda s=s: wait_all([iallreduce(comm, s)], how)) for s in scratch]
        else:
            calls = [self._call(s) for s in scratch]
        return _time_buckets(self.comm, [[c] for c in calls], self.bk.nbytes, reps,
                             self.place.sync)

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class PSAggregator:
    """Parameter server on rank 0: gather gradients, average and step there, broadcast parameters."""

    arch = "ps"
    started = None                  # nothing starts within backward

    def __init__(self, comm, bk: Buckets, optimizer_factory: Callable[[], object],
                 place: Placed = HOST) -> None:
        if comm.size < 2:
            raise UsageError("--arch ps needs a server and at least one worker",
                             "use --ranks 2 or more")
        self.comm, self.bk, self.place = comm, bk, place
        self.server = comm.rank == 0
        self.tables = self._tables(bk.gbufs)
        self.gathers = self._gathers(bk.gwires, self.tables)
        self.bcasts = [self._bcast(w) for w in bk.pwires]
        self.optimizer = optimizer_factory() if self.server else None
        self.ready: list = []
        self.t_apply = 0.0
        ready, stamp = self.ready, place.stamp
        self._handles = [p.register_post_accumulate_grad_hook(lambda _p: ready.append(stamp()))
                         for p in bk.params]

    def _tables(self, gbufs: list) -> list:
        """The server's gradient table per bucket (one row per rank), as wires; None elsewhere."""
        if not self.server:
            return [None] * len(gbufs)
        return [self.bk.wire(g.new_empty(g.numel() * self.comm.size)) for g in gbufs]

    def _gathers(self, gwires: list, tables: list) -> list:
        """Each bucket's gather to the server: a worker's gradient copied out before it (a
        staged wire), the server's table back after it; the server's own row is never read
        (:meth:`apply`), so its gradient is not copied out."""
        return [wired(self.comm.bind("gather", w.buf, t.buf if t is not None else None, root=0),
                      [] if self.server else [w], [t] if t is not None else [])
                for w, t in zip(gwires, tables)]

    def _bcast(self, w) -> Callable[[], None]:
        """A bucket's broadcast from the server: copied out there before it, back on the
        workers after it (each copy where a staged wire needs it, once)."""
        return wired(self.comm.bind("broadcast", w.buf, root=0),
                     [w] if self.server else [], [] if self.server else [w])

    def begin(self) -> None:
        self.ready.clear()

    @staticmethod
    def facts() -> dict:
        """Its hooks only stamp moments (on whichever thread autograd runs them): nothing
        starts within backward, and the thread they ran on does not matter."""
        return {"overlap_in_backward": False}

    def finish(self) -> None:
        """Gradients to the server, its update, parameters back (the server's apply time is kept)."""
        for call in self.gathers:
            call()
        if self.server:
            t0 = clock()
            self.apply()
            self.place.sync()
            self.t_apply = clock() - t0
        for call in self.bcasts:
            call()

    def apply(self) -> None:
        """The workers' mean gradient into the server's buckets, then its optimizer's step."""
        # torch is optional: imported only when a server trains
        import torch
        p, scale = self.comm.size, 1.0 / (self.comm.size - 1)
        for g, t in zip(self.bk.gbufs, self.tables):
            torch.sum(t.tensor.view(p, g.numel())[1:], dim=0, out=g)
            g.mul_(scale)
        self.optimizer.step()

    def step(self, optimizer) -> None:
        """Nothing to update (the server did, in :meth:`apply`, its time ``t_apply``): the
        gradient buckets zeroed for the next backward pass."""
        self.bk.zero_grads()

    def measure_alone(self, reps: int) -> tuple[list[tuple[int, float]], float]:
        """Each bucket's gather + broadcast alone (no update between), on scratch buffers."""
        sg = [w.scratch() for w in self.bk.gwires]
        sp = [w.scratch() for w in self.bk.pwires]
        gathers = self._gathers(sg, self._tables([w.tensor for w in sg]))
        calls = [[g, self._bcast(x)] for g, x in zip(gathers, sp)]
        return _time_buckets(self.comm, calls, self.bk.nbytes, reps, self.place.sync)

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def _time_buckets(comm, calls: list[list[Callable[[], None]]], nbytes: list[int],
                  reps: int, sync: Callable[[], None]) -> tuple[list[tuple[int, float]], float]:
    table: list[tuple[int, float]] = []
    totals = np.zeros(reps)
    for call_list in calls:                       # one untimed round
        comm.barrier()
        for c in call_list:
            c()
        sync()
    for r in range(reps):
        for b, call_list in enumerate(calls):
            comm.barrier()
            t0 = clock()
            for c in call_list:
                c()
            sync()
            dt = clock() - t0
            table.append((nbytes[b], dt))
            totals[r] += dt
    return table, float(np.median(totals)) if reps else 0.0


def make_aggregator(arch: str, comm, bk: Buckets, overlap: bool,
                    optimizer_factory: Callable[[], object], wait: str = "spin",
                    place: Placed = HOST, any_thread: bool = False, algorithm: str = "library"):
    if wait not in WAITS:
        raise UsageError(f"unknown --wait {wait!r}", f"choose from {', '.join(WAITS)}")
    if arch == "allreduce":
        return AllreduceAggregator(comm, bk, overlap, wait, place, any_thread, algorithm)
    if arch == "ps":
        if overlap or wait != "spin":
            raise UsageError("--overlap and --wait sleep apply to --arch allreduce")
        return PSAggregator(comm, bk, optimizer_factory, place)
    raise UsageError(f"unknown --arch {arch!r}", f"choose from {', '.join(ARCHS)}")
