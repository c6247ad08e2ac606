"""Output paths checked writable before anything runs (ddlcomm.outputs)."""
from __future__ import annotations

import os
from pathlib import Path

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


def test_a_read_only_file_system_is_refused_even_to_root(tmp_path):
    """root passes access()'s permission checks, but not a read-only mount (EROFS): the
    run's database or report would fail at its end; one is mounted in a mount namespace."""
    import subprocess
    import sys
    probe = ("import sys; from ddlcomm.errors import UsageError; from ddlcomm.outputs import "
             "writable_dir, writable_file\nfor check, path in ((writable_dir, sys.argv[1] + '/reports'), "
             "(writable_dir, sys.argv[1]), (writable_file, sys.argv[1] + '/x.db')):\n"
             "    try:\n        check(__import__('pathlib').Path(path), '--out')\n"
             "    except UsageError as e:\n        print('refused:', e)\n")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    res = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$1" && exec "$2" -c "$3" "$1"',
                          "_", str(mnt), sys.executable, probe], capture_output=True, text=True, timeout=60)
    if res.returncode != 0 and "refused" not in res.stdout:
        pytest.skip(f"no mount namespace here: {res.stderr.strip()[-200:]}")
    assert res.stdout.count("refused:") == 3, res.stdout + res.stderr
    assert f"--out {mnt}/reports: cannot write in {mnt}" in res.stdout


def test_a_folder_root_cannot_make_anything_in_is_refused():
    """/proc passes root's access() checks, but nothing can be made there: refused up front
    (before, the run ran and only its report was lost, with a warning)."""
    with pytest.raises(UsageError, match=r"--report-dir /proc/reports: cannot write in /proc \("):
        writable_dir(Path("/proc/reports"), "--report-dir")
    with pytest.raises(UsageError, match=r"--out /proc is not writable"):
        writable_dir(Path("/proc"), "--out")


def test_a_check_leaves_nothing_behind(tmp_path):
    writable_dir(tmp_path, "--out")
    writable_file(tmp_path / "new" / "x.db", "--db")
    assert list(tmp_path.iterdir()) == []


def test_text_is_written_in_utf8_whatever_the_locale(tmp_path):
    """Under an ASCII locale a run's 'é' stopped an export half-way, its file left empty."""
    import subprocess
    import sys
    out = tmp_path / "sub" / "export.csv"
    code = ("import sys; from pathlib import Path; from ddlcomm.outputs import write_text; "
            "write_text(Path(sys.argv[1]), 'error\\nrank 1: \\u00e9 \\u2260 2\\n')")
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": ":".join(sys.path)}
    res = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert out.read_text(encoding="utf-8") == "error\nrank 1: é ≠ 2\n"


def test_a_default_path_refused_is_said_to_be_the_default(tmp_path):
    """`ddlcomm report 3` beside a read-only database blamed an --out nobody gave."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match=r"^--out's default .*is a file, not a folder"):
        writable_dir(blocker / "reports" / "run-3", "--out", default=True)
    with pytest.raises(UsageError, match=r"^--out .*is a file, not a folder"):
        writable_dir(blocker / "reports", "--out")
