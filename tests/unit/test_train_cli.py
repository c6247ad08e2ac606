"""``ddlcomm train``'s plan (pure) and its errors (the real command: exit 2, one line)."""
from __future__ import annotations

import pytest

from ddlcomm.cli import build_parser
from ddlcomm.errors import UnsupportedError, UsageError
from ddlcomm.cli.train import plan_jobs
from ddlcomm.train.config import TrainConfig, TrainJob

from test_cli import ddlcomm  # the real command, outside any launcher


def jobs(*argv, size=None):
    args = build_parser().parse_args(["train", *argv])
    return plan_jobs(args, size)


def test_defaults():
    (job,) = jobs()
    assert job.ranks == 2 and job.backend == "mpi"
    (cfg,) = job.configs
    assert (cfg.model, cfg.arch, cfg.overlap, cfg.fusion, cfg.batch, cfg.iters, cfg.heap) == \
        ("smallcnn", "allreduce", False, 25 << 20, 128, 20, "steady")
    (job,) = jobs("--heap", "glibc")
    assert job.configs[0].heap == "glibc"


def test_product_of_arch_overlap_and_peer():
    (job,) = jobs("--arch", "allreduce,ps", "--overlap", "both", "--peer", "ddp", "--model", "resnet50")
    assert [(c.arch, c.overlap, c.peer) for c in job.configs] == [
        ("allreduce", False, "ddlcomm"), ("allreduce", True, "ddlcomm"), ("ps", False, "ddlcomm"),
        ("allreduce", False, "ddp")]
    assert {c.batch for c in job.configs} == {2} and {c.image_size for c in job.configs} == {224}
    assert job.needs_gloo


def test_wait_both_doubles_the_allreduce_configurations():
    (job,) = jobs("--arch", "allreduce,ps", "--overlap", "both", "--wait", "both")
    assert [(c.arch, c.overlap, c.wait) for c in job.configs] == [
        ("allreduce", False, "spin"), ("allreduce", False, "sleep"), ("allreduce", True, "spin"),
        ("allreduce", True, "sleep"), ("ps", False, "spin")]


@pytest.mark.parametrize("shape", [("--overlap", "on"), ("--wait", "sleep"), ("--overlap", "on", "--wait", "sleep")])
def test_ps_runs_beside_an_all_reduce_shaped_by_overlap_or_wait(shape):
    (job,) = jobs("--arch", "allreduce,ps", *shape)
    assert [(c.arch, c.overlap, c.wait) for c in job.configs] == [
        ("allreduce", "on" in shape, "sleep" if "sleep" in shape else "spin"), ("ps", False, "spin")]


def test_bare_overlap_means_on():
    (job,) = jobs("--overlap")
    assert [c.overlap for c in job.configs] == [True]


def test_ranks_list_adds_the_one_worker_baseline():
    out = jobs("--ranks", "2,4", "--arch", "ps,allreduce", "--overlap", "both")
    assert [j.ranks for j in out] == [1, 2, 4]
    assert [(c.arch, c.overlap) for c in out[0].configs] == [("allreduce", False)]
    assert len(out[1].configs) == 3


def test_batch_sweep_on_one_worker():
    (job,) = jobs("--batch-sweep", "8,2,4")
    assert job.ranks == 1 and [c.batch for c in job.configs] == [2, 4, 8]


def test_under_a_launcher_the_size_is_the_launchers():
    (job,) = jobs(size=3)
    assert job.ranks == 3
    # another count is refused by the ranks together, once joined (rank 0 says it)
    (job,) = jobs("--ranks", "2", size=3)
    assert job.ranks == 2
    with pytest.raises(UsageError, match="one count, the launcher's"):
        jobs("--ranks", "2,3", size=3)


def test_job_round_trips_through_json():
    job = TrainJob("gloo", 2, [TrainConfig("smallcnn", overlap=True, data="/x")], 60.0)
    again = TrainJob.from_json(job.to_json())
    assert again.configs == job.configs and again.ranks == 2 and again.timeout_s == 60.0


@pytest.mark.parametrize("argv, message", [
    (["--model", "lenet"], "unknown model"),
    (["--arch", "ring"], "unknown --arch"),
    (["--arch", "ps", "--overlap"], "--overlap applies to --arch allreduce"),
    (["--arch", "ps", "--ranks", "1"], "needs a server"),
    (["--arch", "ps", "--wait", "sleep"], "--wait applies to --arch allreduce"),
    (["--wait", "nap"], "invalid choice"),
    (["--heap", "jemalloc"], "invalid choice"),
    (["--batch-sweep", "1,2", "--ranks", "2"], "one worker"),
    (["--batch", "2", "--batch-sweep", "1,2"], "not both"),
    (["--batch", "0"], "--batch must be at least 1"),
    (["--fusion", "12XB"], "cannot parse size"),
    (["--image-size", "16", "--model", "resnet50"], "too small"),
    (["--lr", "abc"], "--lr must be a number"),
    (["--iters", "-3"], "--iters must be at least 1"),
    (["--ranks", "2,2"], "names something twice"),
    (["--backend", "nccl9"], "unknown backend"),
    (["--algorithm", "tree"], "no algorithm tree for allreduce"),
    (["--algorithm", "ring", "--arch", "allreduce,ps"], "--algorithm applies to --arch allreduce"),
    (["--algorithm", "ring", "--overlap"], "own all-reduces are blocking calls"),
    (["--algorithm", "rhd", "--wait", "both"], "own all-reduces are blocking calls"),
])
def test_bad_input(argv, message):
    with pytest.raises((UsageError, UnsupportedError), match=message):
        jobs(*argv)


def test_own_allreduce_configurations_but_not_the_baseline_nor_ddp():
    job1, job2 = jobs("--algorithm", "shm", "--ranks", "1,2", "--peer", "ddp")
    assert [c.algorithm for c in job1.configs] == ["library"]          # one worker: nothing to reduce
    assert [(c.peer, c.algorithm) for c in job2.configs] == [("ddlcomm", "shm"), ("ddp", "library")]
    assert "allreduce shm fusion" in job2.configs[0].label()


def test_own_allreduce_on_the_gpu_refuses_a_device_only_backend():
    from ddlcomm.train.config import _check_algorithm
    args = build_parser().parse_args(["train", "--algorithm", "ring", "--backend", "nccl"])
    with pytest.raises(UnsupportedError, match="own all-reduces do not train over backend nccl: ring.s and rhd.s"):
        _check_algorithm(args, ["allreduce"], (False,), ("spin",), "cuda")
    for algorithm, message in (("hierarchical", "allreduce by hierarchical does not run on --device cuda"),
                               ("ring+c", "the c kernel reduces host arrays, not --device cuda")):
        args = build_parser().parse_args(["train", "--algorithm", algorithm, "--backend", "mpi"])
        with pytest.raises(UsageError, match=message):
            _check_algorithm(args, ["allreduce"], (False,), ("spin",), "cuda")


def test_the_command_says_one_line(tmp_path):
    res = ddlcomm("train", "--model", "lenet", db=tmp_path / "d.db")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "unknown model 'lenet'" in res.stderr
    res = ddlcomm("train", "--data", str(tmp_path / "nothing"), db=tmp_path / "d.db")
    assert res.returncode == 2 and "no such folder" in res.stderr


def test_help_explains():
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for word in ("--fusion", "--overlap", "--arch", "--peer", "--batch-sweep", "images/s",
                 "identical parameters"):
        assert word in text


def test_device_defaults_to_where_the_backend_takes_buffers():
    (job,) = jobs("--backend", "gloo")
    assert {c.device for c in job.configs} == {"cpu"}
    (job,) = jobs("--backend", "mpi", "--device", "cpu")
    assert {c.device for c in job.configs} == {"cpu"}


def test_the_networks_state_counts_against_the_memory(monkeypatch):
    """16 ranks of vgg16 started on a 22 GiB machine: only the images were counted."""
    from ddlcomm.train import config
    monkeypatch.setattr(config, "mem_available", lambda: 20 << 30)
    with pytest.raises(UsageError, match="vgg16's parameters, gradients and momentum need "
                                         r"~1\.55GiB a rank, ~24\.7GiB at 16 ranks"):
        jobs("--model", "vgg16", "--ranks", "16", "--oversubscribe")
    assert jobs("--model", "vgg16", "--ranks", "8", "--oversubscribe")
    assert jobs("--model", "smallcnn", "--ranks", "16", "--oversubscribe")   # no workload table
