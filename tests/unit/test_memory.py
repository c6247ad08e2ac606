"""Tests of memory kinds (ddlcomm.memory): real allocations, read back from the kernel.

Nothing of the kernel is mocked: each test maps memory, writes it, and reads
what it got from /proc/self/smaps and move_pages(2).
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ddlcomm import memory
from ddlcomm.dtypes import get_dtype
from ddlcomm.errors import UnsupportedError, UsageError
from ddlcomm.units import parse_id_list
from ddlcomm.memory import hbw, numa, pagescan, shared, smaps, vm
from ddlcomm.memory.gpu import cuda_available

MiB = 1 << 20
SRC = str(Path(__file__).resolve().parents[2] / "src")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory kinds need Linux")


def written(buf: memory.Buffer, value: int = 7) -> np.ndarray:
    """Fill the whole buffer (placement is read after the pages were touched)."""
    a = buf.array(np.uint8, buf.nbytes)
    a[:] = value
    return a


def is_mapped(address: int) -> bool:
    with open("/proc/self/smaps") as f:
        return any(v.start <= address < v.end for v in smaps.parse_smaps(f.read()))


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": SRC, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=120)


# -- parse / check / registry ---------------------------------------------------------------

@pytest.mark.parametrize("spec, parsed", [
    ("pageable", ("pageable", None)), ("hugepage", ("hugepage", None)), ("numa:1", ("numa", "1")),
    (" numa:01 ", ("numa", "1")), ("shared", ("shared", None)), ("hbw", ("hbw", None)),
    ("pinned", ("pinned", None)), ("device", ("device", None)),
])
def test_parse(spec, parsed):
    assert memory.parse(spec) == parsed


def test_parse_unknown_kind_lists_the_choices():
    with pytest.raises(UsageError) as err:
        memory.parse("hugepages")
    assert "'hugepages'" in str(err.value)
    for name in ("pageable", "hugepage", "numa:N", "hbw", "shared", "pinned", "device"):
        assert name in err.value.hint


@pytest.mark.parametrize("spec, words", [
    ("", "empty"), ("numa", "numa:0"), ("numa:", "NUMA node number"), ("numa:x", "'numa:x'"),
    ("numa:-1", "'numa:-1'"), ("pageable:3", "takes no argument"), ("hugepage:", "takes no argument"),
])
def test_parse_errors(spec, words):
    with pytest.raises(UsageError) as err:
        memory.parse(spec)
    assert words in str(err.value)


def test_registry_holds_every_kind_and_imports_lazily():
    assert set(memory.KINDS) == {"pageable", "hugepage", "numa", "hbw", "shared", "pinned", "device"}
    out = run_python("""
        import sys, ddlcomm.memory
        print(sorted(m for m in sys.modules if m.startswith("ddlcomm.memory.") or m == "torch"))
    """)
    assert out.returncode == 0, out.stderr
    assert "torch" not in out.stdout and "gpu" not in out.stdout and "hbw" not in out.stdout


@pytest.mark.parametrize("nbytes", [-1, 1.5, "4", True])
def test_allocate_rejects_bad_sizes(nbytes):
    with pytest.raises(UsageError, match="whole number of bytes"):
        memory.allocate("pageable", nbytes)


def test_unknown_hbw_fallback_is_refused_for_any_kind():
    with pytest.raises(UsageError) as err:
        memory.check("pageable", hbw_fallback="ddr")
    assert "dram" in err.value.hint


# -- pageable ----------------------------------------------------------------------------------

def test_pageable_gets_no_huge_pages():
    with memory.allocate("pageable", 64 * MiB) as buf:
        written(buf)
        place = buf.placement()
    assert place["memory"] == "pageable" and place["nbytes"] == 64 * MiB
    assert place["huge_kb"] == 0
    assert place["rss_kb"] == 64 * 1024 and place["vmas"] == 1 and place["smaps_exclusive"]
    if vm.thp_mode() is not None:
        assert "nh" in place["vm_flags"].split()         # MADV_NOHUGEPAGE really set
    if place["numa_nodes"] is not None:
        assert sum(place["numa_nodes"].values()) == 16384 and place["pages_absent"] == 0


def test_placement_sees_untouched_pages():
    with memory.allocate("pageable", 4 * MiB) as buf:
        buf.array(np.uint8, MiB)[:] = 1                  # touch the first quarter only
        place = buf.placement()
    assert place["rss_kb"] == 1024
    if place["numa_nodes"] is not None:
        assert place["pages_absent"] == 768


# -- hugepage ----------------------------------------------------------------------------------

def test_hugepage_gets_huge_pages():
    if vm.thp_mode() in (None, "never") and vm.meminfo().get("HugePages_Free", 0) < 32:
        pytest.skip(f"THP is {vm.thp_mode() or 'absent'} and the hugetlb pool has < 32 free pages")
    with memory.allocate("hugepage", 64 * MiB) as buf:
        assert buf.address % (2 * MiB) == 0
        written(buf)
        place = buf.placement()
    assert place["method"] in ("thp", "hugetlb")
    assert place["huge_kb"] > 0
    if place["method"] == "thp":
        assert "hg" in place["vm_flags"].split() and place["thp_mode"] == vm.thp_mode()
        assert "hugetlb_refused" in place
    else:
        assert place["page_kb"] == 2048 and place["huge_kb"] == 64 * 1024


def test_hugepage_asks_the_pool_of_its_own_page_size(monkeypatch):
    """MAP_HUGETLB alone takes the default pool, 1 GiB pages where the machine boots with
    default_hugepagesz=1G: a 2 MiB-aligned mapping then failed (EINVAL) whatever the 2 MiB
    pool held.  The flags name the page size (MAP_HUGE_2MB: 21 << 26)."""
    from ddlcomm.memory import hugepage
    assert vm.map_huge(2 * MiB) == vm.MAP_HUGETLB | 21 << 26
    assert vm.map_huge(1 << 30) == vm.MAP_HUGETLB | 30 << 26
    asked = []

    def refuse(length, *, align, flags=0, fd=-1):
        asked.append(flags)
        raise OSError(22, "refused here")
    monkeypatch.setattr(vm, "huge_page_bytes", lambda: 2 * MiB)
    monkeypatch.setattr(vm, "thp_mode", lambda: "never")
    monkeypatch.setattr(vm, "hugetlb_pages", lambda page_bytes: 8 if page_bytes == 2 * MiB else 0)
    monkeypatch.setattr(vm, "map_region", refuse)
    with pytest.raises(UnsupportedError, match="hugetlb refused"):
        hugepage.allocate("hugepage", None, MiB, None)
    assert asked == [vm.MAP_PRIVATE | vm.MAP_ANONYMOUS | vm.map_huge(2 * MiB)]
    # the 2 MiB pool counts, not /proc/meminfo's HugePages_Total (the default pool's)
    monkeypatch.setattr(vm, "hugetlb_pages", lambda page_bytes: 0)
    with pytest.raises(UnsupportedError, match="no hugetlb pages are reserved"):
        hugepage.check(None, None)


def test_hugepage_rounds_up_to_whole_huge_pages():
    if vm.thp_mode() in (None, "never"):
        pytest.skip("THP is not enabled")
    with memory.allocate("hugepage", 3 * MiB) as buf:
        written(buf)
        assert buf.placement()["mapped_kb"] == 4 * 1024


# -- the pages of one range (PAGEMAP_SCAN) ------------------------------------------------------

def test_pagescan_tells_huge_pages_from_small_ones_in_one_range():
    """``pagescan.huge_share`` reads one range's pages, not its mapping's: a pageable buffer
    none huge, a hugepage one all (THP), a NumPy array's untouched tail not counted."""
    with memory.allocate("pageable", 8 * MiB) as small:
        written(small)
        share = pagescan.huge_share([(small.address, small.nbytes)])
    if not pagescan.available():
        assert share is None
        pytest.skip("this kernel has no PAGEMAP_SCAN (Linux 6.7 and later)")
    assert share == 0.0
    if vm.thp_mode() in (None, "never"):
        pytest.skip("THP is not enabled: no huge pages to tell apart")
    with memory.allocate("hugepage", 8 * MiB) as huge:
        written(huge)
        assert pagescan.huge_share([(huge.address, huge.nbytes)]) == 1.0
        assert pagescan.huge_bytes([(huge.address, MiB), (huge.address + 4 * MiB, MiB)]) == (2 * MiB, 2 * MiB)
    with memory.allocate("pageable", 4 * MiB) as part:
        part.array(np.uint8, MiB)[:] = 1                  # the first quarter present
        assert pagescan.huge_bytes([(part.address, part.nbytes)]) == (0, MiB)
    assert pagescan.huge_share([]) == 0.0


# -- numa ------------------------------------------------------------------------------------

def test_numa0_puts_every_page_on_node0():
    with memory.allocate("numa:0", 64 * MiB) as buf:
        written(buf)
        place = buf.placement()
    if place["numa_nodes"] is None:
        pytest.skip(f"move_pages refused: {place['numa_error']}")
    assert place["method"] == "mbind" and place["node"] == 0
    assert place["numa_nodes"] == {"0": 16384} and place["pages_absent"] == 0
    assert place["huge_kb"] == 0


def test_numa_binding_is_visible_in_numa_maps():
    with memory.allocate("numa:0", 2 * MiB) as buf:
        written(buf)
        with open("/proc/self/numa_maps") as f:
            line = next(l for l in f if int(l.split()[0], 16) == buf.address)
    assert "bind:0" in line


def test_missing_numa_node_names_the_nodes():
    nodes = numa.available_nodes()
    missing = 7 if 7 not in nodes else max(nodes) + 1
    for call in (lambda: memory.check(f"numa:{missing}"), lambda: memory.allocate(f"numa:{missing}", MiB)):
        with pytest.raises(UsageError) as err:
            call()
        assert f"NUMA node {missing} does not exist" in str(err.value)
        assert ", ".join(map(str, nodes)) in str(err.value)
        assert f"numa:{nodes[0]}" in err.value.hint


def test_a_node_the_cpuset_leaves_out_is_not_said_to_be_missing(monkeypatch):
    monkeypatch.setattr(numa, "nodes_with_memory", lambda: [0, 1])
    monkeypatch.setattr(numa, "allowed_nodes", lambda: [0])
    with pytest.raises(UsageError, match="node 1 has memory, but this process's cpuset does not allow it"):
        numa.check("1", None)
    with pytest.raises(UsageError, match="node 2 does not exist here"):
        numa.check("2", None)


@pytest.mark.parametrize("text, nodes", [("0", [0]), ("0-3", [0, 1, 2, 3]), ("0,2-3,7", [0, 2, 3, 7]),
                                         ("", []), ("1\n", [1])])
def test_parse_node_list(text, nodes):
    assert parse_id_list(text) == nodes


# -- shared ----------------------------------------------------------------------------------

def test_shared_segment_is_named_visible_to_another_process_and_unlinked_on_free():
    buf = memory.allocate("shared", 8 * MiB)
    name = buf.placement()["shm_name"]
    assert str(os.getpid()) in name
    path = Path(shared.SHM_DIR) / name
    assert path.exists()
    a = buf.array(np.float32, 1000)
    a[:] = np.arange(1000)
    out = run_python(f"""
        import numpy as np
        from ddlcomm.memory import shared
        with shared.attach({name!r}) as buf:
            a = buf.array(np.float32, 1000)
            print(buf.nbytes, float(a.sum()), buf.placement()["attached"])
            a[0] = -1.0                                  # the creator sees the write
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(8 * MiB), str(float(np.arange(1000).sum())), "True"]
    assert a[0] == -1.0
    del a
    buf.free()
    assert not path.exists()
    buf.free()                                           # idempotent


def test_shared_attach_of_a_missing_name():
    with pytest.raises(UsageError, match="no shared-memory segment"):
        shared.attach("ddlcomm-no-such-segment")
    with pytest.raises(UsageError):
        shared.attach("../etc/passwd")


def test_two_shared_buffers_have_different_names():
    with memory.allocate("shared", 4096) as a, memory.allocate("shared", 4096) as b:
        assert a.placement()["shm_name"] != b.placement()["shm_name"]


# -- hbw -------------------------------------------------------------------------------------

def test_hbw_is_refused_without_hbw_and_falls_back_to_dram_when_asked():
    if hbw.unavailable() is None:
        pytest.skip("this machine has high-bandwidth memory")
    for call in (lambda: memory.check("hbw"), lambda: memory.allocate("hbw", MiB)):
        with pytest.raises(UnsupportedError) as err:
            call()
        assert "memkind" in str(err.value) or "no high-bandwidth memory" in str(err.value)
        assert "hbw_fallback='dram'" in err.value.hint
    memory.check("hbw", hbw_fallback="dram")
    with memory.allocate("hbw", 4 * MiB, hbw_fallback="dram") as buf:
        written(buf)
        place = buf.placement()
    assert buf.kind == "hbw"
    assert place["fallback"] == "dram" and place["memory"] == "pageable"
    assert place["fallback_reason"] == hbw.unavailable()[0]
    assert place["rss_kb"] == 4096 and place["huge_kb"] == 0


def test_hbw_malloc_path_with_memkind_told_node0_is_hbw():
    try:
        hbw._memkind()
    except OSError:
        pytest.skip(f"{hbw.LIBRARY} is not installed")
    out = run_python("""
        from ddlcomm import memory
        with memory.allocate("hbw", 8 << 20) as buf:
            buf.array("uint8", 8 << 20)[:] = 1
            p = buf.placement()
        print(p["method"], p["hbw_verified"], p["numa_nodes"], p["smaps_exclusive"])
    """, MEMKIND_HBW_NODES="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["hbw_malloc", "True"]


# -- GPU kinds -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pinned", "device"])
def test_gpu_kinds_are_refused_without_a_gpu(kind):
    if cuda_available()[0]:
        pytest.skip("a GPU is present: the refusal cannot be tested")
    for call in (lambda: memory.check(kind), lambda: memory.allocate(kind, MiB)):
        with pytest.raises(UnsupportedError) as err:
            call()
        assert f"memory kind {kind} needs a GPU: {cuda_available()[1]}" in str(err.value)
        assert "pageable" in err.value.hint


# -- Buffer ------------------------------------------------------------------------------------

def test_free_is_idempotent_and_unmaps():
    buf = memory.allocate("pageable", MiB)
    written(buf)
    address = buf.address
    assert is_mapped(address)
    buf.free()
    buf.free()
    assert buf.freed and not is_mapped(address)
    for call in (lambda: buf.array(np.float32, 1), buf.placement):
        with pytest.raises(UsageError, match="freed"):
            call()


def test_context_manager_frees():
    with memory.allocate("hugepage", MiB) as buf:
        address = buf.address
    assert buf.freed and not is_mapped(address)


def test_dropped_buffer_lives_while_a_view_does():
    buf = memory.allocate("pageable", MiB)
    view = buf.array(np.int64, 100)
    address = buf.address
    del buf
    gc.collect()
    view[:] = 5                                          # still mapped
    assert is_mapped(address) and view.sum() == 500
    del view
    gc.collect()
    assert not is_mapped(address)


def test_array_views():
    with memory.allocate("pageable", 1000) as buf:
        a = buf.array("float32", 250)
        assert a.shape == (250,) and a.dtype == np.float32
        assert a.flags.c_contiguous and a.flags.writeable and a.ctypes.data == buf.address
        assert buf.array(get_dtype("float64"), 125).dtype == np.float64
        assert buf.array(np.uint8, 0).size == 0
        a[:] = 3
        assert buf.array(np.float32, 250).sum() == 750   # views share the bytes
        with pytest.raises(UsageError, match="needs 1004 bytes"):
            buf.array(np.float32, 251)
        for count in (-1, 2.0, None):
            with pytest.raises(UsageError):
                buf.array(np.float32, count)
        with pytest.raises(UsageError, match="not a dtype"):
            buf.array("no-such-dtype", 1)


@pytest.mark.parametrize("spec", ["pageable", "hugepage", "numa:0", "shared"])
def test_zero_and_odd_sizes(spec):
    for nbytes in (0, 1, 4097):
        with memory.allocate(spec, nbytes) as buf:
            assert buf.nbytes == nbytes and buf.address % vm.PAGE_BYTES == 0
            written(buf)
            assert buf.placement()["nbytes"] == nbytes


# -- smaps parser ------------------------------------------------------------------------------

SAMPLE = """\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0 
Size:              65536 kB
KernelPageSize:        4 kB
Rss:               65536 kB
AnonHugePages:     63488 kB
ShmemPmdMapped:        0 kB
Private_Hugetlb:       0 kB
THPeligible:    1
VmFlags: rd wr mr mw me ac hg
7f0004000000-7f0004001000 ---p 00000000 00:00 0 
Size:                  4 kB
Rss:                   0 kB
VmFlags: mr mw me
7f0008000000-7f000c000000 rw-p 00000000 00:0f 1234                       /anon_hugepage (deleted)
Size:              65536 kB
KernelPageSize:     2048 kB
Rss:                   0 kB
AnonHugePages:         0 kB
Private_Hugetlb:   65536 kB
THPeligible:    0
VmFlags: rd wr mr mw me de ht
"""


def test_parse_smaps_sample():
    vmas = smaps.parse_smaps(SAMPLE)
    assert [(v.start, v.end, v.perms) for v in vmas] == [
        (0x7F0000000000, 0x7F0004000000, "rw-p"), (0x7F0004000000, 0x7F0004001000, "---p"),
        (0x7F0008000000, 0x7F000C000000, "rw-p")]
    assert vmas[0].sizes["AnonHugePages"] == 63488 and vmas[0].other["THPeligible"] == "1"
    assert vmas[2].path == "/anon_hugepage (deleted)" and vmas[2].sizes["KernelPageSize"] == 2048
    assert vmas[1].path == ""


def test_summarize_thp_and_hugetlb_ranges():
    vmas = smaps.parse_smaps(SAMPLE)
    thp = smaps.summarize(vmas, 0x7F0000001000, 0x7F0000002000)   # any overlap counts the mapping
    assert thp == {"rss_kb": 65536, "huge_kb": 63488, "page_kb": 4, "mapped_kb": 65536, "vmas": 1,
                   "vm_flags": "rd wr mr mw me ac hg"}
    hugetlb = smaps.summarize(vmas, 0x7F0008000000, 0x7F000C000000)
    assert hugetlb["rss_kb"] == 65536 and hugetlb["huge_kb"] == 65536 and hugetlb["page_kb"] == 2048
    assert "ht" in hugetlb["vm_flags"].split()
    both = smaps.summarize(vmas, 0x7F0000000000, 0x7F000C000000)
    assert both["vmas"] == 3 and both["huge_kb"] == 63488 + 65536
    assert smaps.summarize(vmas, 0x1000, 0x2000)["vmas"] == 0


def test_thp_mode_and_meminfo_readers(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert vm.thp_mode(str(f)) == "madvise"
    assert vm.thp_mode(str(tmp_path / "missing")) is None
    m = tmp_path / "meminfo"
    m.write_text("MemTotal:       24000000 kB\nHugePages_Total:       4\nHugepagesize:       2048 kB\n")
    assert vm.meminfo(str(m)) == {"MemTotal": 24000000, "HugePages_Total": 4, "Hugepagesize": 2048}


def test_a_segments_name_can_go_while_it_is_mapped():
    """The shm all-reduce's staging segment: named until every rank mapped it, then not, so
    that a rank killed later leaves nothing in /dev/shm."""
    import os

    from ddlcomm.memory import allocate
    from ddlcomm.memory.shared import SHM_DIR, unlink_name
    buf = allocate("shared", 4096)
    name = buf.placement()["shm_name"]
    a = buf.array("float32", 4)
    unlink_name(buf)
    assert not os.path.exists(os.path.join(SHM_DIR, name))
    a[:] = 7
    assert a.sum() == 28
    buf.free()                                  # nothing left to unlink: no error
