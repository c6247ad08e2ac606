"""Rank-side correctness suite: every collective x form x dtype x op vs NumPy.

Run under a launcher (``mpirun -n N python rank_suite.py [--backend NAME]``);
passes at any N.  Cases of a collective the backend declares unsupported, or
of a dtype it cannot carry, are skipped and listed ("skipped: ..." on rank 0),
not failed.
Expected values are computed here with NumPy from every rank's input, not
from ddlcomm's own collective table, so the two check each other.  Inputs are
small random integers, so sums are exact in every dtype and any reduction
order.  Buffer-form calls are checked directly and bound (``comm.bind``,
run twice on the same buffers), and inputs must come back untouched.  Exit 0
when every case passed on every rank, 1 otherwise (rank 0 lists the failures).
"""
from __future__ import annotations

import sys

import numpy as np

import ddlcomm
from ddlcomm.dtypes import DTYPES, OPS
from ddlcomm.errors import UnsupportedError
from suite_kit import conclude, data, guarded, reference

COUNTS = (0, 1, 7)          # per-rank (or per-block) element counts: zero, one, odd


def close(a, b, dtype) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if np.dtype(dtype).kind == "f":
        return bool(np.allclose(a, b, rtol=4 * np.finfo(dtype).eps, atol=0))
    return bool(np.array_equal(a, b))


class Cases:
    """Runs checks; records failures, and skips of what the backend declares it cannot run."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.failures: list[str] = []
        self.skipped: dict[str, int] = {}      # "<collective> <reason>" -> cases skipped

    def skip(self, what: str, reason: str) -> None:
        key = f"{what} {reason}"
        self.skipped[key] = self.skipped.get(key, 0) + 1

    def __call__(self, name: str, collective: str, check) -> None:
        """Run ``check()`` (True when right) unless the backend cannot run ``collective``.

        Every rank decides alike (same collective, same reason), so no rank is
        left waiting in a collective the others skipped.
        """
        reason = self.comm.unsupported.get(collective)
        if reason is not None:
            self.skip(collective, reason)
            return
        try:
            ok = check()
        except UnsupportedError as exc:      # e.g. an object form built on an unsupported one
            self.skip(collective, f"({exc})")
            return
        if not ok:
            self.failures.append(f"rank {self.comm.rank}: {name}")


def run_cases(comm) -> Cases:
    rank, p = comm.rank, comm.size
    case = Cases(comm)
    roots = sorted({0, p - 1})
    salt = 0

    for dname, dt in DTYPES.items():
        dtype = dt.numpy
        if dname not in comm.dtypes:
            case.skip(f"every collective on {dname}:", f"backend {comm.name} cannot carry it")
            continue
        for count in COUNTS:
            salt += 1
            mine = data(rank, count, dtype, "sum", salt)
            every = [data(r, count, dtype, "sum", salt) for r in range(p)]
            tag = f"{dname} count={count}"
            for root in roots:
                def broadcast_buffer(bound):
                    buf = mine.copy() if rank == root else np.zeros(count, dtype)
                    if bound:
                        comm.bind("broadcast", buf, root=root)()
                    else:
                        comm.broadcast(buf, root)
                    return close(buf, every[root], dtype)
                for bound in (False, True):
                    case(f"broadcast {'bound' if bound else 'buffer'} {tag} root={root}",
                         "broadcast", lambda: broadcast_buffer(bound))
                case(f"broadcast object {tag} root={root}", "broadcast", lambda: close(
                    comm.broadcast_object(mine if rank == root else None, root),
                    every[root], dtype))

                def gather_buffer():
                    got = comm.gather(mine, root=root)
                    return close(got, np.concatenate(every), dtype) if rank == root else got is None
                case(f"gather buffer {tag} root={root}", "gather", gather_buffer)

                def gather_bound():
                    recv = np.zeros(count * p, dtype) if rank == root else None
                    call = comm.bind("gather", mine, recv, root=root)
                    return all(twice(call, recv, lambda: close(recv, np.concatenate(every), dtype)
                                     if rank == root else True))
                case(f"gather bound {tag} root={root}", "gather", gather_bound)

                def gather_object():
                    got = comm.gather_object(mine, root=root)
                    if rank != root:
                        return got is None
                    return len(got) == p and all(close(g, e, dtype) for g, e in zip(got, every))
                case(f"gather object {tag} root={root}", "gather", gather_object)
            case(f"allgather buffer {tag}", "allgather",
                 lambda: close(comm.allgather(mine), np.concatenate(every), dtype))
            case(f"allgather bound {tag}", "allgather",
                 lambda: bound_twice(comm, "allgather", mine, count * p, np.concatenate(every)))

            def allgather_object():
                got = comm.allgather_object(mine)
                return len(got) == p and all(close(g, e, dtype) for g, e in zip(got, every))
            case(f"allgather object {tag}", "allgather", allgather_object)
            # alltoall / reduce_scatter: count elements per block
            blocks_mine = data(rank, count * p, dtype, "sum", salt)
            blocks_every = [data(r, count * p, dtype, "sum", salt) for r in range(p)]
            want = np.concatenate([b[rank * count:(rank + 1) * count] for b in blocks_every])
            case(f"alltoall buffer {tag}", "alltoall",
                 lambda: close(comm.alltoall(blocks_mine), want, dtype))
            case(f"alltoall bound {tag}", "alltoall",
                 lambda: bound_twice(comm, "alltoall", blocks_mine, count * p, want))
            case(f"alltoall object {tag}", "alltoall", lambda: close(
                np.concatenate(comm.alltoall_object(list(np.split(blocks_mine, p)))), want, dtype))

            def send_recv(form):
                if rank + 1 < p:
                    if form == "buffer":
                        comm.send(mine, rank + 1, tag=5)
                    else:
                        comm.send_object({"from": rank, "data": mine}, rank + 1, tag=6)
                if rank == 0:
                    return True
                if form == "buffer":
                    buf = np.zeros(count, dtype)
                    comm.recv(buf, rank - 1, tag=5)
                    return close(buf, every[rank - 1], dtype)
                obj = comm.recv_object(rank - 1, tag=6)
                return obj["from"] == rank - 1 and close(obj["data"], every[rank - 1], dtype)
            case(f"send/recv buffer {tag}", "send", lambda: send_recv("buffer"))
            case(f"send/recv object {tag}", "send", lambda: send_recv("object"))
            for opname, op in OPS.items():
                if op.floats_only and not dt.is_float:
                    continue
                salt += 1
                mine = data(rank, count, dtype, opname, salt)
                every = [data(r, count, dtype, opname, salt) for r in range(p)]
                want = reference(opname, every).astype(dtype)
                t = f"{tag} op={opname}"
                case(f"allreduce buffer {t}", "allreduce",
                     lambda: close(comm.allreduce(mine, op=opname), want, dtype))

                def allreduce_in_place():
                    inplace = mine.copy()
                    comm.allreduce(inplace, inplace, op=opname)
                    return close(inplace, want, dtype)
                case(f"allreduce in-place {t}", "allreduce", allreduce_in_place)
                case(f"allreduce bound {t}", "allreduce",
                     lambda: bound_twice(comm, "allreduce", mine, count, want, op=opname))
                case(f"allreduce object {t}", "allreduce",
                     lambda: close(comm.allreduce_object(mine, op=opname), want, dtype))
                for root in roots:
                    def reduce_buffer(how):
                        kept = mine.copy()
                        if how == "in-place":
                            buf = mine.copy()
                            got = comm.reduce(buf, buf, op=opname, root=root)
                            if rank != root:
                                return got is None
                            return got is buf and close(got, want, dtype)
                        if how == "bound":
                            recv = np.zeros(count, dtype) if rank == root else None
                            call = comm.bind("reduce", mine, recv, op=opname, root=root)
                            return all(twice(call, recv, lambda: (
                                close(recv, want, dtype) if rank == root else True)
                                and np.array_equal(mine, kept)))
                        else:
                            got = comm.reduce(mine, op=opname, root=root)
                        ok = close(got, want, dtype) if rank == root else got is None
                        return ok and np.array_equal(mine, kept)     # sendbuf untouched
                    for how in ("buffer", "in-place", "bound"):
                        case(f"reduce {how} {t} root={root}", "reduce", lambda: reduce_buffer(how))

                    def reduce_object():
                        got = comm.reduce_object(mine, op=opname, root=root)
                        return close(got, want, dtype) if rank == root else got is None
                    case(f"reduce object {t} root={root}", "reduce", reduce_object)
                bm = data(rank, count * p, dtype, opname, salt)
                be = [data(r, count * p, dtype, opname, salt) for r in range(p)]
                want = reference(opname, be).astype(dtype)[rank * count:(rank + 1) * count]
                case(f"reduce_scatter buffer {t}", "reduce_scatter",
                     lambda: close(comm.reduce_scatter(bm, op=opname), want, dtype))
                case(f"reduce_scatter bound {t}", "reduce_scatter",
                     lambda: bound_twice(comm, "reduce_scatter", bm, count, want, op=opname))
                case(f"reduce_scatter object {t}", "reduce_scatter", lambda: close(
                    comm.reduce_scatter_object(list(np.split(bm, p)), op=opname), want, dtype))
    case("barrier", "barrier", lambda: comm.barrier() is None)
    case("recv_any from every other rank", "recv_any", lambda: recv_any_from_all(comm))
    case("object allreduce of a dict-free python int", "allreduce",
         lambda: comm.allreduce_object(rank + 1) == p * (p + 1) // 2)
    return case


def twice(call, recv, check) -> list[bool]:
    """``check()`` after each of two runs of the bound ``call``, ``recv`` (None off a
    root) zeroed before each: the second run must write its result again."""
    results = []
    for _ in range(2):
        if recv is not None:
            recv[:] = 0
        call()
        results.append(bool(check()))
    return results


def bound_twice(comm, collective: str, sendbuf: np.ndarray, recv_count: int,
                want: np.ndarray, op: str = "sum") -> bool:
    """A bound call on fixed out-of-place buffers, run twice: right both times, input kept."""
    kept = sendbuf.copy()
    recv = np.zeros(recv_count, sendbuf.dtype)
    call = comm.bind(collective, sendbuf, recv, op=op)
    return all(twice(call, recv, lambda: close(recv, want, sendbuf.dtype))) and \
        np.array_equal(sendbuf, kept)


def recv_any_from_all(comm) -> bool:
    """Every rank > 0 sends its rank to 0; rank 0 takes them in any order."""
    dtype = np.dtype(np.int64) if "int64" in comm.dtypes else DTYPES[comm.dtypes[0]].numpy
    if comm.rank > 0:
        comm.send(np.array([comm.rank], dtype), 0, tag=11)
        return True
    sources = []
    for _ in range(comm.size - 1):
        buf = np.full(1, 0, dtype)
        source = comm.recv_any(buf, tag=11)
        if int(buf[0]) != source:
            return False
        sources.append(source)
    return sorted(sources) == list(range(1, comm.size))


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
    cases = guarded(comm, lambda: run_cases(comm))
    def summary(n: int, skips: list) -> str:
        lines = [f"skipped: {key}" for key in sorted({k for sk in skips for k in sk})]
        return "\n".join(lines + [f"{comm.library} {comm.library_version}: {comm.size} ranks, "
                                   f"{n} failures, {sum(cases.skipped.values())} cases skipped"])
    return conclude(comm, cases.failures, summary, cases.skipped)


if __name__ == "__main__":
    sys.exit(main())
