"""Rank-side check of the API's behaviour when one rank's call is refused or fails.

Run under a launcher (``mpirun -n N python api_suite.py [--backend NAME]``), N >= 2.  Each
case was found broken: a refusal only the root could make (its receive buffer) left the
others in the collective, whose message its next call then matched (stale data, or a
hang on gloo); an object a rank could not pickle, or objects the root could not fold,
left the other ranks waiting; an int array's object average was truncated; closing one
gloo communicator ended another; ``with`` did not take a communicator.
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
    lam = lambda: 1                                    # noqa: E731 - cannot be pickled
    check("broadcast_object of a lambda", expect_refusal(
        lambda: comm.broadcast_object(lam if r == 0 else None), "rank 0 could not pickle"))
    check("gather_object of a lambda", expect_refusal(
        lambda: comm.gather_object(lam if r == p - 1 else r), f"rank {p - 1} could not pickle"))
    check("allreduce_object of dicts", expect_refusal(
        lambda: comm.allreduce_object({"a": r}), "could not sum"))
    avg = comm.allreduce_object(np.array([r + 1]), op="avg")
    if not np.allclose(avg, (p + 1) / 2):
        check("allreduce_object avg of int arrays", f"got {avg}")
    if comm.allreduce(np.ones(2, np.float32))[0] != p:
        check("a call after the refusals", "wrong sum")
    if backend == "gloo":
        with ddlcomm.init(backend) as second:
            second.barrier()
        if comm.allreduce(np.ones(2, np.float32))[0] != p:
            check("closing a second gloo communicator", "ended the first")
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
