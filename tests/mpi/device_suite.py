"""Rank-side suite for ddlcomm's own collectives on device buffers (ddlcomm.comm.device).

Run under a launcher (``mpirun -n N python device_suite.py [--backend NAME] [--device
cpu|cuda]``); passes at any N.  Every (collective, algorithm) that runs on device
buffers -- allreduce ring, rhd and shm, broadcast and reduce binomial -- over each
transport (``staged``, ``ipc``) × dtypes float32, float16, bfloat16, int32 × every op
× counts 0, 1, 7, 13 and a large one, in place and not, with the buffer-kind cache on
and off, against NumPy; and the facts a bound call reports (kernel, transport, kind
look-ups made once per buffer with the cache).

``--device cpu`` (the default) runs on CPU tensors standing in for GPU memory: the
``ipc`` transport and the shm all-reduce then map peers' buffers from /dev/shm files
(the posix-shm mapper) and torch's CPU kernels reduce.  That tests the algorithms'
plumbing -- the message protocol, blocks, in-place, the finish -- over a real MPI or
Gloo, NOT a GPU.  ``--device cuda`` runs the same cases on CUDA tensors (CUDA IPC,
pinned staging, GPU kernels): tests/mpi/test_gpu_device.py on a GPU machine.

Exit 0 when every case passed on every rank; rank 0 prints
``<library> <version>: N ranks, F failures, C cases``.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

import ml_dtypes
import numpy as np
import torch

import ddlcomm
from ddlcomm.comm import device as dev
from ddlcomm.comm.device import allreduce_shm
from ddlcomm.comm.device.peers import shared_tensor
from ddlcomm.dtypes import get_op
from ddlcomm.errors import UnsupportedError, UsageError
from ddlcomm.memory.gpu import use_gpu
from suite_kit import THIN_HELP, Checks, conclude, data, guarded, reference, thinned

DTYPES = ("float32", "float16", "bfloat16", "int32")
OPS = ("sum", "prod", "min", "max", "avg")
COUNTS = (0, 1, 7, 13)
BIG = 100_003
#: (collective, algorithm, transports it runs over)
VARIANTS = [("allreduce", "ring", ("staged", "ipc")), ("allreduce", "rhd", ("staged", "ipc")),
            ("allreduce", "shm", ("ipc",)), ("broadcast", "binomial", ("staged", "ipc")),
            ("reduce", "binomial", ("staged", "ipc"))]
#: The device shm all-reduce's own threshold, restored after its slices pass.
WHOLE_MAX_BYTES = allreduce_shm.WHOLE_MAX_BYTES
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "int32": np.int32}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "int32": torch.int32}


def to_host(t) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class Suite(Checks):
    def __init__(self, comm, device: str) -> None:
        super().__init__(comm)
        self.device = device
        self.reads: Optional[str] = None       # the shm all-reduce's way, where asked

    def tensor(self, host: np.ndarray, dtype: str, mappable: bool):
        """A tensor holding ``host``: CUDA memory, or a CPU tensor (in /dev/shm when peers map it)."""
        nbytes = host.size * np.dtype(NP[dtype]).itemsize
        if self.device == "cuda":
            t = torch.empty(host.size, dtype=TORCH[dtype], device="cuda")
        elif mappable:
            t = shared_tensor(nbytes, TORCH[dtype])
        else:
            t = torch.empty(host.size, dtype=TORCH[dtype])
        src = host.view(np.int16) if dtype == "bfloat16" else host
        t.view(torch.int16 if dtype == "bfloat16" else t.dtype).copy_(torch.from_numpy(src.copy()))
        return t

    def one(self, coll: str, alg: str, transport: str, dtype: str, op: str, count: int,
            in_place: bool, cache: bool) -> None:
        comm, p = self.comm, self.comm.size
        salt = self.next_salt()
        root = (salt % p) if coll != "allreduce" else 0
        inputs = [data(r, count, NP[dtype], op, salt) for r in range(p)]
        mappable = transport == "ipc"
        send = self.tensor(inputs[comm.rank], dtype, mappable)
        recv = send if in_place else self.tensor(np.full(count, 99, NP[dtype]), dtype, mappable)
        rop = get_op(op) if coll != "broadcast" else None
        label = f"{coll} {alg} {transport} {dtype} {op} n={count} in_place={in_place} cache={cache}"
        if coll == "broadcast":
            call = dev.bind(comm, coll, alg, send, None, None, root, transport=transport,
                            kind_cache=cache)
        else:
            target = recv if (coll == "allreduce" or comm.rank == root) else None
            call = dev.bind(comm, coll, alg, send, target, rop, root, transport=transport,
                            kind_cache=cache)
        want = inputs[root] if coll == "broadcast" else reference(op, inputs)
        where = send if coll == "broadcast" else recv
        for attempt in (1, 2):                  # twice: the second call reuses handles, cache
            send_copy = self.tensor(inputs[comm.rank], dtype, False)
            send.copy_(send_copy)
            if recv is not send:
                recv.fill_(99)                  # the second call must write its result again
            call()
            if coll == "reduce" and comm.rank != root:
                self.check(f"{label}: input untouched (call {attempt})",
                           np.array_equal(to_host(send), inputs[comm.rank]))
            else:
                got = to_host(where).astype(np.float64)
                tol = 0.0 if op != "avg" else np.abs(want) * 2 * float(ml_dtypes.finfo(NP[dtype]).eps)
                self.check(f"{label} (call {attempt})",
                           got.shape == want.shape and bool(np.all(np.abs(got - want) <= tol)))
        self.facts(label, call.facts(), coll, alg, transport, cache, count, in_place)

    def facts(self, label: str, facts: dict, coll: str, alg: str, transport: str, cache: bool, count: int,
              in_place: bool) -> None:
        want_kernel = {"cpu": ("torch-CPU",), "cuda": ("torch-CUDA", "CuPy")}[self.device]
        kernel = facts.get("kernel")
        if kernel is not None or (coll == "allreduce" and alg != "rhd" and count >= self.comm.size > 1):
            self.check(f"{label}: kernel {kernel}", kernel in want_kernel)
        if count and self.comm.size > 1:
            self.check(f"{label}: transport {facts.get('device_transport')}",
                       facts.get("device_transport") == transport)
        self.check(f"{label}: kind_cache {facts.get('kind_cache')}",
                   facts.get("kind_cache") == ("on" if cache else "off"))
        if alg == "shm" and self.comm.size > 1 and count:
            reads = "slices" if in_place else self.reads        # in place: always by slices
            self.check(f"{label}: shm_reads {facts.get('shm_reads')} ({reads} asked)",
                       facts.get("shm_reads") == reads)
        if cache and "kind_lookups" in facts:
            # Each (address, bytes) the reducer saw was asked once, whatever the calls.
            self.check(f"{label}: lookups {facts['kind_lookups']}", facts["kind_lookups"] <= 4 * self.comm.size + 4)
        # what a call's look-ups cost, for Awan's on-against-off figure
        self.check(f"{label}: look-ups priced {facts.get('kind_lookup_us_per_call')}",
                   facts.get("kind_lookup_us_per_call", -1) >= 0 and facts.get("kind_lookup_us", 0) > 0)


class TensorSide:
    """measure.calls' DeviceSide over tensors of ``device`` (CPU tensors: the stand-in)."""

    def __init__(self, device: str) -> None:
        self.device = device

    def put(self, host: np.ndarray):
        src = host.view(np.int16) if host.dtype == ml_dtypes.bfloat16 else host
        t = torch.from_numpy(src.copy()).to(self.device)
        return t.view(torch.bfloat16) if host.dtype == ml_dtypes.bfloat16 else t

    def load(self, device, host: np.ndarray) -> None:
        device.copy_(self.put(host))

    def fetch(self, device, host: np.ndarray) -> np.ndarray:
        host[...] = to_host(device).reshape(host.shape)
        return host


def bench_path(suite: Suite) -> None:
    """The harness' route (measure.calls.prepare with a device side, as ``ddlcomm bench
    --memory device --algorithm ...`` takes it): staged transport on plain tensors."""
    from ddlcomm.collectives import get_collective
    from ddlcomm.dtypes import get_dtype
    from ddlcomm.measure.calls import prepare
    comm = suite.comm
    for alg in ("ring", "rhd"):
        for dtype in ("float32", "bfloat16"):
            if suite.device == "cpu":
                # plain CPU tensors cannot be mapped: each rank its own "node", so auto picks staged
                os.environ["DDLCOMM_NODE"] = f"stand-in-node-{comm.rank}"
            coll, dt, op = get_collective("allreduce"), get_dtype(dtype), get_op("sum")
            prepared = prepare(coll, comm, "buffer", dt, 13, op, 0, False, algorithm=alg,
                               device=TensorSide(suite.device), kind_cache=False)
            prepared.reset()
            prepared.run()
            os.environ.pop("DDLCOMM_NODE", None)
            got = coll.verify(prepared.result(), coll.expected(dt, 13, comm.rank, comm.size, op, 0), dt)
            suite.check(f"bench route {alg} {dtype}", got)
            facts = prepared.facts()
            want = "ipc" if suite.device == "cuda" else "staged"
            suite.check(f"bench route {alg} facts {facts}", facts.get("kind_cache") == "off"
                        and facts.get("device_transport", want) == want)


def shm_refused_across_nodes(suite: Suite) -> None:
    """The device shm all-reduce refuses, on every rank alike, ranks that are not on one
    device of one node (each rank its own node here)."""
    comm = suite.comm
    if comm.size == 1:
        return
    send = suite.tensor(np.ones(4, np.float32), "float32", True)
    os.environ["DDLCOMM_NODE"] = f"stand-in-node-{comm.rank}"
    try:
        dev.bind(comm, "allreduce", "shm", send, send, get_op("sum"))
        suite.check("shm across nodes refused", False)
    except UnsupportedError as exc:
        suite.check(f"shm across nodes refused: {exc}", "one GPU" in str(exc))
    finally:
        os.environ.pop("DDLCOMM_NODE", None)


def one_gpu_asked(suite: Suite) -> None:
    """``auto``'s question before it takes the device shm: every rank on one device of one
    node (the ranks here share one GPU, or the CPU), and not where each is its own node."""
    comm = suite.comm
    suite.check("one_gpu: every rank on one device", dev.one_gpu(comm))
    dev._ONE_GPU.clear()
    os.environ["DDLCOMM_NODE"] = f"stand-in-node-{comm.rank}"
    try:
        suite.check("one_gpu: a node per rank", dev.one_gpu(comm) == (comm.size == 1))
    finally:
        os.environ.pop("DDLCOMM_NODE", None)
        dev._ONE_GPU.clear()


def bad_arguments_agreed(suite: Suite) -> None:
    """Arguments one rank (or every rank) gets wrong raise on every rank, naming the first
    that did: a root past the ranks ran as another rank (reduce's avg never divided), a
    root without its receive buffer lost the result, avg of int32 failed after all the
    messages, and a rank whose buffers were refused left the others in the set-up."""
    from ddlcomm.errors import EveryRankError
    comm, p, rank = suite.comm, suite.comm.size, suite.comm.rank
    send = suite.tensor(np.ones(4, np.float32), "float32", True)
    recv = suite.tensor(np.zeros(4, np.float32), "float32", True)
    ints = suite.tensor(np.ones(4, np.int32), "int32", True)
    short = suite.tensor(np.zeros(3, np.float32), "float32", True)
    cases = [
        (lambda: dev.bind(comm, "reduce", "binomial", send, recv, get_op("sum"), root=p),
         f"rank 0: root {p} is not a rank"),
        (lambda: dev.bind(comm, "reduce", "binomial", send, None, get_op("sum"), root=p - 1),
         f"rank {p - 1}: a device reduce needs its receive buffer at the root"),
        (lambda: dev.bind(comm, "allreduce", "ring", ints, ints, get_op("avg")),
         "rank 0: op avg needs a floating-point dtype"),
        (lambda: dev.bind(comm, "allreduce", "shm", send, short if rank == p - 1 else recv, get_op("sum")),
         f"rank {p - 1}: the receive buffer has 3 elements"),
    ]
    for call, message in cases:
        try:
            call()
            suite.check(f"refused: {message}", False)
        except EveryRankError as exc:
            suite.check(f"refused: {message} (got {exc})", message in str(exc))


def shm_refused_in_place_on_some_ranks(suite: Suite) -> None:
    """The device shm all-reduce refuses, on every rank alike, in place on some ranks only:
    those run other steps (by slices) than the rest (whole), and the job would hang."""
    comm = suite.comm
    if comm.size == 1:
        return
    send = suite.tensor(np.ones(4, np.float32), "float32", True)
    recv = send if comm.rank == 0 else suite.tensor(np.zeros(4, np.float32), "float32", True)
    try:
        dev.bind(comm, "allreduce", "shm", send, recv, get_op("sum"))
        suite.check("shm in place on rank 0 only refused", False)
    except UsageError as exc:
        suite.check(f"shm in place on rank 0 only refused: {exc}", "on ranks [0] only" in str(exc))
    # another size on the last rank: it would read slices, the others the whole message
    n = 8 if comm.rank == comm.size - 1 else 4
    send = suite.tensor(np.ones(n, np.float32), "float32", True)
    recv = suite.tensor(np.zeros(n, np.float32), "float32", True)
    try:
        dev.bind(comm, "allreduce", "shm", send, recv, get_op("sum"))
        suite.check("shm with another size on one rank refused", False)
    except UsageError as exc:
        suite.check(f"shm with another size on one rank refused: {exc}",
                    f"rank {comm.size - 1}: 8 float32" in str(exc))


def run(comm, device: str, thin: bool = False) -> Suite:
    suite = Suite(comm, device)
    bench_path(suite)
    shm_refused_across_nodes(suite)
    one_gpu_asked(suite)
    bad_arguments_agreed(suite)
    shm_refused_in_place_on_some_ranks(suite)
    for coll, alg, transports in VARIANTS:
        for transport in transports:
            # the device shm all-reduce both ways: every rank reducing the whole message
            # (the default for these sizes out of place), and by slices then the all-gather
            # (in place always: in the slices pass, and at BIG under the whole pass's bound)
            for reads in (("whole", "slices") if alg == "shm" else (None,)):
                if reads is not None:
                    allreduce_shm.WHOLE_MAX_BYTES = WHOLE_MAX_BYTES if reads == "whole" else 0
                suite.reads = reads
                for dtype in DTYPES:
                    ops = ["sum"] if coll == "broadcast" else \
                        [o for o in OPS if o != "avg" or dtype != "int32"]
                    for op in (o for o in ops if not thinned(dtype, o, thin)):
                        for count in COUNTS:
                            for in_place in ((True,) if coll == "broadcast" else (False,)
                                             if reads == "whole" else (False, True)):
                                suite.one(coll, alg, transport, dtype, op, count, in_place,
                                          cache=(count % 2 == 0))
                suite.one(coll, alg, transport, "float32", "sum", BIG, False, True)
                suite.one(coll, alg, transport, "float32", "sum", BIG, True, True)
    allreduce_shm.WHOLE_MAX_BYTES = WHOLE_MAX_BYTES
    return suite


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--thin", action="store_true", help=THIN_HELP)
    args = parser.parse_args()
    comm = ddlcomm.init(args.backend)
    if args.device == "cuda":
        use_gpu(comm.local_rank)            # the library's rule: GPU local_rank % gpus
    start = time.perf_counter()
    suite = guarded(comm, lambda: run(comm, args.device, args.thin))
    elapsed = time.perf_counter() - start
    return conclude(comm, suite.failures,
                    lambda n, cases: f"{comm.library} {comm.library_version}: {comm.size} ranks, "
                                     f"{n} failures, {sum(cases)} cases, {elapsed:.1f} s "
                                     f"({args.device} tensors)", suite.cases)


if __name__ == "__main__":
    sys.exit(main())
