"""Tests of the bench plan and its memory check (ddlcomm.bench.plan)."""
from __future__ import annotations

import pytest

from ddlcomm.bench.plan import BenchPlan, check_memory, memory_needed, mem_available, parse_forms
from ddlcomm.collectives import COLLECTIVES
from ddlcomm.errors import UsageError

GiB = 1 << 30


def plan(**over) -> BenchPlan:
    kw = dict(backend="mpi", collectives=["broadcast", "gather"], sizes=[4, 8],
              dtype="float32", op="sum", forms=["buffer", "object"])
    kw.update(over)
    return BenchPlan(**kw)


def test_points_order_collective_then_size_then_form():
    assert plan().points() == [
        ("broadcast", 4, "buffer"), ("broadcast", 4, "object"),
        ("broadcast", 8, "buffer"), ("broadcast", 8, "object"),
        ("gather", 4, "buffer"), ("gather", 4, "object"),
        ("gather", 8, "buffer"), ("gather", 8, "object"),
    ]
    assert plan(forms=["buffer"], sizes=[]).points() == []


def test_as_config_is_a_plain_copy():
    config = plan(ranks=3).as_config()
    assert config["ranks"] == 3 and config["collectives"] == ["broadcast", "gather"]
    assert config["budget_s"] == 0.2 and config["extra"] == {}


@pytest.mark.parametrize("text, forms", [
    ("both", ["buffer", "object"]), ("buffer", ["buffer"]), ("object", ["object"]),
])
def test_parse_forms(text, forms):
    assert parse_forms(text) == forms


@pytest.mark.parametrize("text", ["", "Buffer", "buffers", "buffer,object"])
def test_parse_forms_errors(text):
    with pytest.raises(UsageError) as err:
        parse_forms(text)
    assert repr(text) in str(err.value) and "buffer, object or both" in str(err.value)


def test_memory_needed_grows_faster_than_ranks_for_gather():
    gather, bcast = COLLECTIVES["gather"], COLLECTIVES["broadcast"]
    need = [memory_needed(gather, GiB, p, False) for p in (1, 2, 4, 8)]
    assert need == sorted(set(need))
    assert need[3] / need[2] > 2 * 0.99                 # root holds p messages
    assert memory_needed(gather, GiB, 8, False) > memory_needed(bcast, GiB, 8, False)
    assert memory_needed(gather, GiB, 4, True) == 2 * memory_needed(gather, GiB, 4, False)
    assert memory_needed(COLLECTIVES["barrier"], GiB, 4, False) >= 0


def test_check_memory_refuses_with_one_line():
    gather = COLLECTIVES["gather"]
    with pytest.raises(UsageError) as err:
        check_memory(gather, 64 * GiB, 4, False, available=16 * GiB)
    text = str(err.value)
    assert "\n" not in text
    assert "gather" in text and "64GiB" in text and "16GiB" in text and "4 ranks" in text
    assert "--sizes" in err.value.hint and "--ranks" in err.value.hint


def test_check_memory_passes_when_it_fits():
    gather = COLLECTIVES["gather"]
    need = memory_needed(gather, 1 << 20, 4, True)
    check_memory(gather, 1 << 20, 4, True, available=need)
    with pytest.raises(UsageError):
        check_memory(gather, 1 << 20, 4, True, available=need - 1)


def test_mem_available_is_positive():
    assert mem_available() > 0
