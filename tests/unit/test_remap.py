"""Moving an array's pages into shared memory in place (ddlcomm.memory.remap), one process.

What shm-map relies on: the array keeps its address and values, another mapping
of the segment sees its writes, release makes the pages private again with the
values, a forked child gets private pages, and memory that must stay where it
is (locked, file-backed, NUMA-bound) is refused with the reason.
"""
from __future__ import annotations

import ctypes
import os
import sys

import numpy as np
import pytest

from ddlcomm import memory
from ddlcomm.errors import UnsupportedError
from ddlcomm.memory import remap, shared, vm
from ddlcomm.memory.smaps import Vma

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
PAGE = vm.PAGE_BYTES


def test_pages_within():
    assert remap.pages_within(PAGE + 16, 3 * PAGE) == (2 * PAGE, 4 * PAGE)
    assert remap.pages_within(2 * PAGE, 2 * PAGE) == (2 * PAGE, 4 * PAGE)
    assert remap.pages_within(PAGE + 16, PAGE) == (2 * PAGE, 2 * PAGE)       # no whole page


def vma(start, end, perms="rw-p", path="", flags="rd wr mr mw me ac", **other):
    return Vma(start, end, perms, path, {}, {"VmFlags": flags, **other})


@pytest.mark.parametrize("vmas, policies, why", [
    ([vma(0, 100)], {}, None),
    ([vma(0, 50), vma(50, 100, path="[heap]", flags="rd wr hg")], {}, None),
    ([vma(0, 40), vma(60, 100)], {}, "not all mapped"),
    ([vma(10, 100)], {}, "not all mapped"),
    ([vma(0, 100, perms="r--p")], {}, "r--p"),
    ([vma(0, 100, path="/lib/x.so")], {}, "/lib/x.so"),
    ([vma(0, 100, flags="rd wr lo")], {}, "locked"),
    ([vma(0, 100, flags="rd wr ht")], {}, "hugetlbfs"),
    ([vma(0, 100)], {0: "bind:1"}, "NUMA policy bind:1"),
])
def test_why_fixed(vmas, policies, why):
    got = remap.why_fixed(vmas, 0, 100, policies)
    assert got == why if why is None else why in got


@linux
def test_share_keeps_address_and_values_and_release_makes_them_private_again():
    a = np.arange(3 << 18, dtype=np.float32)[5:]         # not page-aligned: partial pages stay
    address, before = a.ctypes.data, a.copy()
    pages = remap.share(a)
    assert a.ctypes.data == address and (a == before).all()
    assert pages.address == remap.pages_within(address, a.nbytes)[0]
    other = shared.attach(pages.name)                    # as another rank maps it
    seen = other.array(np.float32, pages.length // 4)
    first = (pages.address - address) // 4
    seen[0] = -1.0
    assert a[first] == -1.0                              # one memory
    assert remap.share(a) is pages and pages.users == 2  # bound twice: one move
    pages.release()
    assert remap._shared                                 # one user left
    pages.release()
    assert not remap._shared
    seen[1] = -2.0
    assert a[first + 1] == before[first + 1]             # private again...
    assert a[first] == -1.0 and (a[first + 1:] == before[first + 1:]).all()   # ...with its values
    other.free()


@linux
def test_a_forked_child_gets_private_pages():
    a = np.zeros(4 * PAGE // 8, np.float64)
    pages = remap.share(a)
    first = (pages.address - a.ctypes.data) // 8
    pid = os.fork()
    if pid == 0:
        a[first] = 7.0                                   # the parent must not see this
        os._exit(0 if not remap._shared else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and a[first] == 0.0
    pages.release()


@linux
def test_refusals_say_why():
    a = np.zeros(4 * PAGE, np.uint8)
    pages = remap.share(a)
    with pytest.raises(UnsupportedError, match="overlap"):
        remap.share(a[PAGE:])
    pages.release()
    assert remap.share(np.zeros(16, np.uint8)) is None                 # no whole page
    shm_buf = memory.allocate("shared", 4 * PAGE)
    with pytest.raises(UnsupportedError, match="/dev/shm"):
        remap.share(shm_buf.array(np.uint8, 4 * PAGE))
    shm_buf.free()
    libc = ctypes.CDLL(None, use_errno=True)
    locked = memory.allocate("pageable", 4 * PAGE)
    if libc.mlock(ctypes.c_void_p(locked.address), ctypes.c_size_t(4 * PAGE)) != 0:
        pytest.skip("mlock is not allowed here")
    with pytest.raises(UnsupportedError, match="locked"):
        remap.share(locked.array(np.uint8, 4 * PAGE))
    locked.free()


@linux
def test_release_after_the_owner_unmapped_leaves_the_range_alone():
    buf = memory.allocate("pageable", 4 * PAGE)
    pages = remap.share(buf.array(np.uint8, 4 * PAGE))
    buf.free()                                           # the owner unmapped it first
    pages.release()                                      # nothing mapped back there
    with open("/proc/self/maps") as f:
        starts = [int(line.split("-")[0], 16) for line in f]
    assert pages.address not in starts
