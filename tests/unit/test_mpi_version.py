"""Tests of parsing MPI_Get_library_version's text (no MPI is started)."""
from __future__ import annotations

import pytest

from ddlcomm.machine.mpi import parse_library_version


@pytest.mark.parametrize("text, want", [
    ("Open MPI v5.0.11, package: Open MPI runner@fv-az1 Distribution, ident: 5.0.11, "
     "repo rev: v5.0.11, Jan 01, 2025\x00", ("Open MPI", "5.0.11")),
    ("Open MPI v4.1.6rc1, package: Debian OpenMPI, ident: 4.1.6", ("Open MPI", "4.1.6rc1")),
    ("MPICH Version:      5.0.2\nMPICH Release date: Tue Jan 14 2025\nMPICH ABI:          17:2:5\n"
     "MPICH Device:       ch4:ofi", ("MPICH", "5.0.2")),
    ("Intel(R) MPI Library 2021.10 for Linux* OS\n\n", ("Intel MPI", "2021.10")),
    ("MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 2022",
     ("MVAPICH", "2.3.7")),
])
def test_known_libraries(text, want):
    assert parse_library_version(text) == want


@pytest.mark.parametrize("text, want", [
    ("", ("unknown MPI", "")),
    ("   \n  ", ("unknown MPI", "")),
    ("SomeVendor MPI 1.0\nbuilt yesterday", ("SomeVendor MPI 1.0", "")),
    ("\n  garbage line\nmore", ("garbage line", "")),
])
def test_unknown_text_gives_its_first_line_and_no_version(text, want):
    assert parse_library_version(text) == want
