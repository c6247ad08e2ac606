"""Backend gloo (torch.distributed + Gloo): the shared rank suite without MPI and under mpirun.

Ranks start as torchrun would start them (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RUN_ID``), from a
helper here that ends every rank when one fails or time runs out, so no test
can hang.  The suite runs with the Python of both MPI environments (torch is
installed in each, and a 4-rank run takes seconds), and once under mpirun to
exercise the rendezvous through MPI.  Tests skip, saying why, in an
environment without torch.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import STRICT
from ddlcomm.launch.spawn import held_port

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.mpi

#: Variables by which a launcher names ranks: scrubbed so only ours are seen.
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCALRANKID", "HYDRA_")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID")
_torch_ok: dict[str, str] = {}


@pytest.fixture
def gloo(mpi):
    """The MPI environment, skipped (with the reason) where torch cannot run Gloo."""
    if mpi.name not in _torch_ok:
        res = subprocess.run([str(mpi.python), "-c",
                              "import torch.distributed as d; assert d.is_gloo_available()"],
                             capture_output=True, text=True, timeout=120)
        _torch_ok[mpi.name] = "" if res.returncode == 0 else (res.stderr.strip().splitlines()
                                                               or ["?"])[-1]
    if _torch_ok[mpi.name]:
        (pytest.fail if STRICT else pytest.skip)(
            f"torch with Gloo is not importable in .venv/{mpi.name} "
            f"({_torch_ok[mpi.name]}): pip install 'ddlcomm[torch]'")
    return mpi


# ------------------------------------------------------------------ spawner
@dataclass
class Rank:
    code: int          # exit status; negative: ended by that signal
    out: str
    err: str


def clean_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` without any launcher's rank variables (ours are added per rank)."""
    return {k: v for k, v in base.items()
            if not k.startswith(LAUNCHER_PREFIXES) and k not in TORCHRUN_VARS}


def spawn(nranks: int, program: list, env: dict[str, str], workdir: Path,
          timeout: float = 240.0, kill_on_failure: bool = True) -> tuple[list[Rank], float]:
    """Start ``nranks`` copies of ``program`` as torchrun would; return each rank's result.

    Every rank is in one new process group, so one signal ends them all (and
    anything they started).  When a rank exits non-zero the rest are killed
    at once, as torchrun does (unless not ``kill_on_failure``: then each must end by
    itself); after ``timeout`` seconds all are killed and
    the test fails with their output.  Also returns the seconds it took.
    """
    procs, files = [], []
    start = time.monotonic()
    with held_port() as port:       # held until the ranks end: rank 0's store binds it meanwhile
        try:
            for rank in range(nranks):
                rank_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                RANK=str(rank), WORLD_SIZE=str(nranks), LOCAL_RANK=str(rank),
                                LOCAL_WORLD_SIZE=str(nranks), TORCHELASTIC_RUN_ID="test")
                out = open(workdir / f"rank{rank}.out", "w+")
                err = open(workdir / f"rank{rank}.err", "w+")
                files.append((out, err))
                group = procs[0].pid if procs else 0          # rank 0 leads a new group
                procs.append(subprocess.Popen([str(c) for c in program], env=rank_env,
                                              stdout=out, stderr=err, **_join_group(group)))
            timed_out = False
            while any(p.poll() is None for p in procs):
                if kill_on_failure and any(p.returncode not in (None, 0) for p in procs):
                    break
                if time.monotonic() - start > timeout:
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            if procs:
                _kill_group(procs[0].pid)
            for p in procs:
                p.wait()
    elapsed = time.monotonic() - start
    ranks = []
    for p, (out, err) in zip(procs, files):
        out.seek(0)
        err.seek(0)
        ranks.append(Rank(p.returncode, out.read(), err.read()))
        out.close()
        err.close()
    if timed_out:
        pytest.fail(f"{nranks} ranks of {program} did not end within {timeout} s\n"
                    + _dump(ranks))
    return ranks, elapsed


def _join_group(pgid: int) -> dict:
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _dump(ranks: list[Rank]) -> str:
    return "\n".join(f"--- rank {i} exit {r.code}\n{r.out}\n{r.err[-3000:]}"
                     for i, r in enumerate(ranks))


def gloo_suite(gloo, nranks: int, suite: Path, tmp_path: Path, timeout: float,
               mpich_ranks: tuple[int, ...], args: tuple[str, ...] = ()) -> str:
    """Run a rank-side ``suite`` (with ``args``) over Gloo at ``nranks`` (spawned as
    torchrun would); every rank must exit 0; rank 0's output.  Gloo does not depend on
    the MPI beside it, so in the other environments only ``mpich_ranks`` run."""
    if gloo.name != "openmpi" and nranks not in mpich_ranks:
        pytest.skip(f"Gloo does not depend on the MPI beside it: {nranks} ranks run in .venv/openmpi")
    ranks, _ = spawn(nranks, [gloo.python, suite, "--backend", "gloo", *args], clean_env(gloo.env()),
                     tmp_path, timeout=timeout)
    assert [r.code for r in ranks] == [0] * nranks, _dump(ranks)
    return ranks[0].out


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_rank_suite_under_torchrun_environment(gloo, nranks, tmp_path):
    out = gloo_suite(gloo, nranks, HERE / "rank_suite.py", tmp_path, 300, mpich_ranks=(2,))
    assert f"{nranks} ranks, 0 failures" in out, out
    assert out.startswith("Gloo torch "), out
    # Gloo in torch 2.13 runs every collective on every ddlcomm dtype.
    assert "skipped:" not in out, out


def test_rank_suite_under_mpirun(gloo):
    """No MASTER_ADDR/MASTER_PORT: the ranks meet through a TCP store announced by MPI."""
    env = {k: v for k, v in gloo.env().items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    from conftest import run
    from ddlcomm.launch.commands import on_host
    res = run(*on_host(gloo.launcher, 2, [gloo.python, HERE / "rank_suite.py", "--backend", "gloo"], env), 240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 ranks, 0 failures" in res.stdout and "skipped:" not in res.stdout


RENDEZVOUS = """\
import ddlcomm, numpy as np
comm = ddlcomm.init("gloo")
total = comm.allreduce(np.array([comm.rank + 1], np.int64))[0]
line = f"rank {comm.rank}/{comm.size} local {comm.local_rank} via {comm.rendezvous} sum {total}"
lines = comm.gather_object(line)       # one writer: launchers may interleave ranks' output
if comm.rank == 0:
    for line in lines:
        print(line)
comm.close()
"""


def test_rendezvous_through_mpi(gloo, tmp_path):
    script = tmp_path / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    env = {k: v for k, v in gloo.env().items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    from conftest import run
    from ddlcomm.launch.commands import on_host
    res = run(*on_host(gloo.launcher, 3, [gloo.python, script], env), 120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 3, res.stdout
    for rank, line in enumerate(lines):
        assert line.startswith(f"rank {rank}/3 local {rank} via tcp://127.0.0.1:"), line
        assert line.endswith(" sum 6"), line


def test_rendezvous_through_environment(gloo, tmp_path):
    script = tmp_path / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    ranks, _ = spawn(2, [gloo.python, script], clean_env(gloo.env()), tmp_path)
    assert [r.code for r in ranks] == [0, 0], _dump(ranks)
    lines = ranks[0].out.splitlines()
    assert len(lines) == 2, _dump(ranks)
    for rank, line in enumerate(lines):
        assert line.startswith(f"rank {rank}/2 local {rank} via env://127.0.0.1:"), line
        assert line.endswith(" sum 3"), line


REINIT = """\
import ddlcomm, numpy as np
sums = []
for _ in range(3):                     # the closed communicator's hint: ddlcomm.init() a new one
    comm = ddlcomm.init("gloo")
    sums.append(int(comm.allreduce(np.ones(1, np.int64))[0]))
    comm.close()
print(f"rank {comm.rank} sums {sums}", flush=True)
"""


@pytest.mark.parametrize("how", ["rank 0's store", "torchrun"])
def test_a_closed_communicator_is_followed_by_a_new_one(gloo, tmp_path, how):
    """Under torchrun a second ddlcomm.init after close hung one rank (the first join's keys
    in torchrun's store); each join now has keys of its own."""
    script = tmp_path / "reinit.py"
    script.write_text(REINIT)
    if how == "torchrun":
        from conftest import run
        res = run([gloo.python, "-m", "torch.distributed.run", "--nproc-per-node", "2", script],
                  clean_env(gloo.env()), 120)
        assert res.returncode == 0, res.stdout + res.stderr
        outs = res.stdout
    else:
        ranks, _ = spawn(2, [gloo.python, script], clean_env(gloo.env()), tmp_path, timeout=120)
        assert all(r.code == 0 for r in ranks), _dump(ranks)
        outs = "".join(r.out for r in ranks)
    assert outs.count("sums [2, 2, 2]") == 2, outs


FAILING = """\
import ddlcomm
comm = ddlcomm.init("gloo")
if comm.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
comm.barrier()
print("barrier passed without rank 1")
"""


def test_failing_rank_ends_the_job(gloo, tmp_path):
    """Rank 0, waiting in a barrier for a rank that died, ends by itself with a RankFailure
    (no launcher kills it here)."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    ranks, elapsed = spawn(2, [gloo.python, script], clean_env(gloo.env()), tmp_path,
                           timeout=60, kill_on_failure=False)
    assert elapsed < 60, _dump(ranks)
    assert ranks[1].code == 1 and "rank 1 fails on purpose" in ranks[1].err, _dump(ranks)
    assert ranks[0].code == 1 and "barrier passed" not in ranks[0].out, _dump(ranks)
    assert "RankFailure: backend gloo: another rank " in ranks[0].err, _dump(ranks)


PEER_GONE = """\
import os, sys, time, numpy as np, ddlcomm
gone = sys.argv[1] == "gone"
comm = ddlcomm.init("gloo", timeout_s=2)
a = np.ones(256, np.float32)
comm.allreduce(a, a)
if comm.rank == 1:               # rank 1 ends (its connections close) or stops answering
    if not gone:
        time.sleep(6)
    os._exit(0)
for call in (lambda: comm.allreduce(a, a), lambda: comm.iallreduce(a, a).wait()):
    try:
        call()
    except ddlcomm.DdlcommError as exc:
        print(type(exc).__name__, exc, flush=True)
"""


@pytest.mark.parametrize("how", ["gone", "silent"])
def test_a_lost_peer_is_a_rank_failure(gloo, tmp_path, how):
    """A library user's call under Gloo whose peer died, or did not answer within the
    timeout, raises ddlcomm's RankFailure (one line, as on every backend), not torch's
    RuntimeError with a C++ source path, an emoji and a backtrace."""
    if gloo.name != "openmpi":
        pytest.skip("Gloo does not depend on the MPI beside it: run in .venv/openmpi")
    script = tmp_path / "peer_gone.py"
    script.write_text(PEER_GONE)
    ranks, _ = spawn(2, [gloo.python, script, how], clean_env(gloo.env()), tmp_path, timeout=60)
    assert [r.code for r in ranks] == [0, 0], _dump(ranks)
    lines = ranks[0].out.splitlines()
    assert len(lines) == 2 and all(line.startswith("RankFailure backend gloo: another rank ")
                                   for line in lines), _dump(ranks)
    if how == "gone":
        assert "closed its connection (it died or ended)" in lines[0], lines
    else:
        assert "did not answer within the timeout: Timed out waiting 2000ms" in lines[0], lines
    assert "GLHF" not in ranks[0].out and ".cc:" not in ranks[0].out


NO_PEERS = """\
import ddlcomm
from ddlcomm.errors import BackendUnavailable
try:
    ddlcomm.init("gloo")
except BackendUnavailable as exc:
    print(exc)
"""


@pytest.mark.parametrize("launcher_env, message", [
    ({}, "backend gloo needs a launcher to start its ranks (torchrun, mpirun, srun) "
         "(or let ddlcomm start them: ddlcomm bench --backend gloo --ranks N)"),
    ({"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "x"},
     "backend gloo cannot find its peers (started by torchrun, no MASTER_ADDR/MASTER_PORT) "
     "(set MASTER_ADDR and MASTER_PORT, or start the ranks under torchrun or mpirun "
     "(with mpi4py installed))"),
])
def test_missing_rendezvous_is_explained(gloo, tmp_path, launcher_env, message):
    script = tmp_path / "no_peers.py"
    script.write_text(textwrap.dedent(NO_PEERS))
    env = dict(clean_env(gloo.env()), **launcher_env)
    res = subprocess.run([str(gloo.python), script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == message


def test_missing_torch_says_what_to_install(monkeypatch):
    from ddlcomm.comm import torchdist
    from ddlcomm.errors import BackendUnavailable
    monkeypatch.setattr(torchdist, "dist", None)
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch raises ImportError
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(BackendUnavailable) as err:
        torchdist.GlooCommunicator()
    assert str(err.value) == ("backend gloo needs PyTorch "
                              "(pip install 'ddlcomm[torch]' (torch==2.13.0 here))")
