"""``--algorithm NAME@SIZE``: the piece a pipelined all-reduce moves at a time (no ranks)."""
from __future__ import annotations

import pytest

from ddlcomm.bench.plan import check_device_algorithm
from ddlcomm.comm import algorithms
from ddlcomm.errors import UsageError


def test_a_piece_is_not_part_of_the_name():
    assert algorithms.split("shm@256KiB") == ("shm", "auto")
    assert algorithms.split("ring@1MiB+numpy") == ("ring", "numpy")
    assert algorithms.piece("shm@256KiB") == 256 << 10 and algorithms.piece("ring@1MiB+c") == 1 << 20
    assert algorithms.piece("shm") is None and algorithms.piece("ring+numpy") is None


@pytest.mark.parametrize("name", ["shm@64KiB", "shm@2MiB+c", "ring@128KiB", "rhd@1MiB+numpy"])
def test_the_pipelined_all_reduces_take_a_piece(name):
    algorithms.check("allreduce", name)


@pytest.mark.parametrize("name, why", [
    ("shm@100B", "multiple of 64"), ("shm@0B", "multiple of 64"), ("shm@lots", "cannot parse size"),
    ("shm@256KiB+numpy", "pipelined all-reduces"), ("library@1MiB", "pipelined all-reduces"),
    ("auto@1MiB", "pipelined all-reduces"), ("hierarchical@1MiB", "pipelined all-reduces")])
def test_a_piece_where_none_applies_is_refused(name, why):
    with pytest.raises(UsageError, match=why):
        algorithms.check("allreduce", name)


def test_a_piece_on_device_buffers_is_refused():
    with pytest.raises(UsageError, match="host all-reduces"):
        check_device_algorithm("allreduce", "ring@1MiB", "--memory device")
