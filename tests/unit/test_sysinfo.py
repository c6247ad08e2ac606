"""Tests of machine/software facts."""
from __future__ import annotations

import subprocess

from ddlcomm.results import sysinfo


def test_collect_keys():
    info = sysinfo.collect()
    assert set(info) == {"host", "cpu_model", "cores", "os", "python", "ddlcomm_version",
                         "git_commit"}
    assert info["host"] and info["os"] and info["python"].count(".") == 2
    assert isinstance(info["cores"], int) and info["cores"] >= 1
    assert isinstance(info["ddlcomm_version"], str)
    assert info["git_commit"] is None or isinstance(info["git_commit"], str)


def test_cpu_model_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: Example CPU @ 3.0GHz\nflags\t: x\n")
    assert sysinfo.cpu_model(f) == "Example CPU @ 3.0GHz"
    assert sysinfo.cpu_model(tmp_path / "missing") == (sysinfo.platform.processor() or None)


def test_git_commit(tmp_path):
    assert sysinfo.git_commit(tmp_path) is None                  # not a checkout
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


def test_last_level_cache(tmp_path):
    for name, level, kind, size in (("index0", 1, "Data", "48K"), ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "1024K"), ("index3", 3, "Unified", "32M")):
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert sysinfo.last_level_cache(tmp_path) == 32 << 20
    assert sysinfo.last_level_cache(tmp_path / "missing") is None
