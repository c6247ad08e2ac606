"""Rank-side checks of the host-staged data path's plumbing, with CPU tensors standing in
for the GPU.

NOT a GPU test: ``HostStaged(device="cpu")`` keeps each rank's "device" data in
torch CPU tensors, so this checks the staging itself (which ranks copy when,
the collective on the staging buffers, the data arriving intact, the
separately timed d2h / collective / h2d phases and their records), over a
real MPI (or Gloo) backend, not a GPU's copies.  The registry entry is
replaced by the CPU-parameterised path for this process only.

It also runs every collective along host-staged (``bench/staged.py``, with
``--path host-staged``'s phase records), and every collective through ``measure.calls``' device side with CPU
tensors standing in for device buffers (:class:`CPUTensors`): inputs filled and
results verified on host copies, the backend handed tensors.

Under MPI it also runs the parameter-server workloads along nccl-chief with Gloo
on CPU tensors standing in for NCCL on the GPU (``NCCLChief(backend="gloo",
device="cpu")``): the server-chief messages over MPI, the workers' group, the
order of the steps, the data arriving intact and the phase records.

Run under a launcher: ``mpirun -n N python staging_suite.py [--backend NAME]``.
Rank 0 prints ``staging: N ranks, F failures``; exit 0 when nothing failed.
"""
import argparse
import sys

import numpy as np

from ddlcomm.bench.plan import BenchPlan, PointSpec
from ddlcomm.bench.staged import measure_staged
from ddlcomm.collectives import COLLECTIVES
from ddlcomm.comm import registry
from ddlcomm.dtypes import DTYPES, get_op
from ddlcomm.measure.calls import prepare
from ddlcomm.memory.gpu import copy_in, copy_out
from ddlcomm.workloads import chief, get_workload, paths
from suite_kit import conclude, guarded

SIZES = (4, 4096, 1 << 20)


def plan_for(workload: str, backend: str, nranks: int, path: str = "host-staged") -> BenchPlan:
    return BenchPlan(backends=[backend], collectives=[], sizes=list(SIZES), dtype="float32",
                     op="sum", forms=["buffer"], workloads=[workload], paths=[path],
                     steps=3, warmup=1, ranks=nranks)


CHIEF_PHASES = {"ps-sync": ("broadcast.mpi", "broadcast.h2d", "broadcast.nccl", "broadcast",
                            "gather.nccl", "gather.d2h", "gather.mpi", "gather", "apply", "step"),
                "allreduce": ("allreduce", "apply", "step")}


def check_chief_records(workload: str, nbytes: int, records: list, failures: list) -> None:
    """nccl-chief's phases, checks and copies: the chief copies the parameters to its
    device, and the workers' whole table back (one row per worker)."""
    got = tuple(r["extra"]["phase"] for r in records)
    if got != CHIEF_PHASES[workload]:
        failures.append(f"nccl-chief {workload} {nbytes} B: phases {got}")
    failures += [f"nccl-chief {workload} {nbytes} B {r['extra']['phase']}: check {r['check']}"
                 for r in records if r["check"] != "passed"]
    copies = {r["extra"]["phase"]: r["extra"].get("copy_bytes") for r in records
              if r["extra"]["phase"].endswith(("d2h", "h2d"))}
    workers = records[0]["ranks"] - 1
    want = {"broadcast.h2d": nbytes, "gather.d2h": workers * nbytes} if workload == "ps-sync" else {}
    if copies != want or records[0]["extra"].get("chief") != 1:
        failures.append(f"nccl-chief {workload} {nbytes} B: copies {copies}, expected {want}; "
                        f"extra {records[0]['extra']}")


def check_records(workload: str, nbytes: int, records: list, failures: list) -> None:
    want = {"ps-sync": ("broadcast.d2h", "broadcast.broadcast", "broadcast.h2d", "broadcast",
                        "gather.d2h", "gather.gather", "gather.h2d", "gather", "apply", "step"),
            "allreduce": ("allreduce.d2h", "allreduce.allreduce", "allreduce.h2d", "allreduce",
                          "apply", "step")}[workload]
    got = tuple(r["extra"]["phase"] for r in records)
    if got != want:
        failures.append(f"{workload} {nbytes} B: phases {got}, expected {want}")
    ranks = records[0]["ranks"]
    copies = {r["extra"]["phase"]: r["extra"].get("copy_bytes") for r in records
              if r["extra"]["phase"].endswith(("d2h", "h2d"))}
    expected = {phase: ranks * nbytes if phase == "gather.h2d" else nbytes for phase in copies}
    if copies != expected:          # the gather's root copies the whole table back
        failures.append(f"{workload} {nbytes} B: bytes copied {copies}, expected {expected}")
    # each copy phase's bars are measured by the ranks that copy in it: the server alone
    # sends the broadcast and takes the gather back, the workers take the broadcast in,
    # every rank gives its part to the gather (the root its own too) and to the all-reduce
    copiers = {r["extra"]["phase"]: r["extra"].get("copiers") for r in records
               if r["extra"]["phase"] in copies}
    want_copiers = {phase: {"broadcast.d2h": 1, "gather.h2d": 1, "broadcast.h2d": ranks - 1}
                    .get(phase, ranks) for phase in copies}
    if ranks > 1 and copiers != want_copiers:
        failures.append(f"{workload} {nbytes} B: copiers {copiers}, expected {want_copiers}")
    for r in records:
        if r["check"] != "passed":
            failures.append(f"{workload} {nbytes} B {r['extra']['phase']}: check {r['check']}")
        # a copy phase carries the bars measured for its own bytes; no other phase has any
        bars = [r["extra"].get(f"copy_{how}_GBps") for how in ("alone", "at_once")]
        copying = r["extra"]["phase"] in copies
        if r["extra"]["path"] != "host-staged" or \
                (not all(b and b > 0 for b in bars) if copying else any(bars)):
            failures.append(f"{workload} {nbytes} B: extra {r['extra']}")
    whole, first = {r["extra"]["phase"]: r["t_avg_us"] for r in records}, want[3]
    parts = [v for k, v in whole.items() if k.startswith(first + ".")]
    if not np.isclose(whole[first], sum(parts), rtol=0.05, atol=5.0):
        failures.append(f"{workload} {nbytes} B: {first} {whole[first]} us is not the sum "
                        f"of its parts {parts}")


class CPUTensors:
    """measure.calls' DeviceSide with torch CPU tensors standing in for device memory."""

    def put(self, host):
        import torch
        out = torch.empty(host.size, dtype=getattr(torch, host.dtype.name))
        copy_in(out, host)
        return out

    def load(self, device, host):
        copy_in(device, host)

    def fetch(self, device, host):
        copy_out(device, host)
        return host


def device_side_collectives(comm, failures: list) -> None:
    for coll in COLLECTIVES.values():
        if not coll.moves_data:
            continue
        for dtype_name, op_name in (("float32", "sum"), ("float64", "avg"), ("int32", "max")):
            dtype = DTYPES[dtype_name]
            op = get_op(op_name) if coll.reduces else None
            count = 7 * comm.size
            for in_place in (False, True) if coll.in_place_ok else (False,):
                prepared = prepare(coll, comm, "buffer", dtype, count, op, 0, in_place,
                                   device=CPUTensors())
                prepared.reset()
                comm.barrier()
                prepared.run()
                comm.sync()
                want = coll.expected(dtype, count, comm.rank, comm.size, op, 0)
                if not coll.verify(prepared.result(), want, dtype):
                    failures.append(f"device side {coll.name} {dtype_name} {op_name} "
                                    f"in_place={in_place}: {prepared.result()} != {want}")


def staged_collectives(comm, backend: str, failures: list) -> None:
    """Every collective along host-staged (``bench --collective X --path host-staged``)."""
    names = [c.name for c in COLLECTIVES.values() if c.moves_data]
    plan = BenchPlan(backends=[backend], collectives=names, sizes=[4 * 7 * comm.size],
                     dtype="float32", op="avg", forms=["buffer"], paths=["host-staged"],
                     iters=3, warmup=1, ranks=comm.size, root=comm.size - 1)
    for spec in plan.points():
        records = measure_staged(comm, plan, spec)
        if comm.rank != 0:
            continue
        got = [r["extra"]["phase"] for r in records]
        want = [f"{spec.name}.{p}" for p in ("d2h", spec.name, "h2d")] + [spec.name]
        if spec.kind != "staged" or got != want or {r["check"] for r in records} != {"passed"}:
            failures.append(f"staged {spec.name}: kind {spec.kind}, phases {got}, checks "
                            f"{[r['check'] for r in records]}")
        copies = {r["extra"]["phase"].rpartition(".")[2]: r["extra"].get("copy_bytes")
                  for r in records[:-1]}
        table = spec.name in ("gather", "allgather")         # h2d brings the whole table back
        if copies["d2h"] != records[-1]["bytes"] or table and copies["h2d"] != comm.size * copies["d2h"]:
            failures.append(f"staged {spec.name}: bytes copied {copies} for {records[-1]['bytes']} B")
        if records[-1]["root"] != comm.size - 1 or records[-1]["extra"]["path"] != "host-staged":
            failures.append(f"staged {spec.name}: record {records[-1]}")
    # the half-precision all-reduces (issue 15's bfloat16 run: MPI's host-staged beside
    # ddlcomm's on the device buffers): the pinned staging carries them to the backend
    for dtype in ("float16", "bfloat16"):
        half = BenchPlan(backends=[backend], collectives=["allreduce"], sizes=[2 * 7 * comm.size],
                         dtype=dtype, op="sum", forms=["buffer"], paths=["host-staged"],
                         iters=3, warmup=1, ranks=comm.size)
        for spec in half.points():
            records = measure_staged(comm, half, spec)
            if comm.rank == 0 and {r["check"] for r in records} != {"passed"}:
                failures.append(f"staged allreduce {dtype}: checks {[r['check'] for r in records]}")


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--backend", default="mpi")
    backend = args.parse_args().backend
    paths.PATHS["host-staged"] = paths.HostStaged(device="cpu")    # CPU tensors stand in
    comm = registry.create(backend)
    return guarded(comm, lambda: run_suite(comm, backend))


def run_suite(comm, backend: str) -> int:
    failures: list[str] = []
    device_side_collectives(comm, failures)
    staged_collectives(comm, backend, failures)
    # Gloo stands in for NCCL beside the run's MPI (not beside a run's own Gloo: one
    # default process group per process)
    paths.PATHS["nccl-chief"] = paths.NCCLChief(backend="gloo", device="cpu")
    routes = [("host-staged", check_records, SIZES)]
    if backend == "mpi" and comm.size > 1:          # a server and a chief at least
        routes.append(("nccl-chief", check_chief_records, SIZES[1:2]))   # its plumbing: one size
    for path, check, sizes in routes:
        for workload in ("ps-sync", "allreduce"):
            if comm.size < get_workload(workload).min_ranks:
                continue
            plan = plan_for(workload, backend, comm.size, path)
            for nbytes in sizes:
                spec = PointSpec("workload", workload, nbytes, "buffer", backend, path=path)
                records = get_workload(workload).measure(
                    comm, plan, spec, lambda dtype, n: np.zeros(n, dtype.numpy))
                if comm.rank == 0:
                    check(workload, nbytes, records, failures)
    chief.close_shared()                    # torch's teardown aborts with a group left open
    return conclude(comm, failures, lambda n, _: f"staging: {comm.size} ranks, {n} failures")


if __name__ == "__main__":
    sys.exit(main())
