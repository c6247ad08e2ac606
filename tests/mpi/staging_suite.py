"""Rank-side checks of the host-staged data path's plumbing, with CPU tensors standing in
for the GPU.

NOT a GPU test: ``HostStaged(device="cpu")`` keeps each rank's "device" data in
torch CPU tensors, so this checks the staging itself (which ranks copy when,
the collective on the staging buffers, the data arriving intact, the
separately timed d2h / collective / h2d phases and their records), over a
real MPI (or Gloo) backend, not a GPU's copies.  The registry entry is
replaced by the CPU-parameterised path for this process only.

Run under a launcher: ``mpirun -n N python staging_suite.py [--backend NAME]``.
Rank 0 prints ``staging: N ranks, F failures``; exit 0 when nothing failed.
"""
import argparse
import sys

import numpy as np

from ddlcomm.bench.plan import BenchPlan, PointSpec
from ddlcomm.comm import registry
from ddlcomm.workloads import get_workload, paths
from suite_end import conclude

SIZES = (4, 4096, 1 << 20)


def plan_for(workload: str, backend: str, nranks: int) -> BenchPlan:
    return BenchPlan(backends=[backend], collectives=[], sizes=list(SIZES), dtype="float32",
                     op="sum", forms=["buffer"], workloads=[workload], paths=["host-staged"],
                     steps=3, warmup=1, ranks=nranks)


def check_records(workload: str, nbytes: int, records: list, failures: list) -> None:
    want = {"ps-sync": ("broadcast", "broadcast.d2h", "broadcast.broadcast", "broadcast.h2d",
                        "gather", "gather.d2h", "gather.gather", "gather.h2d", "apply", "step"),
            "allreduce": ("allreduce", "allreduce.d2h", "allreduce.allreduce", "allreduce.h2d",
                          "apply", "step")}[workload]
    got = tuple(r["extra"]["phase"] for r in records)
    if got != want:
        failures.append(f"{workload} {nbytes} B: phases {got}, expected {want}")
    for r in records:
        if r["check"] != "passed":
            failures.append(f"{workload} {nbytes} B {r['extra']['phase']}: check {r['check']}")
        if r["extra"]["path"] != "host-staged" or "copy_alone_d2h_GBps" not in r["extra"]:
            failures.append(f"{workload} {nbytes} B: extra {r['extra']}")
    whole = {r["extra"]["phase"]: r["t_avg_us"] for r in records}
    parts = [v for k, v in whole.items() if k.startswith(want[0] + ".")]
    if not np.isclose(whole[want[0]], sum(parts), rtol=0.05, atol=5.0):
        failures.append(f"{workload} {nbytes} B: {want[0]} {whole[want[0]]} us is not the sum "
                        f"of its parts {parts}")


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--backend", default="mpi")
    backend = args.parse_args().backend
    paths.PATHS["host-staged"] = paths.HostStaged(device="cpu")    # CPU tensors stand in
    comm = registry.create(backend)
    failures: list[str] = []
    for workload in ("ps-sync", "allreduce"):
        if comm.size < get_workload(workload).min_ranks:
            continue
        plan = plan_for(workload, backend, comm.size)
        for nbytes in SIZES:
            spec = PointSpec("workload", workload, nbytes, "buffer", backend, path="host-staged")
            records = get_workload(workload).measure(
                comm, plan, spec, lambda dtype, n: np.zeros(n, dtype.numpy))
            if comm.rank == 0:
                check_records(workload, nbytes, records, failures)
    return conclude(comm, failures, lambda n, _: f"staging: {comm.size} ranks, {n} failures")


if __name__ == "__main__":
    sys.exit(main())
