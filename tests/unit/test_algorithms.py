"""--algorithm names: kernel suffixes, checks, auto with a suffix, and the x_add column."""
import numpy as np
import pytest

from ddlcomm.comm import shm
from ddlcomm.comm.algorithms import (RING_MIN_BYTES, SHARED_MEMORY, SHM_MIN_BYTES, check, choose_auto,
                                     decide, kernel, names, split)
from ddlcomm.dtypes import get_op
from ddlcomm.errors import UsageError
from ddlcomm.kernels import describe


def test_split_and_decide_keep_the_kernel():
    assert split("ring") == ("ring", "auto")
    assert split("ring+numpy") == ("ring", "numpy")
    assert decide("allreduce", "auto+numpy", RING_MIN_BYTES)[0] == "ring+numpy"
    assert decide("allreduce", "auto", 4)[0] == "library"
    assert decide("allreduce", "rhd+c", 4)[0] == "rhd+c"


def test_auto_rule_by_size_and_rank_count():
    assert choose_auto("allreduce", RING_MIN_BYTES - 1, 4) == "library"
    assert choose_auto("allreduce", RING_MIN_BYTES, 1) == "library"      # nothing to reduce
    assert choose_auto("broadcast", 1 << 30, 8) == "library"
    # Same bytes on powers of two, fewer rounds for rhd; a tie at 2 ranks goes to the ring;
    # elsewhere rhd's fold moves 2n more bytes.
    assert [choose_auto("allreduce", 64 << 20, p) for p in (2, 3, 4, 5, 8)] == \
        ["ring", "ring", "rhd", "ring", "rhd"]
    assert decide("allreduce", "auto", 64 << 20, 4)[0] == "rhd"
    assert "shm" not in names("gather")


def test_auto_on_one_node_is_the_pipelined_shm_from_its_threshold():
    for p in (2, 8, 16):
        assert choose_auto("allreduce", SHM_MIN_BYTES, p, pipelined_shm=True) == "shm"
        assert choose_auto("allreduce", SHM_MIN_BYTES - 1, p, pipelined_shm=True) == "library"
    assert choose_auto("allreduce", 1 << 30, 1, pipelined_shm=True) == "library"
    assert choose_auto("broadcast", 1 << 30, 4, pipelined_shm=True) == "library"
    built = shm._shmpipe is not None
    assert decide("allreduce", "auto", 1 << 20, 4, one_node=True)[0] == ("shm" if built else "rhd")
    assert decide("allreduce", "auto+numpy", 1 << 20, 4, one_node=True)[0] == "rhd+numpy"   # staged shm: no
    assert decide("allreduce", "auto", 1 << 20, 4, one_node=False)[0] == "rhd"


def test_auto_over_gloo_runs_shm_at_every_size_on_one_node():
    """Gloo's own all-reduce takes hundreds of µs even at 4 B: shm wins from the first byte;
    the MPI libraries' 1-2 µs keep theirs below the threshold."""
    for library in ("Gloo", "gloo"):
        assert choose_auto("allreduce", 4, 4, pipelined_shm=True, library=library) == "shm"
    assert choose_auto("allreduce", 4, 4, pipelined_shm=True, library="Open MPI") == "library"
    assert choose_auto("allreduce", 4, 4, pipelined_shm=False, library="Gloo") == "library"
    built = shm._shmpipe is not None
    assert decide("allreduce", "auto", 4, 2, one_node=True, library="Gloo")[0] == \
        ("shm" if built else "library")
    assert decide("allreduce", "auto", 4, 2, one_node=True, library="MPICH")[0] == "library"
    # device tensors: the device shm meets through the backend's barriers, so the threshold stays
    assert decide("allreduce", "auto", 4, 2, one_node=True, library="Gloo", on_device=True)[0] == \
        "library"


def test_auto_on_device_runs_shm_only_with_every_rank_on_one_gpu():
    """auto on device buffers took shm wherever the ranks shared a node: with a GPU per rank
    (the usual node) the device shm refused at the first point from 4 KiB; auto+torch built
    a host reducer of kernel torch to ask whether shm pipelines, and failed there."""
    assert decide("allreduce", "auto", 1 << 20, 4, one_node=True, on_device=True)[0] == "rhd"
    assert decide("allreduce", "auto", 1 << 20, 4, one_node=True, on_device=True, one_device=True)[0] == "shm"
    assert decide("allreduce", "auto+torch", 1 << 20, 4, one_node=True, on_device=True,
                  one_device=True)[0] == "shm+torch"
    assert decide("allreduce", "auto+cupy", 1 << 20, 4, one_node=True, on_device=True)[0] == "rhd+cupy"


def test_auto_over_a_backend_without_host_messages_is_the_library_or_the_device_shm():
    """Over NCCL auto chose ring or rhd from 1 MiB with a GPU per rank: their transports
    hand the backend host headers, which NCCL refused at the point's first call."""
    def over_nccl(nbytes, one_device, tuning=None):
        return decide("allreduce", "auto", nbytes, 4, one_node=True, on_device=True,
                      one_device=one_device, host_messages=False, tuning=tuning, library="NCCL")[0]
    assert over_nccl(1 << 20, one_device=False) == "library"
    assert over_nccl(1 << 20, one_device=True) == "shm"
    assert over_nccl(4, one_device=True) == "library"

    class Table:
        def choose(self, *_):
            return "ring"
    assert over_nccl(1 << 20, one_device=False, tuning=Table()) == "library"


def test_shared_memory_algorithms_are_allreduce_names():
    assert {name for _, name in SHARED_MEMORY} == {"shm", "shm-map", "hierarchical"} <= set(names("allreduce"))
    assert "hierarchical" not in names("broadcast")


@pytest.mark.parametrize("collective, algorithm, message", [
    ("allreduce", "tree", "no algorithm tree for allreduce"),
    ("allreduce", "ring+avx", "unknown reduction kernel 'avx' in ring+avx"),
    ("allreduce", "library+numpy", "library+numpy: a reduction kernel applies to ddlcomm's own"),
    ("broadcast", "binomial+c", "binomial+c: a reduction kernel applies"),
    ("allreduce", "shm-map+numpy", "shm-map+numpy: shm-map reduces with the compiled kernel only"),
])
def test_bad_names_are_refused(collective, algorithm, message):
    with pytest.raises(UsageError) as err:
        check(collective, algorithm)
    assert str(err.value).startswith(message)


def test_kernel_per_name():
    op = get_op("avg")
    assert describe(kernel("ring+numpy", op, np.float32)) == "NumPy"
    assert kernel("library", op, np.float32) is None
    assert kernel("ring", None, np.float32) is None        # broadcast, gather: nothing reduced
    a, b, out = np.ones(5, np.float32), np.full(5, 2, np.float32), np.zeros(5, np.float32)
    kernel("ring", op, np.float32)(a, b, out)                # avg folds by sum; finish divides
    assert out.tolist() == [3.0] * 5


def test_points_table_shows_time_over_one_reduction_pass():
    from ddlcomm.report.tables import points_table, varying_dimensions
    points = [dict(collective="allreduce", bytes=1 << 20, count=1 << 18, algorithm=a, form="buffer",
                   t_p50_us=t, t_avg_us=t, check="passed", extra={"add_us": 100.0 + i})
              for i, (a, t) in enumerate((("library", 300.0), ("ring", 150.0)))]
    assert varying_dimensions(points) == ["algorithm"]      # add_us is a measurement, not a series
    headers, rows = points_table(points)
    col = headers.index("x_add")
    assert [r[col] for r in rows] == ["3.00x", "1.49x"]
    headers, _ = points_table([{**points[0], "extra": {}}])
    assert "x_add" not in headers


def test_points_table_shows_device_points_over_the_gpu_memory_floor():
    from ddlcomm.report.tables import points_table, varying_dimensions
    points = [dict(collective="allreduce", bytes=1 << 20, count=1 << 18, algorithm=a, form="buffer",
                   t_p50_us=t, t_avg_us=t, check="passed", extra={"floor_us": 50.0})
              for a, t in (("library", 300.0), ("shm", 100.0))]
    assert varying_dimensions(points) == ["algorithm"]      # floor_us is a measurement too
    headers, rows = points_table(points)
    assert "x_add" not in headers and [r[headers.index("x_floor")] for r in rows] == ["6.00x", "2.00x"]


def test_points_table_shows_what_a_device_calls_kind_look_ups_cost():
    from ddlcomm.report.tables import points_table, varying_dimensions
    priced = {"kind_lookups": 40, "kind_lookups_per_call": 2.0, "kind_lookup_us": 1.5}
    points = [dict(collective="allreduce", bytes=4096, count=1024, algorithm=a, form="buffer",
                   t_p50_us=900.0, t_avg_us=900.0, check="passed",
                   extra={**priced, "kind_lookup_us_per_call": us})
              for a, us in (("ring", 3.0), ("rhd", 4.5))]
    assert varying_dimensions(points) == ["algorithm"]      # the prices are measurements
    headers, rows = points_table(points)
    assert [r[headers.index("lookup_us")] for r in rows] == ["4.50", "3.00"]


def test_group_renumbers_and_checks_members():
    from types import SimpleNamespace

    from ddlcomm.comm.group import Group
    sent = []
    parent = SimpleNamespace(rank=3, size=5, _send=lambda buf, dest, tag: sent.append(dest))
    g = Group(parent, [1, 3, 4])
    assert (g.rank, g.size) == (1, 3)
    g._send(np.zeros(1), 2, 0)
    assert sent == [4]                                   # group rank 2 is parent rank 4
    with pytest.raises(UsageError, match="not in the group"):
        Group(parent, [0, 1])
    with pytest.raises(UsageError, match="distinct"):
        Group(parent, [3, 3])
    with pytest.raises(UsageError, match="distinct"):
        Group(parent, [3, 7])


def test_the_device_floor_is_the_slowest_ranks_pass():
    """Ranks sharing a GPU take turns on it: the pass of the last one served holds all k copies
    (2·k·n bytes), so the device floor takes the slowest rank per pass, not the fastest."""
    import numpy as np
    from ddlcomm.measure import timing

    class TwoRanks:                       # this rank copies alone first; the other waited its turn
        def barrier(self):
            pass

        def allreduce(self, send, recv, op):
            other = np.full_like(send, 2e-3) if send.size > 1 else np.array([0.0])
            recv[...] = {"max": np.maximum, "min": np.minimum}[op](send, other)
    comm = TwoRanks()
    a, b = np.zeros(4), np.zeros(4)
    fast = timing.pass_us(comm, lambda a, b, out: None, a, b, 0.0)
    slow = timing.pass_us(comm, lambda a, b, out: None, a, b, 0.0, slowest=True)
    assert fast < 1e3 and slow == 2e3


def test_one_measurement_is_named_once():
    """ring@1MiB beside ring measured the same thing twice (1 MiB is its default piece)."""
    from ddlcomm.comm.algorithms import check_distinct
    for twice in (["ring@1MiB", "ring"], ["rhd+c", "rhd@1MiB+c"]):
        with pytest.raises(UsageError, match="one measurement twice"):
            check_distinct(twice)
    # other pieces, other kernels, and the shm (its piece follows the size) stay apart
    check_distinct(["ring@512KiB", "ring", "rhd", "rhd+numpy", "shm@512KiB", "shm", "library"])
