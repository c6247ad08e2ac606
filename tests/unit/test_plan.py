"""Tests of the bench plan and its memory check (ddlcomm.bench.plan)."""
from __future__ import annotations

import pytest

from ddlcomm.bench.plan import (BenchPlan, PointSpec, check_memory, memory_needed, mem_available,
                                parse_forms)
from ddlcomm.collectives import COLLECTIVES
from ddlcomm.errors import UsageError

GiB = 1 << 30


def plan(**over) -> BenchPlan:
    kw = dict(backends=["mpi"], collectives=["broadcast", "gather"], sizes=[4, 8],
              dtype="float32", op="sum", forms=["buffer", "object"])
    kw.update(over)
    return BenchPlan(**kw)


def _keys(points):
    return [(p.name, p.nbytes, p.backend, p.form) for p in points]


def test_points_order_collective_then_size_then_backend_then_form():
    assert _keys(plan().points()) == [
        ("broadcast", 4, "mpi", "buffer"), ("broadcast", 4, "mpi", "object"),
        ("broadcast", 8, "mpi", "buffer"), ("broadcast", 8, "mpi", "object"),
        ("gather", 4, "mpi", "buffer"), ("gather", 4, "mpi", "object"),
        ("gather", 8, "mpi", "buffer"), ("gather", 8, "mpi", "object"),
    ]
    assert plan(forms=["buffer"], sizes=[]).points() == []


def test_backends_alternate_at_each_size():
    keys = _keys(plan(backends=["mpi", "gloo"], collectives=["allreduce"], forms=["buffer"]).points())
    assert keys == [("allreduce", 4, "mpi", "buffer"), ("allreduce", 4, "gloo", "buffer"),
                    ("allreduce", 8, "mpi", "buffer"), ("allreduce", 8, "gloo", "buffer")]


def test_barrier_is_measured_once_and_workloads_per_size():
    assert _keys(plan(collectives=["barrier"], forms=["buffer"]).points()) == [("barrier", 4, "mpi", "buffer")]
    points = plan(workloads=["ps-sync"], collectives=[], backends=["mpi", "gloo"]).points()
    assert all(p.kind == "workload" and p.form == "buffer" for p in points)
    assert _keys(points) == [("ps-sync", 4, "mpi", "buffer"), ("ps-sync", 4, "gloo", "buffer"),
                             ("ps-sync", 8, "mpi", "buffer"), ("ps-sync", 8, "gloo", "buffer")]
    both = plan(workloads=["ps-sync", "allreduce"], collectives=[], sizes=[4]).points()
    assert _keys(both) == [("ps-sync", 4, "mpi", "buffer"), ("allreduce", 4, "mpi", "buffer")]


def test_point_label_names_backend_only_when_asked():
    spec = PointSpec("collective", "allreduce", 1 << 20, "buffer", "gloo")
    assert spec.label(False) == "allreduce (buffer, 1MiB)"
    assert spec.label(True) == "allreduce (gloo, buffer, 1MiB)"


def test_as_config_is_a_plain_copy():
    config = plan(ranks=3).as_config()
    assert config["ranks"] == 3 and config["collectives"] == ["broadcast", "gather"]
    assert config["budget_s"] == 0.2 and config["extra"] == {}


@pytest.mark.parametrize("text, forms", [
    ("both", ["buffer", "object"]), ("buffer", ["buffer"]), ("object", ["object"]),
])
def test_parse_forms(text, forms):
    assert parse_forms(text) == forms


@pytest.mark.parametrize("text", ["", "Buffer", "buffers", "buffer,object"])
def test_parse_forms_errors(text):
    with pytest.raises(UsageError) as err:
        parse_forms(text)
    assert repr(text) in str(err.value) and "buffer, object or both" in str(err.value)


def test_memory_needed_grows_faster_than_ranks_for_gather():
    gather, bcast = COLLECTIVES["gather"], COLLECTIVES["broadcast"]
    need = [memory_needed(gather, GiB, p, False) for p in (1, 2, 4, 8)]
    assert need == sorted(set(need))
    assert need[3] / need[2] > 2 * 0.99                 # root holds p messages
    assert memory_needed(gather, GiB, 8, False) > memory_needed(bcast, GiB, 8, False)
    assert memory_needed(gather, GiB, 4, True) == 2 * memory_needed(gather, GiB, 4, False)
    assert memory_needed(COLLECTIVES["barrier"], GiB, 4, False) == 0      # it holds nothing


def test_check_memory_refuses_with_one_line():
    gather = COLLECTIVES["gather"]
    with pytest.raises(UsageError) as err:
        check_memory(gather, 64 * GiB, 4, False, available=16 * GiB)
    text = str(err.value)
    assert "\n" not in text
    assert "gather" in text and "64GiB" in text and "16GiB" in text and "4 ranks" in text
    assert "--sizes" in err.value.hint and "--ranks" in err.value.hint


def test_memory_needed_counts_every_receiver_of_an_allgather():
    """Every rank of an allgather holds p messages twice (128 MiB at 4 ranks peaked at about
    1.34 GiB a rank: the estimate had been 2.5 GiB in all); a gather's root alone does."""
    n, p = 128 << 20, 4
    assert memory_needed(COLLECTIVES["gather"], n, p, False) == 3 * p * n + 2 * p * n
    assert memory_needed(COLLECTIVES["allgather"], n, p, False) == 3 * p * n + 2 * p * p * n
    assert memory_needed(COLLECTIVES["allreduce"], n, p, False) == 3 * p * n + 2 * n


def test_check_memory_says_about_once():
    with pytest.raises(UsageError) as err:
        check_memory(COLLECTIVES["allreduce"], 100_000_000, 4, False, available=1 << 30)
    assert "about ~" not in str(err.value) and "needs about 1.30GiB" in str(err.value)


def test_check_memory_passes_when_it_fits():
    gather = COLLECTIVES["gather"]
    need = memory_needed(gather, 1 << 20, 4, True)
    check_memory(gather, 1 << 20, 4, True, available=need)
    with pytest.raises(UsageError):
        check_memory(gather, 1 << 20, 4, True, available=need - 1)


def test_mem_available_is_positive():
    assert mem_available() > 0


# ------------------------------------------------------------------ resolve (the option checks)
def options(**over):
    from dataclasses import fields

    from ddlcomm.bench.plan import BenchOptions
    given = dict(backend="mpi", path="host", dtype="float32", op="sum", algorithm="library",
                 bind="none", in_place=False, check=True, budget="0.2", timeout="120", root="0")
    given.update(over)
    return BenchOptions(**{f.name: given.get(f.name) for f in fields(BenchOptions)})


def test_resolve_defaults():
    from ddlcomm.bench.plan import resolve
    p = resolve(options(), default_ranks=2)
    assert p.collectives == ["broadcast", "gather", "allreduce"] and p.forms == ["buffer", "object"]
    assert p.ranks == 2 and p.sizes[0] == 4 and p.sizes[-1] == 64 << 20 and p.extra == {}


@pytest.mark.parametrize("over, message", [
    ({"workload": "ps-sync", "collective": "allreduce"}, "give --collective or --workload"),
    ({"workload": "ps-sync", "ranks": "1"}, "ps-sync needs at least 2 ranks"),
    ({"workload": "allreduce", "path": "nope"}, "nope"),
    ({"model": "alexnet"}, "--model applies to --workload runs"),
    ({"impl": "c", "form": "buffer"}, "give --form or --impl"),
    ({"impl": "c", "backend": "gloo"}, "--impl c needs --backend mpi"),
    ({"root": "2", "ranks": "2"}, "--root 2 is not one of the 2 ranks"),
    ({"root": "1", "collective": "allreduce,allgather"}, "--root applies to rooted collectives, not allreduce"),
    ({"in_place": True, "collective": "allreduce", "impl": "c"}, "--in-place applies to buffer-form calls"),
    ({"in_place": True, "collective": "allreduce", "form": "object"}, "--in-place applies to buffer-form calls"),
    ({"containers": "2", "collective": "allreduce", "algorithm": "ring,shm@64KiB", "form": "buffer"},
     "--algorithm shm@64KiB needs every rank on one node, and --containers 2 makes 2 nodes"),
    ({"algorithm": "ring", "workload": "allreduce"}, "--algorithm applies to collectives"),
    # these measured nothing (own algorithms run in buffer form only) or were ignored
    ({"algorithm": "ring", "collective": "allreduce", "form": "object"}, "run in buffer form"),
    ({"algorithm": "ring", "collective": "allreduce", "impl": "c"}, "run in buffer form"),
    # ... or left the C points out unsaid
    ({"algorithm": "ring", "collective": "allreduce", "impl": "c,buffer"},
     "--form/--impl c measures the library's collective"),
    ({"algorithm": "ring", "collective": "allreduce", "form": "both"}, "object measures the library"),
    ({"workload": "ps-sync", "op": "max"}, "--op applies to --collective runs"),
    ({"workload": "ps-sync", "form": "object"}, "--form applies to --collective runs"),
    ({"workload": "allreduce", "in_place": True}, "--in-place applies to --collective runs"),
    ({"sizes": ""}, "empty size list"),
    ({"collective": "reduce_scatter", "sizes": "4B:8B", "ranks": "3"}, "no size given is 12B"),
])
def test_resolve_refuses(over, message):
    from ddlcomm.bench.plan import resolve
    with pytest.raises(UsageError, match=message):
        resolve(options(**over), default_ranks=2)


def test_an_op_where_nothing_reduces_is_refused_for_what_it_is():
    """--impl c --op max of broadcast and gather was refused as the C reference's ("times sum
    reductions"), then taken and ignored (the run's config said op=max); --sizes of a barrier
    likewise.  Neither changes anything."""
    from ddlcomm.bench.plan import resolve
    with pytest.raises(UsageError, match="--op applies to reductions, and broadcast, gather reduce nothing"):
        resolve(options(collective="broadcast,gather", impl="c,buffer", op="max"), default_ranks=2)
    with pytest.raises(UsageError, match="times sum reductions"):
        resolve(options(collective="broadcast,allreduce", impl="c", op="max"), default_ranks=2)
    with pytest.raises(UsageError, match="--sizes applies to collectives that move data, and barrier"):
        resolve(options(collective="barrier", sizes="4KiB"), default_ranks=2)
    assert resolve(options(collective="barrier,allreduce", sizes="4KiB", op="max"), default_ranks=2)
    with pytest.raises(UsageError, match="--root applies to --collective runs"):
        resolve(options(workload="ps-sync", root="1"), default_ranks=2)


def test_block_cutting_collectives_measure_each_whole_block_message_once():
    from ddlcomm.bench.plan import resolve
    p = resolve(options(collective="reduce_scatter,alltoall,allreduce", sizes="4B:32B",
                        form="buffer"), default_ranks=3)
    got = [(s.name, s.nbytes) for s in p.points(3)]
    assert got == [("reduce_scatter", 16), ("reduce_scatter", 32), ("alltoall", 16),
                   ("alltoall", 32), *(("allreduce", n) for n in (4, 8, 16, 32))]
    assert len(p.points()) == 12                        # the rank count unknown: every size


def test_check_fits_refuses_a_point_too_big_for_memory():
    from ddlcomm.bench.plan import check_fits
    check_fits(plan(sizes=[4], ranks=2), available=GiB)
    with pytest.raises(UsageError, match="of 1GiB per rank at 4 ranks needs about"):
        check_fits(plan(sizes=[GiB], ranks=4), available=GiB)


def test_check_ranks_limit_and_override():
    from ddlcomm.bench.plan import MAX_RANKS_PER_CPU, check_ranks
    check_ranks(MAX_RANKS_PER_CPU * 2, 2, False)
    with pytest.raises(UsageError, match="--oversubscribe"):
        check_ranks(MAX_RANKS_PER_CPU * 2 + 1, 2, False)
    check_ranks(10 ** 5, 2, True)


def test_object_form_points_are_never_in_place():
    """--in-place applies to buffer calls: an object call (always out of place) stored True."""
    from ddlcomm.bench.plan import CollectivePoint, PointSpec, resolve
    plan = resolve(options(in_place=True, collective="allreduce"), default_ranks=2)
    assert CollectivePoint.of(plan, PointSpec("collective", "allreduce", 8, "buffer", "mpi"), 2).in_place
    assert not CollectivePoint.of(plan, PointSpec("collective", "allreduce", 8, "object", "mpi"), 2).in_place


@pytest.mark.parametrize("named, measured", [
    ("library", ["broadcast", "gather", "allreduce"]),
    ("ring", ["allreduce"]),                        # `bench --algorithm ring` was refused
    ("library,shm-map", ["allreduce"]),
    ("binomial", ["broadcast", "gather"]),
])
def test_left_out_collectives_are_those_that_have_every_algorithm(named, measured):
    from ddlcomm.bench.plan import resolve
    assert resolve(options(algorithm=named), default_ranks=2).collectives == measured


def test_algorithms_no_default_collective_has_are_still_refused():
    from ddlcomm.bench.plan import resolve
    with pytest.raises(UsageError, match="no algorithm ring for broadcast"):
        resolve(options(algorithm="ring,binomial"), default_ranks=2)


def test_the_heap_is_glibcs_unless_asked():
    from ddlcomm.cli import build_parser
    from ddlcomm.cli.bench import bench_plan
    parse = build_parser().parse_args
    assert bench_plan(parse(["bench"]), default_ranks=2).heap == "glibc"
    assert bench_plan(parse(["bench", "--heap", "steady"]), default_ranks=2).heap == "steady"
    with pytest.raises(UsageError, match="invalid choice"):
        parse(["bench", "--heap", "tcmalloc"])
