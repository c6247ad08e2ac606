"""memory/heap: what ``steady`` does to the C library's heap, in a fresh process each."""
from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from ddlcomm.memory import heap

#: A fresh process sets its heap, then allocates, touches and frees a 16 MiB block five
#: times, counting the page faults of each round.
ROUNDS = """
import ctypes, json, resource, sys
from ddlcomm.memory import heap
used = heap.apply(sys.argv[1])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(16 << 20)
    ctypes.memset(p, 1, 16 << 20)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"used": used, "faults": faults}))
"""


def rounds(name: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUNDS, name], capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, **env})
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def glibc():
    if heap._mallopt() is None:
        pytest.skip("this C library has no mallopt (not glibc)")


def test_steady_keeps_a_freed_block_for_the_next(glibc):
    # 16 MiB pages: 4096 faults to touch them anew; the heap kept them from the second round
    got = rounds("steady")
    assert got["used"] == "steady"
    assert got["faults"][0] > 1000 and max(got["faults"][1:]) < 200, got


def test_glibc_faults_a_block_in_again_until_its_thresholds_grow(glibc):
    # glibc's defaults: the first block gets a mapping of its own, returned when freed (and
    # the threshold raised to its size); the second comes from the heap's top, new pages
    got = rounds("glibc")
    assert got["used"] == "glibc"
    assert min(got["faults"][:2]) > 1000, got


def test_an_allocator_preloaded_in_glibcs_stead_is_recorded(glibc):
    # jemalloc never hears of mallopt: the run must not say its heap was made steady
    jemalloc = ctypes.util.find_library("jemalloc")
    if jemalloc is None:
        pytest.skip("libjemalloc is not installed (make test's system-packages installs it)")
    assert not heap.preloaded()
    got = rounds("steady", LD_PRELOAD=jemalloc)
    assert got["used"] == heap.PRELOADED, got


def test_unknown_heap_is_refused():
    with pytest.raises(ValueError, match="unknown heap"):
        heap.apply("jemalloc")
