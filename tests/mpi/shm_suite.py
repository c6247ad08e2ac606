"""Rank-side checks of the shared-memory all-reduce (copying and zero-copy)."""
import sys

import numpy as np

import ddlcomm
from ddlcomm import memory
from ddlcomm.comm.shm import bind_allreduce, slices
from ddlcomm.dtypes import DTYPES, OPS


def main() -> int:
    comm = ddlcomm.init("mpi")
    p, failures, held = comm.size, [], []
    for dname, dt in DTYPES.items():
        for opname, op in OPS.items():
            if op.floats_only and not dt.is_float:
                continue
            for n in (0, 1, 7, 13, 10007):
                hi = 3 if opname == "prod" else 20
                every = [np.random.default_rng(100 * q + n).integers(1, hi, n).astype(dt.numpy)
                         for q in range(p)]
                ref = np.stack(every).astype(np.float64 if dt.is_float else np.int64)
                want = {"sum": ref.sum(0), "prod": ref.prod(0), "min": ref.min(0),
                        "max": ref.max(0), "avg": ref.sum(0) / p}[opname].astype(dt.numpy)
                for variant in ("copy", "zero-copy", "in-place"):
                    if variant == "copy":
                        send, recv = every[comm.rank].copy(), np.zeros(n, dt.numpy)
                    else:
                        bufs = [memory.allocate("shared", max(1, n * dt.itemsize)) for _ in range(2)]
                        held += bufs
                        send = bufs[0].array(dt.numpy, n)
                        send[:] = every[comm.rank]
                        recv = send if variant == "in-place" else bufs[1].array(dt.numpy, n)
                    call = bind_allreduce(comm, send, recv, op)
                    call()
                    got = recv.astype(np.float64) if dt.is_float else recv
                    exp = want.astype(np.float64) if dt.is_float else want
                    ok = np.allclose(got, exp, rtol=8 * dt.eps, atol=0) \
                        if dt.is_float else np.array_equal(got, exp)
                    if not ok:
                        failures.append(f"rank {comm.rank} {variant} {dname} {opname} n={n}")
                    del call
    assert slices(10, 3) == [(0, 4), (4, 7), (7, 10)]
    comm.barrier()
    for buf in held:
        buf.free()
    everyone = comm.gather_object(failures, root=0)
    if comm.rank == 0:
        flat = [f for fs in everyone for f in fs]
        print(f"shm: {p} ranks, {len(flat)} failures")
        for f in flat[:20]:
            print("FAIL", f)
    return 0 if comm.broadcast_object(not any(failures) and True, 0) else 1


if __name__ == "__main__":
    sys.exit(main())
