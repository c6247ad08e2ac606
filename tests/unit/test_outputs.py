"""Output paths checked writable before anything runs (ddlcomm.outputs)."""
from __future__ import annotations

import os

import pytest

from ddlcomm.errors import UsageError
from ddlcomm.outputs import writable_dir, writable_file


def test_new_paths_under_existing_folders(tmp_path):
    assert writable_file(tmp_path / "a" / "b" / "x.db", "--db") == tmp_path / "a" / "b" / "x.db"
    assert writable_dir(tmp_path / "a" / "reports", "--out") == tmp_path / "a" / "reports"
    assert not (tmp_path / "a").exists()              # a check creates nothing


def test_existing_paths(tmp_path):
    f = tmp_path / "x.db"
    f.write_text("")
    assert writable_file(f, "--db") == f
    assert writable_dir(tmp_path, "--out") == tmp_path


@pytest.mark.parametrize("check, make, words", [
    (writable_file, lambda t: t, "is a folder, not a file"),
    (writable_dir, lambda t: t / "f", "is a file, not a folder"),
    (writable_file, lambda t: t / "f" / "x.db", "is a file, not a folder"),
    (writable_dir, lambda t: t / "f" / "a" / "b", "is a file, not a folder"),
])
def test_refusals(tmp_path, check, make, words):
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match=words) as err:
        check(make(tmp_path), "--flag")
    assert "--flag" in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(UsageError, match="cannot write"):
            writable_file(ro / "x.db", "--db")
    finally:
        ro.chmod(0o700)
