"""Rank-side checks of the shared-memory all-reduces: shm (staged, pipelined, mapped), shm-map and hierarchical.

Run under a launcher (``mpirun -n N python shm_suite.py [--backend NAME]``).
Every dtype × op × count (0, 1, 7, 13, 10007, and one above the leaders'
ring threshold) against a float64/int64 reference.  The pipelined form (the
C kernel's reducer) runs with 128-byte chunks, so most counts take many chunks
and reuse its staging windows, out of place and in place; the mapped forms
(two dtype and op pairs) take 128-byte pieces, and the smallest counts lie in their edge
slots only.  ``hierarchical`` runs
every dtype and op with the ranks round robin over 2 nodes (in place and
not), and spot checks with every rank on one node, in blocks of 2 and one
node per rank; nodes are named per rank with its ``node`` argument, so the
leaders' phase runs on one machine.
Rank 0 prints ``shm: N ranks, F failures``; exit 0 when nothing failed.
"""
import argparse
import sys

import numpy as np

import ddlcomm
from ddlcomm import memory
from ddlcomm.comm import hierarchical, shm, shm_mapped
from ddlcomm.dtypes import DTYPES, OPS
from ddlcomm.kernels import reducer
from suite_kit import THIN_HELP, conclude, guarded, thinned

COUNTS = (0, 1, 7, 13, 10007)
#: float32 elements above the leaders' ring threshold (1 MiB), not divisible by 2..5.
LARGE = 262_147

#: (dtype, op) the other node layouts run; "round robin" runs every dtype and op.
SPOT_CHECKS = {("float32", "sum"), ("float16", "avg"), ("bfloat16", "max"), ("int64", "prod")}

#: Chunk bytes of the pipelined runs: small, so that counts of a few hundred take many chunks.
PIPE_CHUNK = 128

#: Node layouts of the hierarchical runs: rank, ranks -> node name.
LAYOUTS = {
    "one node": lambda r, p: "n0",
    "round robin": lambda r, p: f"n{r % 2}",
    "blocks of 2": lambda r, p: f"n{r // 2}",
    "node per rank": lambda r, p: f"n{r}",
}


def expected(every, opname, dt, p):
    ref = np.stack(every).astype(np.float64 if dt.is_float else np.int64)
    want = {"sum": ref.sum(0), "prod": ref.prod(0), "min": ref.min(0),
            "max": ref.max(0), "avg": ref.sum(0) / p}[opname]
    return want.astype(dt.numpy)


def close(got, want, dt) -> bool:
    if not dt.is_float:
        return np.array_equal(got, want)
    return np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=8 * dt.eps, atol=0)


#: How shm is bound: its staged (NumPy kernel), pipelined and mapped forms, and shm-map, each
#: out of place and in place; "shared" buffers are --memory shared's; "offset": each rank's
#: buffers start at other offsets within their pages, so the ranks' partial pages differ.
VARIANTS = ("staged", "staged shared", "staged shared in-place", "pipelined", "pipelined in-place",
            "mapped shared", "mapped shared in-place", "shm-map", "shm-map in-place", "shm-map offset")
#: The mapped forms run these only (a sum, and an avg of halves that the finish divides):
#: their engine's every dtype and op is in tests/unit/test_shmmap.py (threads as ranks);
#: what MPI adds is the pages moved and mapped.
MAPPED = ("mapped", "shm-map")
MAPPED_CHECKS = {("float32", "sum"), ("float16", "avg")}


def buffers(variant, mine, dt, rank, held):
    """(send, recv) of ``variant`` (see VARIANTS), send holding ``mine``."""
    n = mine.size
    if "shared" in variant:
        bufs = [memory.allocate("shared", max(1, n * dt.itemsize)) for _ in range(2)]
        held += bufs
        send, recv = bufs[0].array(dt.numpy, n), bufs[1].array(dt.numpy, n)
    elif "offset" in variant:
        send = np.zeros(n + 64, dt.numpy)[3 * rank + 1:][:n]
        recv = np.zeros(n + 64, dt.numpy)[5 * rank + 2:][:n]
    else:
        send, recv = np.zeros(n, dt.numpy), np.zeros(n, dt.numpy)
    send[:] = mine
    return send, send if variant.endswith("in-place") else recv


def cases(comm, held, thin=False):
    """(label, bound call, send, its input, recv, expected, dtype) for every variant
    (``thin``: the (dtype, op) pairs of :func:`suite_kit.thinned`)."""
    p = comm.size
    for dname, dt in DTYPES.items():
        for opname, op in OPS.items():
            if op.floats_only and not dt.is_float or thinned(dname, opname, thin):
                continue
            counts = COUNTS + ((LARGE,) if dname == "float32" and opname in ("sum", "avg") else ())
            for n in counts:
                hi = 3 if opname == "prod" else 20
                every = [np.random.default_rng(100 * q + n).integers(1, hi, n).astype(dt.numpy)
                         for q in range(p)]
                want = expected(every, opname, dt, p)
                c_kernel = reducer("sum" if op.divide_by_ranks else opname, dt)
                c_kernel = c_kernel if shm.pipelines(c_kernel) else None
                for variant in VARIANTS:
                    compiled = variant.split()[0] in ("pipelined", "mapped", "shm-map")
                    if compiled and c_kernel is None or variant.split()[0] in MAPPED and \
                            (dname, opname) not in MAPPED_CHECKS:
                        continue
                    send, recv = buffers(variant, every[comm.rank], dt, comm.rank, held)
                    if variant.startswith("shm-map"):
                        call = shm_mapped.bind_allreduce(comm, send, recv, op, c_kernel, PIPE_CHUNK)
                    else:
                        call = shm.bind_allreduce(comm, send, recv, op, reduce=c_kernel if compiled else None,
                                                  chunk_bytes=PIPE_CHUNK if compiled else None)
                    yield f"shm {variant} {dname} {opname} n={n}", call, send, every[comm.rank], recv, want, dt
                for layout, node in LAYOUTS.items():
                    if layout != "round robin" and (dname, opname) not in SPOT_CHECKS:
                        continue
                    for in_place in (False, True) if layout == "round robin" else (False,):
                        send = every[comm.rank].copy()
                        recv = send if in_place else np.zeros(n, dt.numpy)
                        call = hierarchical.bind_allreduce(comm, send, recv, op,
                                                           node=node(comm.rank, p))
                        label = f"hierarchical {layout}{' in place' if in_place else ''} " \
                                f"{dname} {opname} n={n}"
                        yield label, call, send, every[comm.rank], recv, want, dt


def bound_checks(comm, failures) -> None:
    """What algorithms.bind hands shm and hierarchical (a review's finds): the receive buffer
    checked as the point-to-point algorithms check theirs, 2-D buffers, and an avg whose
    sum cancels across nodes (each node's share was divided before the nodes summed)."""
    from ddlcomm.comm import algorithms
    from ddlcomm.errors import UsageError
    avg, total = OPS["avg"], OPS["sum"]
    for alg in ("shm", "hierarchical"):
        for recv, why in ((np.zeros(8, np.int32), "is int32"), (np.zeros((4, 2), np.float32).T, "contiguous")):
            try:
                algorithms.bind(comm, "allreduce", alg, np.ones(8, np.float32), recv, total, 0)
                failures.append(f"rank {comm.rank} {alg}: a receive buffer that {why} was taken")
            except UsageError as exc:
                if why not in str(exc):
                    failures.append(f"rank {comm.rank} {alg}: {exc}")
    for alg in ("shm", "shm+numpy", "hierarchical"):
        send, recv = np.full((4, 4), comm.rank + 1, np.float32), np.zeros((4, 4), np.float32)
        algorithms.bind(comm, "allreduce", alg, send, recv, total, 0)()
        if not (recv == comm.size * (comm.size + 1) / 2).all():
            failures.append(f"rank {comm.rank} {alg}: 2-D buffers gave {recv.ravel()[:4]}")
    # the pipelined form says what ran: its chunk, and from PIPE_PHASES_BYTES each rank's phases
    send = np.ones(shm.PIPE_PHASES_BYTES // 4, np.float32)
    call = algorithms.bind(comm, "allreduce", "shm", send, np.zeros_like(send), total, 0)
    call()
    call()
    said = call.facts() if hasattr(call, "facts") else {}
    if shm.pipelines(algorithms.kernel("shm", total, send.dtype)):
        phases = said.get("shm_phases_us", {}).get(str(comm.rank), {})
        if said.get("shm_chunk") != shm.pipe_chunk(comm.size, send.nbytes) or \
                sorted(phases) != sorted(shm.PIPE_PHASES) or min(phases.values()) < 0:
            failures.append(f"rank {comm.rank} shm's facts: {said}")
    elif said:
        failures.append(f"rank {comm.rank} shm's staged form said {said}")
    del call
    spin_checks(comm, failures)
    mapped_checks(comm, failures)
    if comm.size >= 3:
        import os
        os.environ["DDLCOMM_NODE"] = f"n{comm.rank}"            # a node per rank
        vals = [-6.0, -5.0, 11.0] + [0.0] * (comm.size - 3)      # the sum cancels
        for dt in (np.float16, np.float32, np.float64):
            send, recv = np.full(8, vals[comm.rank], dt), np.ones(8, dt)
            algorithms.bind(comm, "allreduce", "hierarchical", send, recv, avg, 0)()
            if (recv != 0).any():
                failures.append(f"rank {comm.rank} hierarchical avg {np.dtype(dt).name} "
                                f"of a cancelling sum: {recv[0]!r}")
        del os.environ["DDLCOMM_NODE"]


def spin_checks(comm, failures) -> None:
    """The compiled engines spin while the node's ranks have CPUs enough together, as their
    affinities say: ranks bound to a CPU each still spin, ranks bound to one CPU do not."""
    import os
    from ddlcomm.comm import algorithms, nodes
    send = np.ones(1024, np.float32)
    if not shm.pipelines(algorithms.kernel("shm", OPS["sum"], send.dtype)):
        return
    mine = os.sched_getaffinity(0)
    cpus = sorted(set().union(*comm.allgather_object(sorted(mine))))
    together = nodes.SPIN_US if comm.size == 1 else 0.0             # one CPU for all the ranks
    pins = [([cpus[0]], together)] + ([([cpus[comm.rank]], nodes.SPIN_US)] if len(cpus) >= comm.size else [])
    try:
        for pin, want in pins:
            os.sched_setaffinity(0, pin)
            for alg in ("shm", "shm-map") if shm_mapped.runs(algorithms.kernel("shm-map", OPS["sum"], send.dtype)) \
                    else ("shm",):
                call = algorithms.bind(comm, "allreduce", alg, send, np.zeros_like(send), OPS["sum"], 0)
                call()
                if call.facts().get("shm_spin_us") != want:
                    failures.append(f"rank {comm.rank} {alg} bound to CPUs {pin}: {call.facts()}")
                del call
    finally:
        os.sched_setaffinity(0, mine)


def mapped_checks(comm, failures) -> None:
    """shm-map says what it mapped, its pages are private again once it is gone, and a rank
    whose buffer cannot move (locked) makes every rank refuse, naming that rank."""
    import ctypes
    import gc
    from ddlcomm.comm import algorithms
    from ddlcomm.errors import EveryRankError
    from ddlcomm.memory import remap
    total = OPS["sum"]
    if not shm_mapped.runs(algorithms.kernel("shm-map", total, np.float32)):
        return
    send = np.full(1 << 16, comm.rank + 1, np.float32)
    recv = np.zeros_like(send)
    call = algorithms.bind(comm, "allreduce", "shm-map", send, recv, total, 0)
    call()
    said = call.facts()
    if not (recv == comm.size * (comm.size + 1) / 2).all() or not said["shm_moved_pages"] or \
            said["shm_mapped_bytes"] < send.nbytes - 2 * 4096:
        failures.append(f"rank {comm.rank} shm-map: {recv[:2]}, facts {said}")
    del call
    gc.collect()
    if remap._shared:
        failures.append(f"rank {comm.rank} shm-map: pages still shared after the call is gone")
    buf = memory.allocate("pageable", 1 << 16)
    locked = comm.rank == comm.size - 1 and ctypes.CDLL(None).mlock(ctypes.c_void_p(buf.address),
                                                                     ctypes.c_size_t(1 << 16)) == 0
    if any(comm.allgather_object(locked)):
        x = buf.array(np.float32, (1 << 16) // 4)
        try:
            algorithms.bind(comm, "allreduce", "shm-map", x, x, total, 0)
            failures.append(f"rank {comm.rank} shm-map took a locked buffer")
        except EveryRankError as exc:
            if f"rank {comm.size - 1}: " not in str(exc) or "locked" not in str(exc) or str(exc).count("(use") != 1:
                failures.append(f"rank {comm.rank} shm-map's refusal: {exc}")
    buf.free()


def every_rank_refuses(comm, failures: list, what: str, call, words: str) -> None:
    """``call()`` must raise EveryRankError saying ``words``, on this rank as on every other."""
    from ddlcomm.errors import EveryRankError
    try:
        call()
        failures.append(f"rank {comm.rank}: {what}: not refused")
    except EveryRankError as exc:
        if words not in str(exc):
            failures.append(f"rank {comm.rank}: {what}: {exc}")


def failure_checks(comm, failures) -> None:
    """Set-up that fails on some ranks fails on every rank alike, and leaves none waiting:
    a segment too large for /dev/shm (its leader fails), another count on one rank, buffers
    a live shm-map call holds, and another rank's buffer whose segment is gone from
    /dev/shm (those that map it fail).  The ranks then go on."""
    import gc
    import os
    from ddlcomm.comm import algorithms, nodes
    from ddlcomm.memory.shared import SHM_DIR, segment_of
    every_rank_refuses(comm, failures, "a 1 PiB node segment", lambda: nodes.node_segment(comm, 0, 1 << 50),
                       "rank 0: /dev/shm cannot hold")
    total = OPS["sum"]
    if comm.size > 1:
        # another count on the last rank: rank 0 sized the segment by its own, and the last
        # rank's engine refused it alone, rank 0 left asleep in the first call
        n = 2048 if comm.rank == comm.size - 1 else 1024
        for alg in ("shm", "shm@64KiB", "ring"):
            every_rank_refuses(comm, failures, f"{alg} with another count on the last rank",
                               lambda: algorithms.bind(comm, "allreduce", alg, np.ones(n, np.float32),
                                                       np.zeros(n, np.float32), total, 0),
                               f"2048 float32 sum on ranks [{comm.size - 1}]")
    if comm.size == 1 or not shm_mapped.runs(algorithms.kernel("shm-map", total, np.float32)):
        return
    # the same buffers bound again while the first bound call lives: its segment's name is
    # gone (the others failed to attach it: "no shared-memory segment"); said as such
    a, b = np.ones(1 << 16, np.float32), np.zeros(1 << 16, np.float32)
    first = algorithms.bind(comm, "allreduce", "shm-map", a, b, total, 0)
    every_rank_refuses(comm, failures, "shm-map on buffers bound already",
                       lambda: algorithms.bind(comm, "allreduce", "shm-map", a, b, total, 0),
                       "bound by another live shm-map call")
    first()
    if not (b == comm.size).all():
        failures.append(f"rank {comm.rank}: the first shm-map call after the refusal gave {b[:4]}")
    del first                               # its pages go back to private memory
    gc.collect()
    bufs = [memory.allocate("shared", 4096) for _ in range(2)]
    send, recv = (b.array(np.float32, 1024) for b in bufs)
    send[:] = comm.rank + 1
    names = comm.allgather_object(segment_of(send)[0])
    if comm.rank == comm.size - 1:
        os.unlink(os.path.join(SHM_DIR, names[0]))          # rank 0's send buffer's name is gone
    comm.barrier()
    every_rank_refuses(comm, failures, "shm-map without rank 0's segment",
                       lambda: algorithms.bind(comm, "allreduce", "shm-map", send, recv, total, 0),
                       "rank 1: no shared-memory segment")
    for b in bufs:
        b.free()
    check = np.full(4, comm.rank + 1, np.float32)
    comm.allreduce(check, check, op="sum")                  # nobody was left waiting
    if not (check == comm.size * (comm.size + 1) / 2).all():
        failures.append(f"rank {comm.rank}: the library's all-reduce after the refusals gave {check}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--thin", action="store_true", help=THIN_HELP)
    args = parser.parse_args()
    comm = ddlcomm.init(args.backend)
    return guarded(comm, lambda: run_suite(comm, args.thin))


def run_suite(comm, thin: bool) -> int:
    failures, held = [], []
    for label, call, send, mine, recv, want, dt in cases(comm, held, thin):
        for attempt in (1, 2):              # the second call reuses the segment
            send[:] = mine                  # (in place, the first call overwrote it)
            if recv is not send:
                recv[:] = 0                 # the second call must write its result again
            call()
            if not close(recv, want, dt):
                failures.append(f"rank {comm.rank} {label} (call {attempt})")
        del call
    bound_checks(comm, failures)
    failure_checks(comm, failures)
    assert shm.slices(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert hierarchical.node_groups(["a", "b", "a", "b", "c"]) == [[0, 2], [1, 3], [4]]
    comm.barrier()
    for buf in held:
        buf.free()
    return conclude(comm, failures, lambda n, _: f"shm: {comm.size} ranks, {n} failures")


if __name__ == "__main__":
    sys.exit(main())
