"""Tests of size parsing and formatting, and of command lines and text shown (ddlcomm.units)."""
from __future__ import annotations

import re
import subprocess

import pytest

from ddlcomm.errors import UsageError, option
from ddlcomm.units import (MAX_SECONDS, format_size, fusion_label, parse_positive_int, parse_seconds, parse_size,
                           parse_sizes, printable, shell_join, typed_size)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize("text, nbytes", [
    ("4B", 4), ("4", 4), ("1KiB", KiB), ("64MiB", 64 * MiB), ("1G", GiB), ("2GiB", 2 * GiB),
    ("1TiB", 1 << 40), ("1kib", KiB), ("  8 MiB  ", 8 * MiB), ("0B", 0),
])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


def test_parse_size_k_kb_kib_are_the_same_binary_unit():
    assert parse_size("3K") == parse_size("3KB") == parse_size("3KiB") == 3 * KiB
    assert parse_size("3M") == parse_size("3MB") == parse_size("3MiB") == 3 * MiB


@pytest.mark.parametrize("text", ["12XB", "", "-1", "1.5MiB", "MiB", "4 B B", "1e3"])
def test_parse_size_errors_name_the_input(text):
    with pytest.raises(UsageError) as err:
        parse_size(text)
    assert repr(text) in str(err.value)
    assert err.value.hint and "64MiB" in err.value.hint


def test_parse_sizes_default_sweep_is_25_powers_of_two():
    sizes = parse_sizes("4B:64MiB")
    assert len(sizes) == 25
    assert sizes[0] == 4 and sizes[-1] == 64 * MiB
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


@pytest.mark.parametrize("text, sizes", [
    ("4B:1KiBx4", [4, 16, 64, 256, 1024]),
    ("4B:1KiB x4", [4, 16, 64, 256, 1024]),
    ("1KiB:1KiB", [KiB]),
    ("1KiB:3KiB", [KiB, 2 * KiB]),                     # stops at or below HI
    ("1MiB,4B, 1KiB,4B", [4, KiB, MiB]),               # sorted, de-duplicated
    ("4B,1KiB,", [4, KiB]), ("4B,,8B", [4, 8]),          # empty items left out, as other lists'
    ("64", [64]),
])
def test_parse_sizes(text, sizes):
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize("text, words", [
    ("64MiB:4B", "ends below its start"),
    ("0B:1KiB", "above 0"),
    ("0,4B", "above 0"),
    ("4B:1KiBx1", "at least 2"),
    ("4B:1KiBx0", "at least 2"),
    ("", "empty"),
    ("   ", "empty"),
    ("4B:12XB", "'12XB'"),
    (",", "empty"),
    # what was wrong, and what a size list can be (they said "cannot parse size '1KiBx1.5'")
    ("4B:1KiBx1.5", "growth factor of '4B:1KiBx1.5' must be a whole number"),
    ("4B-1KiB", "LO:HI[xF]"), ("4B..1KiB", "LO:HI[xF]"), ("4B:64KiB,1MiB", "or a list a,b,c, not both"),
    # what was typed, and what is wrong with it (it said '1KiB:1MiB:', size '', the sweep hint)
    ("1KiB:1MiB:x4", "sizes '1KiB:1MiB:x4'"), ("4KiB:", "sweep '4KiB:' lacks its end"),
    (":4KiB", "lacks its start"), ("4B:64MiBx2.5", "got x2.5"),
    ("1.5KiB", "use a whole number"), ("-4B", "use a whole number"), ("1e3B", "use a whole number"),
])
def test_parse_sizes_errors(text, words):
    with pytest.raises(UsageError) as err:
        parse_sizes(text)
    assert words in str(err.value)
    assert str(err.value).startswith("--sizes: ")       # the option it was given to


def test_a_size_refusal_names_its_option():
    """One size parser serves many options: the refusal says which (--fusion's said only
    "cannot parse size 'abc'"); a message that names its option already is kept."""
    with pytest.raises(UsageError, match=r"^--fusion: cannot parse size 'abc' \(use"):
        parse_size("abc", "--fusion")
    with pytest.raises(UsageError, match=r"^--bytes: sweep '64MiB:4B' ends below its start$"):
        parse_sizes("64MiB:4B", flag="--bytes")
    with pytest.raises(UsageError, match=r"^cannot parse size 'abc' \(use"):
        parse_size("abc")
    with pytest.raises(UsageError) as err, option("--x"):
        raise UsageError("--x is 3", "give 2")
    assert (str(err.value), err.value.hint) == ("--x is 3 (give 2)", "give 2")


def test_typed_size_is_what_one_can_type():
    assert [typed_size(n) for n in (4, 1294, 64 * KiB, 65532)] == ["4B", "1294B", "64KiB", "65532B"]


@pytest.mark.parametrize("nbytes, text", [
    (0, "0B"), (4, "4B"), (1023, "1023B"), (KiB, "1KiB"), (64 * KiB, "64KiB"),
    (3 * MiB // 2, "1.5MiB"), (64 * MiB, "64MiB"), (GiB, "1GiB"), (2048 * GiB, "2TiB"),
    # exact, or marked as rounded (65532 B read "64KiB", 1048572 B "1.02e+03KiB")
    (65532, "~64.0KiB"), (MiB - 4, "~1024KiB"), (2040, "~1.99KiB"), (MiB + 256 * KiB, "1.25MiB"),
    (100_000_000, "~95.4MiB"), (1_660_892_640, "~1.55GiB"),
    # a float, as a fit's halved caches are (260 MiB / 8 gave a ValueError in model calibrate)
    (260 * MiB / 8, "32.5MiB"), (260 * MiB / 64, "~4.06MiB"),
])
def test_format_size(nbytes, text):
    assert format_size(nbytes) == text


@pytest.mark.parametrize("nbytes", [4, KiB, 64 * MiB, 8 * GiB])
def test_format_parse_round_trip(nbytes):
    assert parse_size(format_size(nbytes)) == nbytes


def test_parse_positive_int():
    assert parse_positive_int("4", "--ranks") == 4
    assert parse_positive_int("0", "--warmup", 0) == 0


@pytest.mark.parametrize("text, minimum, words", [
    ("0", 1, "--ranks must be at least 1, got 0"),
    ("-3", 0, "--ranks must be at least 0, got -3"),
    ("two", 1, "--ranks must be a whole number, got 'two'"),
    ("1.5", 1, "whole number"),
    ("", 1, "whole number"),
    (None, 1, "whole number"),
])
def test_parse_positive_int_errors(text, minimum, words):
    with pytest.raises(UsageError) as err:
        parse_positive_int(text, "--ranks", minimum)
    assert words in str(err.value)


def test_parse_seconds():
    assert parse_seconds("0.25", "--budget") == 0.25
    assert parse_seconds("120", "--timeout") == 120.0


@pytest.mark.parametrize("text, words", [
    ("0", "above 0"), ("-1", "above 0"), ("nan", "above 0"),
    ("soon", "number of seconds, got 'soon'"), ("", "number of seconds"),
])
def test_parse_seconds_errors(text, words):
    with pytest.raises(UsageError) as err:
        parse_seconds(text, "--timeout")
    assert str(err.value).startswith("--timeout") and words in str(err.value)


@pytest.mark.parametrize("text", ["inf", "1e300", str(MAX_SECONDS + 1)])
def test_parse_seconds_refuses_durations_no_timer_can_wait(text):
    # Regression: "inf" used to pass, and the watchdog's Condition.wait(inf) raised
    # OverflowError in its thread (as did choose_iterations' round(inf)).
    assert parse_seconds(str(MAX_SECONDS), "--timeout") == MAX_SECONDS
    with pytest.raises(UsageError, match="at most"):
        parse_seconds(text, "--timeout")


def test_parse_list_keeps_order_and_refuses_empty_and_repeats():
    from ddlcomm.units import parse_list
    assert parse_list(" a, b ,c,", "--x") == ["a", "b", "c"]
    with pytest.raises(UsageError, match="--x is empty"):
        parse_list(" , ", "--x")
    with pytest.raises(UsageError, match="--x names something twice: a,a"):
        parse_list("a,a", "--x")


def test_counted():
    from ddlcomm.units import counted
    assert [counted(n, "rank") for n in (0, 1, 3)] == ["0 ranks", "1 rank", "3 ranks"]


def test_a_fusion_of_zero_is_named_unfused():
    """--fusion 0 (a message per tensor) was labelled "allreduce 0B" in tables and plots."""
    assert fusion_label(0) == "unfused" and fusion_label(25 << 20) == "25MiB"


@pytest.mark.parametrize("arg", ["plain", "a b", "it's", "a \x1b[31mRED\x1b[0m\nsecond", "back\\slash\n", "\x7f'\\"])
def test_a_command_line_reads_back_through_bash_and_prints_no_control_character(arg):
    line = shell_join(["ddlcomm", "--tag", arg])
    assert not re.search(r"[\x00-\x1f\x7f]", line)
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [b"ddlcomm", b"--tag", arg.encode()]


def test_printable_escapes_control_characters():
    assert printable("a\x1b[0m\nb\tc") == "a\\x1b[0m\\nb\\tc" and printable("ü ✓") == "ü ✓"
