"""Tests of machine/software facts."""
from __future__ import annotations

import subprocess

from ddlcomm.results import sysinfo


def test_collect_keys():
    info = sysinfo.collect(with_machine=False)
    assert set(info) == {"host", "cpu_model", "cores", "os", "python", "ddlcomm_version",
                         "git_commit"}
    assert info["host"] and info["os"] and info["python"].count(".") == 2
    assert isinstance(info["cores"], int) and info["cores"] >= 1
    assert isinstance(info["ddlcomm_version"], str)
    assert info["git_commit"] is None or isinstance(info["git_commit"], str)


def test_collect_keeps_the_machine_facts():
    """What `ddlcomm info` reports goes with every run's facts."""
    info = sysinfo.collect(ranks=3)
    machine = info["machine"]
    assert {"cpus", "memory", "mpi", "gpus", "features", "gpu_verdict"} <= set(machine)
    assert machine["gpus"]["ranks"] == 3
    assert machine["cpus"]["logical"] == info["cores"]


def test_git_commit(tmp_path, monkeypatch):
    monkeypatch.delenv(sysinfo.COMMIT_ENV, raising=False)
    assert sysinfo.git_commit(tmp_path) is None                  # not a checkout
    # a copy of a checkout without its .git (the device tool's): the commit its caller names
    monkeypatch.setenv(sysinfo.COMMIT_ENV, "075de2c")
    assert sysinfo.git_commit(tmp_path) == "075de2c"
    assert sysinfo.git_commit(tmp_path / "lib" / "site-packages") is None
    monkeypatch.delenv(sysinfo.COMMIT_ENV)
    repo = tmp_path / "repo"
    repo.mkdir()
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)
        git("init", "-q")
        (repo / "f").write_text("x")
        git("add", "f")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m")
    except (OSError, subprocess.CalledProcessError):
        return                                                   # no git here
    head = sysinfo.git_commit(repo)
    assert head and len(head) == 40
    (repo / "f").write_text("y")
    assert sysinfo.git_commit(repo) == head + "-dirty"
    assert sysinfo.git_commit(repo / "lib" / "site-packages") is None
