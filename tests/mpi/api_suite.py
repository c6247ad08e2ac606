"""Rank-side check of the API's behaviour when one rank's call is refused or fails.

Run under a launcher (``mpirun -n N python api_suite.py [--backend NAME]``), N >= 2.  Each
case was found broken: a refusal only the root could make (its receive buffer), or any
rank's refusal of its own buffer, left the others in the collective, whose message its next call then matched (stale data, or a
hang on gloo); an object a rank could not pickle, or objects the root could not fold,
left the other ranks waiting; an int array's object average was truncated; closing one
gloo communicator ended another; ``with`` did not take a communicator; a bound call refused on
one rank, or bound to different messages, left the others waiting in its first call.
"""
from __future__ import annotations

import numpy as np

import ddlcomm
from ddlcomm.errors import UsageError

from suite_kit import conclude, guarded


def expect_refusal(call, words: str) -> str:
    try:
        call()
    except UsageError as exc:
        return "" if words in str(exc) else f"refused with {exc}"
    return "not refused"


def run_cases(comm, backend: str) -> list[str]:
    r, p = comm.rank, comm.size
    failures = []

    def check(name, problem):
        if problem:
            failures.append(f"rank {r}: {name}: {problem}")

    mine = np.full(4, r + 1.0, np.float32)
    wrong = np.empty(3, np.float32)
    for root in (0, p - 1):
        if r == root:
            check("gather refused at the root", expect_refusal(
                lambda: comm.gather(mine, wrong, root=root), "needs"))
            check("reduce refused at the root", expect_refusal(
                lambda: comm.reduce(mine, wrong, root=root), "needs"))
        else:
            comm.gather(mine, root=root)
            comm.reduce(mine, root=root)
        got = comm.gather(mine, root=root)            # the next call: this call's data
        if r == root and not np.array_equal(got, np.repeat(np.arange(1, p + 1.0), 4)):
            check("gather after a refusal", f"got {got}")
    # one rank's own buffer refused (no other rank can see it): it takes part with scratch
    # memory, so the others are neither left waiting nor matched by its next call
    ro = np.full(4, 2.0)
    ro.setflags(write=False)
    one = {
        "allreduce, receive buffer of 3": (lambda: comm.allreduce(np.ones(4), np.empty(3) if r == 1 else None),
            'needs 4 elements, got 3'),
        "allreduce, read-only receive buffer": (lambda: comm.allreduce(np.ones(4), ro if r == 1 else None),
            'read-only'),
        "iallreduce, receive buffer of 3": (lambda: comm.iallreduce(np.ones(4), np.empty(3) if r == 1 else None).wait(),
            'needs 4 elements, got 3'),
        "allgather, receive buffer of 3": (lambda: comm.allgather(np.ones(4), np.empty(3) if r == 1 else None),
            'got 3'),
        "alltoall, receive buffer of 3": (lambda: comm.alltoall(np.ones(2 * p), np.empty(3) if r == 1 else None),
            'got 3'),
        # (accepted, and handed to the library aliased: MPICH refused it, others may corrupt)
        "alltoall, its send buffer as receive buffer": (lambda: (
            lambda x: comm.alltoall(x, x if r == 1 else None))(np.ones(2 * p)),
            'is its send buffer'),
        "reduce_scatter, receive buffer of 3": (lambda: comm.reduce_scatter(np.ones(2 * p), np.empty(3) if r == 1 else None),
            'needs 2 elements, got 3'),
        "broadcast, read-only buffer off the root": (lambda: comm.broadcast(ro if r == 1 else np.full(4, 7.0)),
            'read-only'),
        "broadcast, strided buffer off the root": (lambda: comm.broadcast(np.zeros(8)[::2] if r == 1 else np.full(4, 7.0)),
            'C-contiguous'),
        "gather, strided send buffer at the root": (lambda: comm.gather(np.full(8, 5.0)[::2] if r == 0 else np.full(4, 5.0)),
            'C-contiguous'),
    }
    for name, (call, reason) in one.items():
        if (r == 0) if name.startswith("gather") else (r == 1):
            check(name, expect_refusal(call, reason))
        else:
            call()
        after = comm.allreduce(np.full(3, 1.0 + r))
        if not np.allclose(after, p * (p + 1) / 2):
            check(f"{name}: the next all-reduce", f"got {after}")
    # rank 1's send buffer refused for its layout: it takes part from a contiguous copy, so
    # the others' results are whole
    strided = np.ones(2 * 2 * p)[::2]                  # 2p ones, not contiguous
    sent = {
        "allreduce": (lambda b: comm.allreduce(b), np.full(2 * p, float(p))),
        "iallreduce": (lambda b: comm.iallreduce(b).wait(), np.full(2 * p, float(p))),
        "allgather": (lambda b: comm.allgather(b), np.ones(2 * p * p)),
        "alltoall": (lambda b: comm.alltoall(b), np.ones(2 * p)),
        "reduce_scatter": (lambda b: comm.reduce_scatter(b), np.full(2, float(p))),
        "reduce to rank 0": (lambda b: comm.reduce(b, root=0), np.full(2 * p, float(p))),
        "gather at rank 0": (lambda b: comm.gather(b, root=0), np.ones(2 * p * p)),
        "broadcast from rank 1": (lambda b: comm.broadcast(b if r == 1 else np.zeros(2 * p), root=1),
                                  np.ones(2 * p)),
    }
    for name, (call, want) in sent.items():
        if r == 1:
            check(f"{name}, strided send buffer on rank 1", expect_refusal(lambda: call(strided), "contiguous"))
            continue
        got = call(np.ones(2 * p))
        if got is None and (r == 0 or not name.startswith(("reduce to", "gather at"))):
            check(f"{name}, strided send buffer on rank 1: rank {r}'s result", "got None")
        elif got is not None and not np.array_equal(got, want):
            check(f"{name}, strided send buffer on rank 1: the others' result", f"got {got}")
    # bind is agreed: one rank's refusal, or ranks binding different messages, raise on every
    # rank (a rank refusing alone left the others in the first call)
    bound = {
        "bind, read-only receive buffer on rank 1": (
            lambda: comm.bind("allreduce", np.ones(4), ro if r == 1 else np.empty(4)),
            "bind allreduce: rank 1: allreduce's receive buffer is read-only"),
        "bind, a count of its own on the last rank": (
            lambda: (lambda n: comm.bind("allreduce", np.ones(n), np.empty(n)))(3 if r == p - 1 else 4),
            f"needs one message on every rank: 4 float64 sum on ranks {list(range(p - 1))}; "
            f"3 float64 sum on ranks [{p - 1}]"),
        "bind, a root of its own on rank 0": (
            lambda: comm.bind("broadcast", np.ones(4), root=1 if r == 0 else 0),
            "4 float64 root 1 on ranks [0]"),
    }
    for name, (call, words) in bound.items():
        check(name, expect_refusal(call, words))
        after = comm.allreduce(np.full(3, 1.0 + r))
        if not np.allclose(after, p * (p + 1) / 2):
            check(f"{name}: the next all-reduce", f"got {after}")
    got = comm.broadcast(ro if r == 0 else np.zeros(4))          # the root only reads it
    if not (got == 2.0).all():
        check("broadcast of a read-only buffer at the root", f"got {got}")
    # a read-only receive buffer: refused after the message was taken into scratch memory,
    # so the sender is not left waiting and the next receive gets the next message (Gloo
    # wrote into the read-only memory; MPI raised its own error, the message left unmatched)
    big = np.full(1 << 16, 3.0)                         # past the eager limits: a send waits
    frozen = np.zeros(1 << 16)
    frozen.setflags(write=False)
    if r == 0:
        comm.send(big, 1, tag=7)
        comm.send(big * 2, 1, tag=7)
    elif r == 1:
        check("recv into a read-only buffer", expect_refusal(lambda: comm.recv(frozen, 0, tag=7), "read-only"))
        got = comm.recv(np.zeros(1 << 16), 0, tag=7)
        if not (got == 6.0).all():
            check("recv into a read-only buffer: the next receive", f"got {got[:3]}")
    if r == 0:
        comm.send(big * 3, 1, tag=7)
    elif r == 1:
        pending = comm.irecv(frozen, 0, tag=7)           # taken into scratch; wait() refuses
        check("irecv into a read-only buffer", expect_refusal(pending.wait, "read-only"))
        comm.send(big, 0, tag=12)
    if r == 0 and p > 1:
        check("recv_any into a read-only buffer", expect_refusal(
            lambda: comm.recv_any(frozen, tag=12), "read-only (rank 1's message was received"))
    right, left = (r + 1) % p, (r - 1) % p
    check("sendrecv into a read-only buffer on rank 0", expect_refusal(
        lambda: comm.sendrecv(big, right, frozen, left, tag=8), "read-only") if r == 0 else
        ("" if (comm.sendrecv(big, right, np.zeros(1 << 16), left, tag=8) == 3.0).all() else "wrong data"))
    lam = lambda: 1                                    # noqa: E731 - cannot be pickled
    check("broadcast_object of a lambda", expect_refusal(
        lambda: comm.broadcast_object(lam if r == 0 else None), "rank 0 could not pickle"))
    check("gather_object of a lambda", expect_refusal(
        lambda: comm.gather_object(lam if r == p - 1 else r), f"rank {p - 1} could not pickle"))
    check("allreduce_object of dicts", expect_refusal(
        lambda: comm.allreduce_object({"a": r}), "could not sum"))
    # what only rank 0 finds: an object it cannot unpickle (a class defined on one rank
    # only), objects it cannot combine; reduce_object's root and reduce_scatter_object's
    # ranks say so as DdlcommError (a bare TypeError before)
    if r == p - 1:
        globals()["OnlyHere"] = type("OnlyHere", (), {"__module__": __name__})
    check("allreduce_object of an object rank 0 cannot unpickle", expect_refusal(
        lambda: comm.allreduce_object(globals()["OnlyHere"]() if r == p - 1 else r),
        f"rank {p - 1}'s object could not be unpickled at rank 0"))
    # the ranks that receive it say so too, in one line (an AttributeError's traceback before)
    if p > 1:
        if r == p - 1:
            comm.broadcast_object(globals()["OnlyHere"](), p - 1)
            comm.send_object(globals()["OnlyHere"](), 0, tag=9)
        else:
            check("broadcast_object of an object the others cannot unpickle", expect_refusal(
                lambda: comm.broadcast_object(None, p - 1),
                f"rank {p - 1}'s object could not be unpickled at rank {r}"))
        if r == 0:
            check("recv_object of an object this rank cannot unpickle", expect_refusal(
                lambda: comm.recv_object(p - 1, tag=9), f"rank {p - 1}'s object could not be unpickled at rank 0"))
    if r == 0:
        check("reduce_object of a str and ints", expect_refusal(
            lambda: comm.reduce_object("x" if r == p - 1 else r), "reduce_object could not sum"))
    else:
        comm.reduce_object("x" if r == p - 1 else r)
    check("reduce_scatter_object of a str and ints", expect_refusal(
        lambda: comm.reduce_scatter_object(["x" if r == p - 1 else q for q in range(p)]),
        "reduce_scatter_object could not sum"))
    avg = comm.allreduce_object(np.array([r + 1]), op="avg")
    if not np.allclose(avg, (p + 1) / 2):
        check("allreduce_object avg of int arrays", f"got {avg}")
    if comm.allreduce(np.ones(2, np.float32))[0] != p:
        check("a call after the refusals", "wrong sum")
    with ddlcomm.init(backend) as second:
        second.barrier()
    if comm.allreduce(np.ones(2, np.float32))[0] != p:
        check("closing a second communicator", "ended the first")
    # a closed one refuses, in one line (MPI: AttributeError on None; Gloo ran on the first's group)
    check("a call on a closed communicator", expect_refusal(lambda: second.allreduce(np.ones(2)), "is closed"))
    return failures


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi")
    backend = parser.parse_args().backend
    comm = ddlcomm.init(backend)
    failures = guarded(comm, lambda: run_cases(comm, backend))
    return conclude(comm, failures, lambda n, _: f"{comm.name}: api {comm.size} ranks, "
                                                 f"{n} failures")


if __name__ == "__main__":
    raise SystemExit(main())
