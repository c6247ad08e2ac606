"""Data paths and where backends' buffers live, without ranks: the stages' phases and
times, the GPU fields of a point, and the plan's refusals of memory a backend cannot take."""
from __future__ import annotations

import time

import pytest

from ddlcomm.bench.plan import (BenchPlan, check_backend_memory, check_collective_paths, staged_backends,
                               staged_note)
from ddlcomm.bench.runner import gpu_fields
from ddlcomm.errors import UnsupportedError, UsageError
from ddlcomm.measure import timing
from ddlcomm.workloads import paths
from ddlcomm.workloads.stages import Stage, added, run_stages


def test_a_stage_of_one_part_is_the_collective():
    stage = Stage("allreduce", (("allreduce", lambda: None),))
    assert stage.phases() == ("allreduce",) and len(stage.run()) == 1


def test_a_staged_collective_times_its_parts_and_their_sum():
    stage = Stage("broadcast", (("d2h", lambda: None), ("broadcast", lambda: None),
                                ("h2d", lambda: None)))
    assert stage.phases() == ("broadcast.d2h", "broadcast.broadcast", "broadcast.h2d", "broadcast")
    *parts, whole = added(run_stages([stage, stage]))
    assert len(parts) == 3 and whole == pytest.approx(sum(parts))


def test_paths_are_a_registry_of_classes():
    assert list(paths.PATHS) == ["host", "host-staged", "direct", "nccl-chief"]
    assert not paths.PATHS["host"].needs_gpu
    assert all(paths.PATHS[p].needs_gpu for p in ("host-staged", "direct", "nccl-chief"))
    assert paths.PATHS["host-staged"].backend_memory == "host"
    assert paths.PATHS["direct"].backend_memory == "device"
    with pytest.raises(Exception, match="unknown data path 'nope'"):
        paths.get_path("nope")


@pytest.mark.parametrize("uuids, gpus, want", [
    (["GPU-a"] * 4, [0, 0, 0, 0], [4, 4, 4, 4]),
    (["GPU-a", "GPU-b"] * 2, [0, 1, 0, 1], [2, 2, 2, 2]),
    (["GPU-a", "GPU-a", "GPU-b"], [0, 0, 0], [2, 2, 1]),   # index 0 of another node or container
])
def test_gpu_fields_count_the_ranks_on_each_physical_gpu(uuids, gpus, want):
    assert gpu_fields(uuids, gpus) == {"gpu": gpus, "ranks_per_gpu": want}


def plan(**over) -> BenchPlan:
    given = dict(backends=["mpi"], collectives=["allreduce"], sizes=[4], dtype="float32",
                 op="sum", forms=["buffer"])
    given.update(over)
    return BenchPlan(**given)


def test_nccl_is_refused_host_memory():
    with pytest.raises(UnsupportedError, match="backend nccl moves device .GPU. memory only"):
        check_backend_memory(plan(backends=["nccl"]))


def test_mpi_is_refused_device_memory_on_the_host_path():
    with pytest.raises(UnsupportedError) as err:
        check_backend_memory(plan(memory="device"))
    assert "only through a CUDA-aware MPI" in str(err.value) and "host-staged" in err.value.hint


def test_what_each_backend_takes():
    check_backend_memory(plan(backends=["gloo"], memory="device"))       # Gloo takes CUDA tensors
    check_backend_memory(plan(backends=["nccl"], memory="device"))
    check_backend_memory(plan(memory="pinned"))                          # pinned is host memory
    check_backend_memory(plan(workloads=["ps-sync"], paths=["host-staged"], memory="device"))
    check_backend_memory(plan(workloads=["ps-sync"], paths=["direct"], memory="device"))
    with pytest.raises(UnsupportedError, match="backend nccl moves device"):
        check_backend_memory(plan(backends=["nccl"], workloads=["ps-sync"], paths=["host-staged"],
                                  memory="device"))


def test_own_algorithms_on_device_buffers_hand_the_backend_host_messages():
    """ring/rhd/shm on --memory device send host headers and staged blocks over the backend:
    mpi and gloo take them, nccl (device memory only) is refused before any rank starts."""
    own = dict(memory="device", algorithms=["ring", "shm"])
    check_backend_memory(plan(backends=["mpi", "gloo"], **own))
    with pytest.raises(UnsupportedError, match="own algorithms.*backend nccl moves device"):
        check_backend_memory(plan(backends=["nccl"], **own))
    check_backend_memory(plan(backends=["nccl"], memory="device", algorithms=["library"]))


def test_the_library_along_host_staging_beside_own_algorithms_on_the_device_buffers():
    """issue 15's comparison in one run: MPI's all-reduce through pinned host memory, ring
    and shm on the device buffers themselves; auto (which may call the library) stays on
    the buffers, so a host-only MPI is refused it there."""
    staged = plan(paths=["host-staged"], memory="device", algorithms=["library", "ring", "shm"])
    assert {(p.algorithm, p.path, p.kind) for p in staged.points()} == \
        {("library", "host-staged", "staged"), ("ring", "host", "collective"),
         ("shm", "host", "collective")}
    check_backend_memory(staged)
    with pytest.raises(UnsupportedError) as err:       # the library on the device buffers
        check_backend_memory(plan(memory="device", algorithms=["library", "ring"]))
    assert "--path host-staged" in err.value.hint
    with pytest.raises(UnsupportedError, match="CUDA-aware MPI"):
        check_backend_memory(plan(paths=["host-staged"], memory="device", algorithms=["auto"]))
    with pytest.raises(UsageError, match="one --path"):
        check_collective_paths(plan(paths=["host", "host-staged"], memory="device",
                                    algorithms=["library", "shm"]))
    with pytest.raises(UsageError, match="applies to the library's collectives"):
        check_collective_paths(plan(paths=["host-staged"], memory="device", algorithms=["shm"]))


def test_path_left_out_on_device_buffers_stages_an_mpis_collectives():
    """issue 15's command as written (--backend mpi,gloo --memory device, no --path): MPI's
    all-reduce goes host-staged, said in one note; Gloo's takes the CUDA tensors; ddlcomm's
    own algorithms run on the device buffers over both.  Named, --path host keeps the
    refusal, and host memory stages nothing."""
    assert staged_backends(["mpi", "gloo", "nccl"], "device", ["library", "ring"]) == ["mpi"]
    assert staged_backends(["mpi"], None, ["library"]) == staged_backends(["mpi"], "pinned", ["library"]) == []
    assert staged_backends(["mpi"], "device", ["ring", "auto"]) == []    # no library call to stage
    run = plan(backends=["mpi", "gloo"], memory="device", staged=["mpi"],
               algorithms=["library", "ring", "shm"])
    assert {(p.backend, p.algorithm, p.path, p.kind) for p in run.points()} == \
        {("mpi", "library", "host-staged", "staged"), ("gloo", "library", "host", "collective")} | \
        {(b, a, "host", "collective") for b in ("mpi", "gloo") for a in ("ring", "shm")}
    check_backend_memory(run)
    note = staged_note(run)
    assert note.startswith("backend mpi: the library's collectives on --memory device go host-staged")
    assert "--path direct" in note and staged_note(plan(memory="device")) is None
    with pytest.raises(UnsupportedError, match="only through a CUDA-aware MPI"):
        check_backend_memory(plan(backends=["mpi", "gloo"], memory="device"))


def test_collective_points_along_paths():
    points = plan(paths=["host", "host-staged"], forms=["buffer", "object"], sizes=[4, 8]).points()
    kinds = {(p.path, p.form, p.kind) for p in points}
    assert kinds == {("host", "buffer", "collective"), ("host", "object", "collective"),
                     ("host-staged", "buffer", "staged")}       # objects stay on the host path
    assert [p.label(False) for p in points if p.path == "host-staged"][0] == \
        "allreduce (host-staged, buffer, 4B)"


def test_workload_points_along_paths():
    points = plan(workloads=["ps-sync"], collectives=[], paths=["host-staged", "nccl-chief"]).points()
    assert [(p.kind, p.path) for p in points] == [("workload", "host-staged"), ("workload", "nccl-chief")]


def test_backend_facts_of_every_rank_are_merged():
    from ddlcomm.measure.records import merge_facts
    said = [{"nccl_transport": {"0->1": "P2P/IPC"}, "nccl_transports": ["P2P/IPC"], "sync": "a"},
            {"nccl_transport": {"1->0": "SHM/direct/direct"}, "nccl_transports": ["SHM/direct/direct"],
             "sync": "b"}, {}]
    assert merge_facts(said) == {"nccl_transport": {"0->1": "P2P/IPC", "1->0": "SHM/direct/direct"},
                                 "nccl_transports": ["P2P/IPC", "SHM/direct/direct"], "sync": "a"}
    assert merge_facts([{}, {}]) == {}


class OneRank:
    """A job of one rank: the protocol's barriers and agreements have no one to wait for."""

    rank, size = 0, 1

    def barrier(self) -> None:
        pass

    def allreduce(self, buf, out, op) -> None:
        out[...] = buf


def test_a_staged_call_is_calibrated_by_its_whole_time_not_a_part():
    """The budget buys iterations of the whole staged call (the last phase), so a short
    copy part cannot make the loop run many times the budget."""
    def sleep(seconds):
        return lambda: time.sleep(seconds)
    stage = Stage("allreduce", (("d2h", sleep(0.0005)), ("allreduce", sleep(0.02)),
                                ("h2d", sleep(0.0005))))
    comm = OneRank()
    times, iterations, _ = timing.calibrate(comm, timing.phases(comm, stage.run, 4), budget_s=0.2)
    assert stage.phases()[-1] == "allreduce" and iterations <= 10, iterations
    assert times[:, -1] == pytest.approx(times[:, :3].sum(axis=1))


class _Gathers:
    """A comm's allgather_object as rank 0 of ranks whose objects are given."""

    rank = 0

    def __init__(self, *others) -> None:
        self.others = others

    def allgather_object(self, obj):
        return [obj, *self.others]


def test_each_copy_phase_is_held_to_a_copy_of_its_own_bytes_by_its_own_copiers(monkeypatch):
    """A gather's root copies the whole table back: its h2d bar is a copy of the table, not
    of one message; a phase's bars are measured by the ranks that copy in it (the server
    alone, the two workers at once); each (way, bytes, copiers) is measured once."""
    pytest.importorskip("torch")
    from ddlcomm.workloads.sides import TorchSide
    asked = []
    monkeypatch.setattr(TorchSide, "_copy_bar", lambda self, comm, way, nbytes, ranks:
                        asked.append((way, nbytes, ranks)) or {"copy_alone_GBps": float(nbytes)})
    n = 1 << 20
    server = {"broadcast.d2h": n, "broadcast.h2d": 0, "gather.d2h": 0, "gather.h2d": 3 * n,
              "allreduce.apply": n, "gather.gather": 0, "allreduce.d2h": n, "step.d2h": n}
    worker = {"broadcast.d2h": 0, "broadcast.h2d": n, "gather.d2h": n, "gather.h2d": 0,
              "allreduce.d2h": n, "step.d2h": n}
    bars = TorchSide("cpu").copy_bars(_Gathers(worker, worker), server)
    everyone, workers = frozenset({0, 1, 2}), frozenset({1, 2})
    assert sorted(asked, key=str) == sorted([("d2h", n, everyone), ("d2h", n, frozenset({0})),
                                             ("d2h", n, workers), ("h2d", n, workers),
                                             ("h2d", 3 * n, frozenset({0}))], key=str)
    assert bars["gather.h2d"] == {"copy_alone_GBps": 3.0 * n, "copiers": 1}
    assert bars["broadcast.h2d"] == bars["gather.d2h"] == {"copy_alone_GBps": float(n), "copiers": 2}
    assert bars["allreduce.d2h"] is bars["step.d2h"]              # measured once
    assert set(bars) == {"broadcast.d2h", "broadcast.h2d", "gather.d2h", "gather.h2d",
                         "allreduce.d2h", "step.d2h"}
    assert paths.PathRun(None).copy_bars(None, {"gather.h2d": n}) == {}


def test_shm_map_is_refused_pinned_memory(monkeypatch):
    """Its pages move: the GPU's copies of pinned memory would miss them (refused before the
    ranks start, where --memory pinned itself can run)."""
    from ddlcomm.bench import plan as plan_module
    monkeypatch.setattr(plan_module.memory, "check", lambda spec, fallback: None)   # as on a GPU machine
    with pytest.raises(UsageError, match="shm-map moves the buffers' pages"):
        plan_module.check(plan(memory="pinned", algorithms=["library", "shm-map"]))
    plan_module.check(plan(memory="pageable", algorithms=["library", "shm-map"]))
