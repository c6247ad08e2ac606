"""Rank-side correctness suite: every collective x form x dtype x op vs NumPy.

Run under a launcher (``mpirun -n N python rank_suite.py``); passes at any N.
Expected values are computed here with NumPy from every rank's input, not
from ddlcomm's own collective table, so the two check each other.  Inputs are
small random integers, so sums are exact in every dtype and any reduction
order.  Exit 0 when every case passed on every rank, 1 otherwise (rank 0
lists the failures).
"""
from __future__ import annotations

import sys
import traceback

import numpy as np

import ddlcomm
from ddlcomm.dtypes import DTYPES, OPS

COUNTS = (0, 1, 7)          # per-rank (or per-block) element counts: zero, one, odd


def data(rank: int, count: int, dtype, op: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + salt)
    hi = 3 if op == "prod" else 20
    return rng.integers(1, hi, size=count).astype(dtype)


def reference(op: str, arrays: list[np.ndarray], dtype) -> np.ndarray:
    stack = np.stack(arrays).astype(np.float64 if np.dtype(dtype).kind == "f" else np.int64)
    out = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0),
           "max": stack.max(0), "avg": stack.sum(0) / len(arrays)}[op]
    return out.astype(dtype)


def close(a, b, dtype) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if np.dtype(dtype).kind == "f":
        return bool(np.allclose(a, b, rtol=4 * np.finfo(dtype).eps, atol=0))
    return bool(np.array_equal(a, b))


def run_cases(comm) -> list[str]:
    rank, p = comm.rank, comm.size
    failures: list[str] = []
    roots = sorted({0, p - 1})
    salt = 0

    def case(name, ok):
        if not ok:
            failures.append(f"rank {rank}: {name}")

    for dname, dt in DTYPES.items():
        dtype = dt.numpy
        for count in COUNTS:
            salt += 1
            mine = data(rank, count, dtype, "sum", salt)
            every = [data(r, count, dtype, "sum", salt) for r in range(p)]
            tag = f"{dname} count={count}"
            for root in roots:
                buf = mine.copy() if rank == root else np.zeros(count, dtype)
                comm.broadcast(buf, root)
                case(f"broadcast buffer {tag} root={root}", close(buf, every[root], dtype))
                got = comm.broadcast_object(mine if rank == root else None, root)
                case(f"broadcast object {tag} root={root}", close(got, every[root], dtype))
                got = comm.gather(mine, root=root)
                case(f"gather buffer {tag} root={root}",
                     close(got, np.concatenate(every), dtype) if rank == root else got is None)
                got = comm.gather_object(mine, root=root)
                case(f"gather object {tag} root={root}",
                     all(close(g, e, dtype) for g, e in zip(got, every)) and len(got) == p
                     if rank == root else got is None)
            case(f"allgather buffer {tag}", close(comm.allgather(mine), np.concatenate(every), dtype))
            got = comm.allgather_object(mine)
            case(f"allgather object {tag}", len(got) == p and all(close(g, e, dtype) for g, e in zip(got, every)))
            # alltoall / reduce_scatter: count elements per block
            blocks_mine = data(rank, count * p, dtype, "sum", salt)
            blocks_every = [data(r, count * p, dtype, "sum", salt) for r in range(p)]
            want = np.concatenate([b[rank * count:(rank + 1) * count] for b in blocks_every])
            case(f"alltoall buffer {tag}", close(comm.alltoall(blocks_mine), want, dtype))
            got = comm.alltoall_object(list(np.split(blocks_mine, p)))
            case(f"alltoall object {tag}", close(np.concatenate(got), want, dtype))
            if rank + 1 < p:
                comm.send(mine, rank + 1, tag=5)
                comm.send_object({"from": rank, "data": mine}, rank + 1, tag=6)
            if rank > 0:
                buf = np.zeros(count, dtype)
                comm.recv(buf, rank - 1, tag=5)
                case(f"send/recv buffer {tag}", close(buf, every[rank - 1], dtype))
                obj = comm.recv_object(rank - 1, tag=6)
                case(f"send/recv object {tag}", obj["from"] == rank - 1 and close(obj["data"], every[rank - 1], dtype))
            for opname, op in OPS.items():
                if op.floats_only and not dt.is_float:
                    continue
                salt += 1
                mine = data(rank, count, dtype, opname, salt)
                every = [data(r, count, dtype, opname, salt) for r in range(p)]
                want = reference(opname, every, dtype)
                t = f"{tag} op={opname}"
                case(f"allreduce buffer {t}", close(comm.allreduce(mine, op=opname), want, dtype))
                inplace = mine.copy()
                comm.allreduce(inplace, inplace, op=opname)
                case(f"allreduce in-place {t}", close(inplace, want, dtype))
                case(f"allreduce object {t}", close(comm.allreduce_object(mine, op=opname), want, dtype))
                for root in roots:
                    got = comm.reduce(mine, op=opname, root=root)
                    case(f"reduce buffer {t} root={root}", close(got, want, dtype) if rank == root else got is None)
                    got = comm.reduce_object(mine, op=opname, root=root)
                    case(f"reduce object {t} root={root}", close(got, want, dtype) if rank == root else got is None)
                bm = data(rank, count * p, dtype, opname, salt)
                be = [data(r, count * p, dtype, opname, salt) for r in range(p)]
                want = reference(opname, be, dtype)[rank * count:(rank + 1) * count]
                case(f"reduce_scatter buffer {t}", close(comm.reduce_scatter(bm, op=opname), want, dtype))
                got = comm.reduce_scatter_object(list(np.split(bm, p)), op=opname)
                case(f"reduce_scatter object {t}", close(got, want, dtype))
    comm.barrier()
    case("object allreduce of a dict-free python int", comm.allreduce_object(rank + 1) == p * (p + 1) // 2)
    return failures


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--chunk", type=int, help="object-form chunk bytes (small: test chunking)")
    args = parser.parse_args()
    if args.chunk:
        from ddlcomm.comm import objects
        objects.CHUNK_BYTES = args.chunk
    comm = ddlcomm.init(args.backend)
    try:
        failures = run_cases(comm)
    except Exception:
        traceback.print_exc()
        comm.abort(2)
    everyone = comm.gather_object(failures, root=0)
    if comm.rank == 0:
        flat = [f for fs in everyone for f in fs]
        print(f"{comm.library} {comm.library_version}: {comm.size} ranks, "
              f"{len(flat)} failures")
        for f in flat[:50]:
            print("FAIL", f)
        code = 1 if flat else 0
    else:
        code = 0
    code = comm.broadcast_object(code, 0)
    comm.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
