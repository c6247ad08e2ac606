"""Segments left in /dev/shm by ranks that ended abnormally (ddlcomm.launch.shmclean)."""
from __future__ import annotations

import mmap

from ddlcomm.launch import shmclean


def test_only_new_unused_mpi_segments_are_removed(tmp_path):
    (tmp_path / "sm_segment.vm.0.a.1").write_bytes(b"x" * 100)      # there before the run
    before = shmclean.names(tmp_path)
    for name in ("sm_segment.vm.0.b.1", "mpich_shm_1234_0", "mpich_shm_held_0", "mpich_shm_mapped_0",
                 "someone-elses"):
        (tmp_path / name).write_bytes(b"y" * 4096)
    held = open(tmp_path / "mpich_shm_held_0", "rb")                  # a live process holds it
    with open(tmp_path / "mpich_shm_mapped_0", "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 4096)                          # ... or maps it
    try:
        assert shmclean.remove_left(before, tmp_path) == (2, 2 * 4096)
        assert shmclean.names(tmp_path) == {"sm_segment.vm.0.a.1", "mpich_shm_held_0",
                                            "mpich_shm_mapped_0", "someone-elses"}
    finally:
        held.close()
        mapped.close()
    assert shmclean.remove_left(shmclean.names(tmp_path), tmp_path) == (0, 0)
    assert shmclean.names(tmp_path / "none") == set()
