"""Placement and memory kinds through `ddlcomm bench`, end to end."""
from __future__ import annotations

import json
import sqlite3

import pytest

from conftest import run

pytestmark = pytest.mark.mpi


def bench(mpi, db, *args, timeout=300, expect=0):
    res = run([mpi.ddlcomm, "bench", "--db", db, "--no-report", *args], mpi.env(), timeout)
    assert res.returncode == expect, res.stdout + res.stderr
    if expect:
        return res, []
    out = run([mpi.ddlcomm, "results", "export", "--all", "--db", db], mpi.env(), 60)
    return res, json.loads(out.stdout)


@pytest.fixture(scope="module")
def namespaces():
    from ddlcomm.errors import UnsupportedError
    from ddlcomm.launch.containers import check_available
    try:
        check_available()
    except UnsupportedError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("backend, containers", [("mpi", 2), ("mpi", 4), ("gloo", 2)])
def test_allreduce_in_containers(mpi, tmp_path, namespaces, backend, containers):
    _, points = bench(mpi, tmp_path / "p.db", "--backend", backend, "--collective", "allreduce",
                      "--ranks", "4", "--containers", str(containers), "--sizes", "64KiB,1MiB",
                      "--form", "buffer", "--iters", "3")
    assert len(points) == 2 and {p["check"] for p in points} == {"passed"}
    for p in points:
        assert p["containers"] == containers
        assert p["ranks_per_container"] == [4 // containers] * containers
        assert p["transport"]["0-3"] == "tcp"
        assert p["transport"]["0-1"] == ("shared memory" if containers == 2 else "tcp")
    # The ranks' CPU time is the run's own: Open MPI's prterun left its ssh stand-ins for
    # the owner to reap, and unreaped, the load record counted the ranks as other processes
    # ("busy machine" on every such run). Its ranks poll: they keep a core busy at least.
    with sqlite3.connect(tmp_path / "p.db") as con:
        load = json.loads(con.execute("select load from runs").fetchone()[0])
    assert load["own_cpu_s"] >= 0.5 * load["wall_s"], load


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_hierarchical_allreduce_over_containers(mpi, tmp_path, namespaces, backend):
    # Two containers are two hosts (own UTS namespace and /dev/shm): shared memory
    # inside each, the leaders' ring (2 MiB) or rhd (64 KiB) between them over TCP.
    _, points = bench(mpi, tmp_path / "h.db", "--backend", backend, "--collective", "allreduce",
                      "--algorithm", "hierarchical,ring", "--ranks", "4", "--containers", "2",
                      "--sizes", "64KiB,2MiB", "--iters", "3")
    assert {(p["algorithm"], p["bytes"]) for p in points} == {
        (a, s) for a in ("hierarchical", "ring") for s in (64 << 10, 2 << 20)}
    assert {p["check"] for p in points} == {"passed"}


def test_gloo_ranks_bound_on_the_host(mpi, tmp_path):
    import os
    cpus = sorted(os.sched_getaffinity(0))
    _, points = bench(mpi, tmp_path / "b.db", "--backend", "gloo", "--bind", "core",
                      "--collective", "allreduce", "--sizes", "4KiB", "--ranks", "2", "--iters", "3")
    assert points[0]["bind"] == "core" and points[0]["check"] == "passed"
    assert points[0]["cpus"] == [str(cpus[0]), str(cpus[1 % len(cpus)])]


def test_workloads_in_a_memory_kind(mpi, tmp_path):
    _, points = bench(mpi, tmp_path / "w.db", "--workload", "ps-sync,allreduce", "--memory", "hugepage",
                      "--sizes", "4MiB", "--ranks", "3", "--iters", "3")
    assert {p["workload"] for p in points} == {"ps-sync", "allreduce"}
    assert {p["check"] for p in points} == {"passed"}
    assert all(p["memory"] == "hugepage" and p["pages"]["huge_kb"] > 0 for p in points)


def test_numpys_arrays_record_each_ranks_huge_pages(mpi, tmp_path):
    """Without --memory a point records, rank by rank, the part of its NumPy arrays on huge
    pages (PAGEMAP_SCAN), where the kernel can say: none below NumPy's 4 MiB where THP is
    madvise (NumPy advises only from there)."""
    from ddlcomm.memory import pagescan, vm
    _, points = bench(mpi, tmp_path / "n.db", "--collective", "broadcast,allreduce",
                      "--sizes", "1MiB,16MiB", "--form", "buffer", "--ranks", "2", "--iters", "3")
    assert {p["check"] for p in points} == {"passed"} and len(points) == 4
    assert {p["heap"] for p in points} == {"glibc"}           # the C library's, left as it is
    if not pagescan.available():
        assert all(p["pages"] == {"memory": "numpy"} for p in points)
        pytest.skip("this kernel has no PAGEMAP_SCAN (Linux 6.7 and later)")
    for p in points:
        shares = p["pages"]["huge_share_ranks"]
        assert len(shares) == 2 and all(0.0 <= s <= 1.0 for s in shares), p["pages"]
        if p["bytes"] < 4 << 20 and vm.thp_mode() == "madvise":
            assert shares == [0.0, 0.0]


def test_a_steady_heap_is_recorded(mpi, tmp_path):
    _, points = bench(mpi, tmp_path / "s.db", "--heap", "steady", "--form", "object",
                      "--collective", "allreduce", "--sizes", "1MiB", "--ranks", "2", "--iters", "3")
    assert [(p["heap"], p["check"]) for p in points] == [("steady", "passed")]


def test_c_buffer_object_in_hugepages(mpi, tmp_path):
    _, points = bench(mpi, tmp_path / "m.db", "--impl", "c,buffer,object", "--memory", "hugepage",
                      "--collective", "broadcast,gather,allreduce", "--sizes", "4MiB",
                      "--dtype", "int32", "--ranks", "2", "--iters", "3")
    assert {(p["collective"], p["form"]) for p in points} == {
        (c, f) for c in ("broadcast", "gather", "allreduce") for f in ("c", "buffer", "object")}
    assert {p["check"] for p in points} == {"passed"}
    assert all(p["memory"] == "hugepage" and p["pages"]["huge_kb"] > 0 for p in points)


def test_hbw_refused_or_fallback(mpi, tmp_path):
    from ddlcomm.memory import hbw
    if hbw.unavailable() is None:
        pytest.skip("this machine has high-bandwidth memory")
    res, _ = bench(mpi, tmp_path / "h.db", "--memory", "hbw", "--sizes", "4KiB", expect=2)
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "memkind" in res.stderr or "no high-bandwidth memory" in res.stderr, res.stderr
    assert "--hbw-fallback dram" in res.stderr, res.stderr
    _, points = bench(mpi, tmp_path / "h.db", "--memory", "hbw", "--hbw-fallback", "dram",
                      "--collective", "allreduce", "--sizes", "4KiB", "--form", "buffer",
                      "--ranks", "2", "--iters", "3")
    assert points[0]["pages"]["fallback"] == "dram" and points[0]["check"] == "passed"
