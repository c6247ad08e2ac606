"""The C timing loop inside ddlcomm ranks (``CReference``): results, refusals, first-use build.

A rank script (written to tmp_path) starts ``ddlcomm.init("mpi")``, loads the
C reference library into the rank (built on first use into an empty cache, so
every rank meets the build at once), fills NumPy buffers the way the harness
does (a failed build raises on every rank), times broadcast, gather and all-reduce at 4 B and 1 MiB in several
dtypes and roots, and checks what the last call left in the buffers: the
all-reduce output is the sum of every rank's input, the gather root holds
every rank's input in rank order, the broadcast buffer the root's data.  It
also checks the refusals, which are raised before any communication.  A
failing rank aborts the job, so nothing hangs.  Runs at 2 and 3 ranks under
both MPIs.
"""
from __future__ import annotations

import re
import textwrap

import pytest

pytestmark = pytest.mark.mpi

RANK_SCRIPT = textwrap.dedent('''
    import sys
    import traceback

    import numpy as np

    import ddlcomm
    from ddlcomm.bench.cref import CReference
    from ddlcomm.errors import BackendUnavailable, RankFailure, UnsupportedError, UsageError

    # bytes per rank -> dtypes (at 4 B the 8-byte ones have count 0); few 1 MiB cases, as
    # oversubscribed ranks (3 on 2 cores) make each 1 MiB call slow
    CASES = {4: (np.float32, np.int32, np.float64, np.int64, np.uint8),
             1 << 20: (np.float32, np.int64)}
    ITERS, WARMUP = 3, 1


    def values(count, rank, dtype):
        """Small, rank-dependent integers: sums are exact in every dtype."""
        return (1 + ((np.arange(count) % 11) + 3 * rank) % 23).astype(dtype)


    def expect_error(kind, match, fn, *args):
        try:
            fn(*args)
        except kind as exc:
            assert match in str(exc), f"{match!r} not in {str(exc)!r}"
            return
        raise AssertionError(f"no {kind.__name__} ({match!r})")


    def check_times(t):
        assert t.shape == (ITERS,) and t.dtype == np.float64, t
        assert np.all(np.isfinite(t)) and np.all(t >= 0), t   # count 0 may take no tick


    def main(comm):
        rank, p = comm.rank, comm.size
        # A build that fails on the building rank raises on every rank (none waits forever).
        try:
            CReference(comm, mpicc="/no/such/mpicc")
        except (BackendUnavailable, RankFailure) as exc:
            assert "not found" in str(exc) or "rank(s) failed building" in str(exc), exc
        else:
            raise AssertionError("a failed build was not reported")
        c = CReference(comm)
        assert c.collectives == ("broadcast", "gather", "allreduce")
        assert c.path.name == "libddlcomm_cref.so" and c.path.is_file()
        cases = 0
        for nbytes, dtypes in CASES.items():
            for dtype in dtypes:
                count = nbytes // np.dtype(dtype).itemsize
                inputs = [values(count, r, dtype) for r in range(p)]
                for root in sorted({0, p - 1}):
                    # broadcast, in place: only the root's data may arrive
                    buf = inputs[rank].copy()
                    if rank != root:
                        buf = np.empty(count, dtype)
                        buf.view(np.uint8)[:] = 0xFF
                    check_times(c.time("broadcast", buf, None, root, ITERS, WARMUP))
                    assert np.array_equal(buf, inputs[root]), ("broadcast", nbytes, dtype, root)

                    send = inputs[rank].copy()
                    recv = None
                    if rank == root:
                        recv = np.empty(count * p, dtype)
                        recv.view(np.uint8)[:] = 0xFF
                    check_times(c.time("gather", send, recv, root, ITERS, WARMUP))
                    if rank == root:
                        assert np.array_equal(recv, np.concatenate(inputs)), ("gather", nbytes, dtype, root)
                    assert np.array_equal(send, inputs[rank])
                    cases += 2

                send = inputs[rank].copy()
                recv = np.empty(count, dtype)
                recv.view(np.uint8)[:] = 0xFF
                check_times(c.time("allreduce", send, recv, 0, ITERS, WARMUP))
                want = np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(dtype)
                assert np.array_equal(recv, want), ("allreduce", nbytes, dtype)
                assert np.array_equal(send, inputs[rank])
                cases += 1

        # refusals: raised before any communication, the same on every rank
        x = np.ones(4, np.float32)
        y = np.zeros(4, np.float32)
        expect_error(UnsupportedError, "no collective 'reduce'", c.time, "reduce", x, y, 0, 1, 0)
        expect_error(UnsupportedError, "no dtype float16", c.time, "allreduce",
                     np.ones(4, np.float16), np.zeros(4, np.float16), 0, 1, 0)
        expect_error(UnsupportedError, "not in place", c.time, "allreduce", x, x, 0, 1, 0)
        expect_error(UsageError, "must hold 4 float32", c.time, "allreduce", x, y[:2], 0, 1, 0)
        expect_error(UsageError, "must hold 4 float32", c.time, "allreduce", x,
                     np.zeros(4, np.int32), 0, 1, 0)
        expect_error(UsageError, "C-contiguous", c.time, "allreduce", np.ones(8, np.float32)[::2],
                     y, 0, 1, 0)
        expect_error(UsageError, "iterations must be", c.time, "allreduce", x, y, 0, 0, 0)
        expect_error(UsageError, "not a rank", c.time, "gather", x, None, p, 1, 0)
        expect_error(UsageError, "in place", c.time, "broadcast", x, y, 0, 1, 0)
        comm.barrier()
        print(f"OK rank {rank} of {p}: {cases} cases", flush=True)


    comm = ddlcomm.init("mpi")
    try:
        main(comm)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        comm.abort(1)
    comm.close()
''')


@pytest.mark.parametrize("nranks", [2, 3])
def test_c_timing_loop_in_ranks(mpi, nranks, tmp_path):
    script = tmp_path / "cref_ranks.py"
    script.write_text(RANK_SCRIPT)
    # An empty cache: every rank meets the first-use build at once.
    res = mpi.mpirun(nranks, [mpi.python, script], timeout=300,
                     XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert res.returncode == 0, res.stdout + res.stderr
    # The launcher may join the ranks' lines: count the reports, not lines.
    ok = re.findall(r"OK rank (\d+) of (\d+): (\d+) cases", res.stdout)
    assert sorted(ok) == [(str(r), str(nranks), "35") for r in range(nranks)], res.stdout + res.stderr
    libs = list((tmp_path / "cache").rglob("libddlcomm_cref.so*"))
    assert [p.name for p in libs] == ["libddlcomm_cref.so"]      # one build, no leftovers
