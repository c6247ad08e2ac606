"""Gradient aggregation through any ddlcomm Communicator: all-reduce or parameter server.

Parameters and gradients live in flat float32 buffers, one pair per fusion
bucket: each torch parameter's ``.data`` and ``.grad`` are views of a slice
of them (as DistributedDataParallel's ``gradient_as_bucket_view``), so
autograd accumulates straight into the bucket a collective sends and a
broadcast lands straight in the parameters; nothing is copied.

Buckets follow the order gradients become ready in backward (found on an
untimed pass and agreed by every rank), fused up to ``--fusion`` bytes.

``allreduce``: every worker averages each bucket with all others, then steps
its own optimizer.  With overlap, a gradient hook (it runs on the main
thread: autograd runs CPU backward on the thread that called it) starts a
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

from ..errors import UsageError
from ..measure.timing import clock
from .phases import buckets as make_buckets

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
    """The model's parameters and gradients as views of flat per-bucket buffers."""

    def __init__(self, params: Sequence, order: Sequence[int], fusion_bytes: int) -> None:
        # torch is optional: ddlcomm.cli imports this module, only training needs torch
        import torch
        self.params = list(params)
        self.order = list(order)                          # parameter indices, ready order
        sizes = [self.params[i].numel() * 4 for i in self.order]
        groups = make_buckets(sizes, fusion_bytes)
        self.members: list[list[int]] = [[self.order[j] for j in g] for g in groups]
        self.bucket_of: dict[int, int] = {}
        self.pbufs: list[np.ndarray] = []
        self.gbufs: list[np.ndarray] = []
        for b, members in enumerate(self.members):
            n = sum(self.params[i].numel() for i in members)
            pbuf, gbuf = np.empty(n, np.float32), np.zeros(n, np.float32)
            off = 0
            for i in members:
                p = self.params[i]
                k = p.numel()
                with torch.no_grad():
                    pbuf[off:off + k] = p.detach().reshape(-1).numpy()
                p.data = torch.from_numpy(pbuf[off:off + k]).view_as(p)
                p.grad = torch.from_numpy(gbuf[off:off + k]).view_as(p)
                self.bucket_of[i] = b
                off += k
            self.pbufs.append(pbuf)
            self.gbufs.append(gbuf)

    @property
    def nbytes(self) -> list[int]:
        return [g.nbytes for g in self.gbufs]

    def zero_grads(self) -> None:
        for g in self.gbufs:
            g.fill(0)

    def flat_params(self) -> np.ndarray:
        return np.concatenate(self.pbufs) if self.pbufs else np.zeros(0, np.float32)


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
    """All-reduce (average) of every bucket, after backward or overlapped with it."""

    arch = "allreduce"

    def __init__(self, comm, bk: Buckets, overlap: bool, wait: str = "spin") -> None:
        self.comm, self.bk, self.overlap, self.wait = comm, bk, overlap, wait
        self.calls = [comm.bind("allreduce", g, g, op="avg") for g in bk.gbufs]
        self._counts = [len(m) for m in bk.members]
        self.ready: list[float] = []
        self._pending: list[int] = []
        self._next = 0
        self._reqs: list = []
        self.hooks_off_main = 0
        self._main = threading.get_ident()
        self._ident = threading.get_ident
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(i))
                         for i, p in enumerate(bk.params) if i in bk.bucket_of]

    def _hook(self, index: int):
        bucket = self.bk.bucket_of[index]

        def on_ready(_param) -> None:
            self.ready.append(clock())
            if self._ident() != self._main:
                self.hooks_off_main += 1               # never seen on CPU; counted, not trusted
                return
            if self.overlap:
                self._pending[bucket] -= 1
                self._start_ready()
                for req in self._reqs:                 # progress what is in flight
                    if not req.test():
                        break
        return on_ready

    def _start_ready(self) -> None:
        # Start buckets strictly in bucket order, so every rank issues the same sequence.
        while self._next < len(self._pending) and self._pending[self._next] == 0:
            g = self.bk.gbufs[self._next]
            self._reqs.append(self.comm.iallreduce(g, g, op="avg"))
            self._next += 1

    def begin(self) -> None:
        """Before backward."""
        self.ready.clear()
        self._pending = list(self._counts)
        self._next, self._reqs = 0, []

    def finish(self) -> None:
        """After backward: every bucket averaged on every rank."""
        if self.overlap and self.hooks_off_main == 0:
            self._pending = [0] * len(self._pending)    # parameters without gradients count as ready
            self._start_ready()
            wait_all(self._reqs, self.wait)
        elif self.wait == "sleep":
            wait_all([self.comm.iallreduce(g, g, op="avg") for g in self.bk.gbufs], "sleep")
        else:
            for call in self.calls:
                call()

    def step(self, optimizer) -> float:
        """Local update; returns 0 (no server)."""
        optimizer.step()
        self.bk.zero_grads()
        return 0.0

    def measure_alone(self, reps: int) -> tuple[list[tuple[int, float]], float]:
        """Each bucket's all-reduce alone on scratch copies: ((bytes, s) per bucket per rep, total s).

        Timed outside backward, a barrier before each, with the primitive the
        training used (blocking, or non-blocking then waited for), so the model
        of the run is fed the cost of exactly these buckets on exactly this job.
        """
        scratch = [g.copy() for g in self.bk.gbufs]
        if self.overlap or self.wait == "sleep":      # as training ran them: started, then waited for
            iallreduce, how = self.comm.iallreduce, self.wait
            calls = [(lambda s=s: wait_all([iallreduce(s, s, op="avg")], how)) for s in scratch]
        else:
            calls = [self.comm.bind("allreduce", s, s, op="avg") for s in scratch]
        return _time_buckets(self.comm, [[c] for c in calls], [s.nbytes for s in scratch], reps)

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class PSAggregator:
    """Parameter server on rank 0: gather gradients, average and step there, broadcast parameters."""

    arch = "ps"

    def __init__(self, comm, bk: Buckets, optimizer_factory: Callable[[], object]) -> None:
        if comm.size < 2:
            raise UsageError("--arch ps needs a server and at least one worker",
                             "use --ranks 2 or more")
        self.comm, self.bk = comm, bk
        self.server = comm.rank == 0
        p = comm.size
        self.tables = [np.empty(g.size * p, np.float32) if self.server else None for g in bk.gbufs]
        self.gathers = [comm.bind("gather", g, t, root=0) for g, t in zip(bk.gbufs, self.tables)]
        self.bcasts = [comm.bind("broadcast", x, root=0) for x in bk.pbufs]
        self.optimizer = optimizer_factory() if self.server else None
        self.ready: list[float] = []
        self.hooks_off_main = 0
        self.t_apply = 0.0
        ready, clock_ = self.ready, clock
        self._handles = [p.register_post_accumulate_grad_hook(lambda _p: ready.append(clock_()))
                         for p in bk.params]

    def begin(self) -> None:
        self.ready.clear()

    def finish(self) -> None:
        """Gradients to the server, its update, parameters back (the server's apply time is kept)."""
        for call in self.gathers:
            call()
        if self.server:
            t0 = clock()
            self.apply()
            self.t_apply = clock() - t0
        for call in self.bcasts:
            call()

    def apply(self) -> None:
        p, scale = self.comm.size, np.float32(1.0 / (self.comm.size - 1))
        for g, t in zip(self.bk.gbufs, self.tables):
            np.sum(t.reshape(p, g.size)[1:], axis=0, out=g)
            np.multiply(g, scale, out=g)
        self.optimizer.step()

    def step(self, optimizer) -> float:
        """Workers have nothing to update: the server did (its time returned on the server)."""
        self.bk.zero_grads()
        return self.t_apply if self.server else 0.0

    def measure_alone(self, reps: int) -> tuple[list[tuple[int, float]], float]:
        """Each bucket's gather + broadcast alone (no update between), on scratch buffers."""
        sg = [g.copy() for g in self.bk.gbufs]
        sp = [x.copy() for x in self.bk.pbufs]
        tables = [np.empty(g.size * self.comm.size, np.float32) if self.server else None for g in sg]
        calls = [[self.comm.bind("gather", g, t, root=0), self.comm.bind("broadcast", x, root=0)]
                 for g, t, x in zip(sg, tables, sp)]
        return _time_buckets(self.comm, calls, [g.nbytes for g in sg], reps)

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def _time_buckets(comm, calls: list[list[Callable[[], None]]], nbytes: list[int],
                  reps: int) -> tuple[list[tuple[int, float]], float]:
    table: list[tuple[int, float]] = []
    totals = np.zeros(reps)
    for call_list in calls:                       # one untimed round
        comm.barrier()
        for c in call_list:
            c()
    for r in range(reps):
        for b, call_list in enumerate(calls):
            comm.barrier()
            t0 = clock()
            for c in call_list:
                c()
            dt = clock() - t0
            table.append((nbytes[b], dt))
            totals[r] += dt
    return table, float(np.median(totals)) if reps else 0.0


def make_aggregator(arch: str, comm, bk: Buckets, overlap: bool,
                    optimizer_factory: Callable[[], object], wait: str = "spin"):
    if wait not in WAITS:
        raise UsageError(f"unknown --wait {wait!r}", f"choose from {', '.join(WAITS)}")
    if arch == "allreduce":
        return AllreduceAggregator(comm, bk, overlap, wait)
    if arch == "ps":
        if overlap or wait != "spin":
            raise UsageError("--overlap and --wait sleep apply to --arch allreduce")
        return PSAggregator(comm, bk, optimizer_factory)
    raise UsageError(f"unknown --arch {arch!r}", f"choose from {', '.join(ARCHS)}")
