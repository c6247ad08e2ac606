"""Tests of the pure parts of ddlcomm.launch: launcher detection, the mpirun command line,
the layout of ranks over containers and cpus, launcher command lines without containers,
and what the containers read of the host's mounts."""
from __future__ import annotations

from pathlib import Path

import pytest

from ddlcomm.errors import UnsupportedError, UsageError
from ddlcomm.launch import commands, containers, cpuset, mpirun, namespaces, placement
from ddlcomm.launch.env import LaunchInfo, detect
from ddlcomm.units import parse_id_list
from ddlcomm.launch.mpirun import HYDRA_OVERSUBSCRIBED, MPILauncher, family_of


@pytest.mark.parametrize("env, want", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     LaunchInfo("openmpi", 3, 8, 1)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2"}, LaunchInfo("hydra", 2, 4, 2)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "0"}, LaunchInfo("hydra", 2, 4, 0)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, LaunchInfo("hydra", 1, 2, None)),  # none said: MPI works it out
    # srun --mpi=pmi2 sets no local rank of PMI's: every rank took 0 (and GPU 0)
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"},
     LaunchInfo("hydra", 3, 4, 1)),
    ({"PMIX_RANK": "5", "PMIX_SIZE": "6", "PMIX_LOCAL_RANK": "1"}, LaunchInfo("pmix", 5, 6, 1)),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3", "SLURM_STEP_ID": "0"},
     LaunchInfo("slurm", 7, 16, 3)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"},
     LaunchInfo("torchrun", 1, 2, 1)),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "node0"}, LaunchInfo("torchrun", 1, 2, None)),
    # Open MPI wins over the Slurm variables of the allocation it runs in
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "0",
      "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}, LaunchInfo("openmpi", 0, 2, None)),
])
def test_detect(env, want):
    assert detect(env) == want


@pytest.mark.parametrize("env", [
    {},
    {"RANK": "0"},                                           # a stray RANK
    {"RANK": "0", "WORLD_SIZE": "4"},                        # ... even with WORLD_SIZE
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"},              # batch script, not a job step
    {"PMI_RANK": "0"},                                       # size missing
    {"OMPI_COMM_WORLD_RANK": "one", "OMPI_COMM_WORLD_SIZE": "2"},
    {"PMI_RANK": "0", "PMI_SIZE": ""},
])
def test_detect_none(env):
    assert detect(env) is None


def test_detect_skips_a_launcher_with_non_integer_values():
    env = {"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2",
           "PMI_RANK": "1", "PMI_SIZE": "2"}
    assert detect(env) == LaunchInfo("hydra", 1, 2, None)


def test_detect_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("PMIX_RANK", "0")
    monkeypatch.setenv("PMIX_SIZE", "3")
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert detect() == LaunchInfo("pmix", 0, 3, None)


@pytest.mark.parametrize("text, family", [
    ("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/", "openmpi"),
    ("mpirun (OpenRTE) 4.1.6", "openmpi"),
    ("prterun (PMIx Reference RunTime Environment (PRRTE)) 3.0.6", "openmpi"),
    ("HYDRA build details:\n    Version:                                 5.0.2\n"
     "    Release Date:                            Mon Feb 10 2025", "hydra"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n"
     "Copyright 2003-2023, Intel Corporation.\nHYDRA build details:", "hydra"),
    ("", "unknown"),
    ("srun: command not found", "unknown"),
])
def test_family_of(text, family):
    assert family_of(text) == family


@pytest.mark.parametrize("family", ["openmpi", "hydra", "unknown"])
@pytest.mark.parametrize("ranks, cores", [(2, 4), (4, 4), (5, 4), (64, 1)])
def test_command(family, ranks, cores):
    cmd, extra = commands.mpirun_command(MPILauncher("/env/bin/mpirun", family), None, ranks,
                                         ["python", "-m", "x"], cores=cores)
    assert cmd[:3] == ["/env/bin/mpirun", "-n", str(ranks)]
    assert cmd[-3:] == ["python", "-m", "x"]
    over = ranks > cores
    if family == "openmpi":       # unbound always: train and the C reference were bound to cores
        assert cmd[3:-3] == (["--oversubscribe"] if over else []) + ["--bind-to", "none"]
    else:
        assert len(cmd) == 6
    assert extra == (mpirun.HYDRA_OVERSUBSCRIBED if family == "hydra" and over else {})


def test_on_host_is_benchs_rule_with_the_launchers_environment(monkeypatch):
    """train and the C reference built their own command line: Open MPI's ranks bound to
    cores by its default where bench's ran unbound, MPICH's throttle by os.cpu_count()
    where bench counted the cpus this process may use."""
    monkeypatch.setattr(commands, "host_cpus", lambda: (2, 2))
    hydra = MPILauncher("mpiexec", "hydra")
    cmd, env = commands.on_host(hydra, 3, ["prog"], {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"})
    assert cmd == ["mpiexec", "-n", "3", "prog"]
    assert env == {**mpirun.HYDRA_OVERSUBSCRIBED, "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}  # the caller's wins
    assert commands.on_host(hydra, 2, ["prog"], {})[1] == {}
    cmd, _ = commands.on_host(MPILauncher("mpirun", "openmpi"), 2, ["prog"], {})
    assert cmd == ["mpirun", "-n", "2", "--bind-to", "none", "prog"]


@pytest.mark.parametrize("euid", [0, 1000])
@pytest.mark.parametrize("family", ["openmpi", "hydra", "unknown"])
def test_environment(monkeypatch, family, euid):
    monkeypatch.setattr(mpirun.os, "geteuid", lambda: euid, raising=False)
    base = {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "0"}
    env = MPILauncher("mpirun", family).environment(base)
    root_openmpi = family == "openmpi" and euid == 0
    assert env["PATH"] == "/bin"
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "0"                  # the caller's choice is kept
    assert ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM" in env) == root_openmpi
    assert base == {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "0"}   # not modified


def test_environment_adds_both_root_variables(monkeypatch):
    monkeypatch.setattr(mpirun.os, "geteuid", lambda: 0, raising=False)
    env = MPILauncher("mpirun", "openmpi").environment({})
    assert env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   **mpirun.OPENMPI_LOCAL_BTL}
    assert MPILauncher("mpirun", "hydra").environment({}) == {}


def test_open_mpi_ranks_leave_out_the_ofi_btl_unless_the_user_chose():
    ompi = MPILauncher("mpirun", "openmpi")
    assert ompi.environment({})["OMPI_MCA_btl"] == "^ofi"
    assert ompi.environment({"OMPI_MCA_btl": "self,tcp"})["OMPI_MCA_btl"] == "self,tcp"
    assert "OMPI_MCA_btl" not in MPILauncher("mpiexec", "hydra").environment({})


# ------------------------------------------------------------------ placement (pure)
@pytest.mark.parametrize("nranks,k,expected", [
    (4, 2, [[0, 1], [2, 3]]), (5, 2, [[0, 1, 2], [3, 4]]), (4, 4, [[0], [1], [2], [3]]),
    (3, 1, [[0, 1, 2]]), (7, 3, [[0, 1, 2], [3, 4], [5, 6]])])
def test_split_ranks_in_blocks(nranks, k, expected):
    assert placement.split_ranks(nranks, k) == expected


@pytest.mark.parametrize("nranks,k", [(2, 3), (0, 1), (2, 0), (True, 1), ("2", 1)])
def test_split_ranks_rejects(nranks, k):
    with pytest.raises(UsageError):
        placement.split_ranks(nranks, k)


def test_transport():
    assert placement.transport(0, 0) == "shared memory"
    assert placement.transport(0, 1) == "tcp"


def test_cpu_plans():
    plan = placement.cpu_sets(2, "core", [0, 1, 2, 3], {0: [0, 1, 2, 3]})
    assert plan.cpus == [[0, 2], [1, 3]] and not plan.notes
    plan = placement.cpu_sets(3, "core", [0, 1], {0: [0, 1]})
    assert plan.cpus == [[0], [1], [0]] and "share" in plan.notes[0]
    plan = placement.cpu_sets(3, "numa", [0, 1, 2, 3], {0: [0, 1], 1: [2, 3]})
    assert plan.cpus == [[0, 1], [2, 3], [0, 1]] and plan.mems == [[0], [1], [0]]
    assert placement.cpu_sets(2, "none", [0], {}).cpus == [None, None]
    with pytest.raises(UsageError, match="binding"):
        placement.cpu_sets(2, "socket", [0], {})
    assert parse_id_list("0-2,5,7-8\n") == [0, 1, 2, 5, 7, 8]


def test_commands_past_the_physical_cores_take_hardware_threads():
    """16 cpus on 8 cores (2 threads each): Open MPI counts 8 slots and would refuse 12
    ranks; the threads become the slots, dealt a core at a time, and bound one each."""
    ompi, hydra = MPILauncher("mpirun", "openmpi"), MPILauncher("mpiexec", "hydra")
    cmd, _ = commands.mpirun_command(ompi, None, 12, ["prog"], "core", cores=16, physical=8)
    assert cmd == ["mpirun", "-n", "12", "--use-hwthread-cpus", "--map-by", "core",
                   "--bind-to", "hwthread", "prog"]
    cmd, _ = commands.mpirun_command(ompi, None, 8, ["prog"], "core", cores=16, physical=8)
    assert cmd == ["mpirun", "-n", "8", "--bind-to", "core", "prog"]
    cmd, _ = commands.mpirun_command(ompi, None, 12, ["prog"], "numa", cores=16, physical=8)
    assert cmd[3:6] == ["--use-hwthread-cpus", "--map-by", "core"] and cmd[-2] == "numa"
    cmd, _ = commands.mpirun_command(hydra, None, 12, ["prog"], "core", cores=16, physical=8)
    assert cmd == ["mpiexec", "-n", "12", "-bind-to", "core", "prog"]   # Hydra counts no slots
    assert mpirun.openmpi_slots(17, 16, 8) == ["--oversubscribe"]
    assert mpirun.openmpi_slots(4, 16, 8) == []


def test_physical_cores_from_sysfs(tmp_path):
    for cpu, (package, core) in enumerate([(0, 0), (0, 1), (0, 0), (0, 1), (1, 0)]):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    assert placement.physical_cores([0, 1, 2, 3, 4], tmp_path) == 3
    assert placement.physical_cores([0, 2], tmp_path) == 1
    assert placement.physical_cores([0, 9], tmp_path) == 2       # cpu9: sysfs does not say


def test_commands_without_containers():
    ompi, hydra = MPILauncher("mpirun", "openmpi"), MPILauncher("mpiexec", "hydra")
    cmd, env = commands.mpirun_command(ompi, None, 4, ["prog"], "core", cores=2)
    # dealt round the cores, as the other launchers place them (it filled core 0 first)
    assert cmd == ["mpirun", "-n", "4", "--oversubscribe", "--map-by", "core", "--rank-by",
                   "span", "--bind-to", "core:overload-allowed", "prog"] and env == {}
    cmd, _ = commands.mpirun_command(ompi, None, 2, ["prog"], "none", cores=2)
    assert cmd == ["mpirun", "-n", "2", "--bind-to", "none", "prog"]
    cmd, env = commands.mpirun_command(hydra, None, 2, ["prog"], "numa", cores=2)
    assert cmd == ["mpiexec", "-n", "2", "-bind-to", "numa", "prog"] and env == {}
    cmd, env = commands.mpirun_command(hydra, None, 3, ["prog"], "none", cores=2)
    assert cmd == ["mpiexec", "-n", "3", "prog"] and env == HYDRA_OVERSUBSCRIBED
    with pytest.raises(UnsupportedError, match="neither"):
        commands.mpirun_command(MPILauncher("x", "unknown"), None, 2, ["prog"], "core")
    assert commands.spawn_prefixes(None, 2) == [[], []]
    # Ranks on the host (gloo's spawner): taskset per rank, the deal containers get.
    core = commands.host_bind_prefixes(3, "core", available=[0, 1], nodes={0: [0, 1]})
    assert [p[1:] for p in core] == [["-c", "0"], ["-c", "1"], ["-c", "0"]]
    numa = commands.host_bind_prefixes(2, "numa", available=[0, 1, 2, 3], nodes={0: [0, 1], 1: [2, 3]})
    assert [p[1:] for p in numa] == [["-c", "0,1"], ["-c", "2,3"]]
    assert commands.host_bind_prefixes(2, "none") == [[], []]
    assert commands.master_addr(None) == "127.0.0.1"


def test_format_cpulist_round_trips():
    assert placement.format_cpulist([0, 2, 3]) == "0,2,3"
    assert parse_id_list(placement.format_cpulist([1, 5, 6])) == [1, 5, 6]


def test_launch_modules_import_no_circle():
    """containers and commands import placement; placement imports neither (nor, lazily, anything)."""
    import ast
    import inspect

    def imported(module) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names |= {node.module} if node.module else {a.name for a in node.names}
        return names
    assert imported(placement) == set()
    assert "commands" not in imported(containers) and "placement" in imported(containers)
    assert {"containers", "placement"} <= imported(commands)


def test_mounts_are_read_from_mountinfo(tmp_path):
    points = {mp: fstype for mp, fstype, _ in namespaces.mountinfo()}
    assert points.get("/proc") == "proc"
    assert namespaces.mounted(Path("/proc")) and not namespaces.mounted(tmp_path)
    # Inside a container's fresh /sys, the host's cgroup hierarchies are mounted again.
    remount = cpuset.cgroup_remount()
    assert remount == "true" or "/sys/fs/cgroup" in remount


def test_a_rank_killed_by_a_signal_is_named_as_the_cause(capfd):
    """Rank 1 killed outright: rank 0's 'Connection reset by peer' (exit 3) came first in
    rank order and was the job's exit code; the killed rank went unnamed."""
    import os
    import sys

    from ddlcomm.launch import spawn
    program = [sys.executable, "-c",
               "import os, signal, time\n"
               "if os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
               "time.sleep(0.5); raise SystemExit(3)"]
    assert spawn.run(2, program, dict(os.environ)) == 128 + 9
    assert "ddlcomm: rank 1 was killed by SIGKILL" in capfd.readouterr().err


def test_a_later_rank_failing_ends_the_others_at_once():
    """Only the lowest live rank was polled: rank 1's exit 5 went unseen while rank 0 slept
    on (waiting in a collective, under Gloo), and the job took rank 0's whole 20 s."""
    import os
    import time

    from ddlcomm.launch import spawn
    program = ["sh", "-c", '[ "$RANK" = 1 ] && exit 5; sleep 20']
    begun = time.monotonic()
    assert spawn.run(2, program, dict(os.environ), grace_s=2) == 5
    assert time.monotonic() - begun < 10


def test_a_rank_that_cannot_start_ends_those_started():
    """Rank 1's prefix missing: FileNotFoundError left rank 0 running in its own session."""
    import glob
    import os

    from ddlcomm.errors import BackendUnavailable, UsageError
    from ddlcomm.launch import spawn
    program = ["sleep", "30.0417"]                  # a command line no other process has
    with pytest.raises(BackendUnavailable, match="cannot start rank 1: .*no/such/taskset"):
        spawn.run(2, program, dict(os.environ), grace_s=2, prefixes=[[], ["/no/such/taskset", "-c", "1"]])

    def alive() -> list:
        found = []
        for path in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                with open(path, "rb") as f:
                    if f.read() == b"sleep\x0030.0417\x00":
                        found.append(path)
            except OSError:
                pass
        return found
    assert alive() == []
    with pytest.raises(UsageError, match="cannot start 0 ranks"):
        spawn.run(0, program, dict(os.environ))


def test_a_rank_that_ignores_sigterm_is_killed_with_its_group():
    """A started rank deaf to SIGTERM (its whole process group) is SIGKILLed ``grace_s``
    later and reaped, when a later rank cannot start."""
    import os
    import subprocess
    import time

    from ddlcomm.errors import BackendUnavailable
    from ddlcomm.launch import spawn
    program = ["sh", "-c", "trap '' TERM; sleep 30.0418 & wait"]
    begun = time.monotonic()
    with pytest.raises(BackendUnavailable, match="cannot start rank 1"):
        spawn.run(2, program, dict(os.environ), grace_s=1, prefixes=[[], ["/no/such/taskset"]])
    assert time.monotonic() - begun < 5
    left = subprocess.run(["pgrep", "-f", "sleep 30.0418"], capture_output=True, text=True)
    assert left.stdout == ""



def _launcher(tmp_path: Path, first: str) -> list[str]:
    """A stand-in for a launcher whose first launch runs ``first`` (Python, with ``sys``) and
    exits 213, as Open MPI's mpirun did when its PMIx server could not start, and whose
    second launch writes 'SECOND LAUNCH' and exits 0."""
    import sys
    once = tmp_path / "launched-once"
    return [sys.executable, "-c",
            "import os, pathlib, sys\n"
            f"once = pathlib.Path({str(once)!r})\n"
            f"if not once.exists(): once.touch(); {first}; sys.exit(213)\n"
            "sys.stderr.write('SECOND LAUNCH\\n')"]


def test_a_launcher_that_failed_before_any_rank_started_is_started_once_more(tmp_path, capfd):
    import os
    cmd = _launcher(tmp_path, f"sys.stderr.write({mpirun.NOT_STARTED!r} + '\\n')")
    assert mpirun.run(cmd, dict(os.environ)) == 0
    err = capfd.readouterr().err
    order = [err.index(s) for s in (mpirun.NOT_STARTED, "starting it once more", "SECOND LAUNCH")]
    assert order == sorted(order)


def test_a_launcher_whose_rank_started_is_not_started_again(tmp_path, capfd):
    """A rank marks its start (the ddlcomm command calls mark_started first): its failure
    is the run's, not the launcher's."""
    import os
    cmd = _launcher(tmp_path, "from ddlcomm.launch.mpirun import mark_started; mark_started()")
    assert mpirun.run(cmd, dict(os.environ)) == 213
    assert "SECOND" not in capfd.readouterr().err


def test_not_started_is_the_pmix_failure_only():
    said = f"----\n{mpirun.NOT_STARTED}. We cannot\ncontinue.\n"
    assert mpirun.not_started(213, said)
    assert not mpirun.not_started(0, said)
    assert not mpirun.not_started(1, "a rank exited with status 1")


def test_mark_started_outside_a_launch_does_nothing(tmp_path):
    mpirun.mark_started({})
    mpirun.mark_started({mpirun.STARTED_ENV: str(tmp_path / "gone" / "started")})  # no error
    mpirun.mark_started({mpirun.STARTED_ENV: str(tmp_path / "started")})
    assert (tmp_path / "started").exists()


def test_the_ranks_read_none_of_the_callers_input(tmp_path):
    """mpirun hands its stdin to rank 0: a bench in a shell loop reading lines took the rest
    of them.  Both launchers start the ranks with no input."""
    import os
    import subprocess
    import sys
    read = tmp_path / "read"
    program = [sys.executable, "-c", f"import sys, pathlib; pathlib.Path({str(read)!r} + "
               "__import__('os').environ.get('RANK', '')).write_text(sys.stdin.read())"]
    driver = (f"import sys; sys.path[:0] = {sys.path!r}\n"
              "from ddlcomm.launch import mpirun, spawn\n"
              f"mpirun.run({program!r}, dict(__import__('os').environ))\n"
              f"spawn.run(1, {program!r}, dict(__import__('os').environ))\n")
    rest = subprocess.run([sys.executable, "-c", driver + "print(sys.stdin.read(), end='')"],
                          input="a\nb\n", capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout == "a\nb\n"                                  # still the caller's
    assert read.read_text() == "" and (tmp_path / "read0").read_text() == ""


def test_hydras_signal_codes_read_as_the_shells():
    """MPICH's mpiexec gave a rank killed by SIGKILL as exit code 9: the run said
    'ranks ended with exit code 9', no signal named."""
    from ddlcomm.bench.runs import ended_with
    hydra, prte = MPILauncher("mpiexec", "hydra"), MPILauncher("mpirun", "openmpi")
    assert [hydra.exit_code(rc) for rc in (0, 1, 2, 3, 9, 15, 130)] == [0, 1, 2, 3, 137, 143, 130]
    assert prte.exit_code(9) == 9
    assert ended_with(hydra.exit_code(9)) .startswith("ranks ended with exit code 137 (SIGKILL: killed outright")


def test_a_launch_not_started_is_launched_once_more():
    import subprocess
    said = iter([(213, mpirun.NOT_STARTED), (213, mpirun.NOT_STARTED), (0, "")])
    runs = []

    def launch() -> subprocess.CompletedProcess:
        code, err = next(said)
        runs.append(code)
        return subprocess.CompletedProcess([], code, "", err)
    assert mpirun.once_more_if_not_started(launch).returncode == 213     # once more, not again
    assert runs == [213, 213]
    failed = mpirun.once_more_if_not_started(lambda: subprocess.CompletedProcess([], 1, "out", "a rank failed"))
    assert failed.returncode == 1 and failed.stdout == "out"
