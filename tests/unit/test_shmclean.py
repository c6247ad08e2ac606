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


def test_a_rank_unlinks_the_segments_it_maps(tmp_path):
    """What this process maps and an MPI would name goes; what it does not map, or another
    name, stays (the mapping itself stays valid)."""
    names = ("mpich_shm_1_0", "sm_segment.x", "mine.dat", "mpich_shm_2_0")
    files = {n: open(tmp_path / n, "w+b") for n in names}
    try:
        for f in files.values():
            f.truncate(4096)
        maps = [mmap.mmap(files[n].fileno(), 4096) for n in names[:3]]    # not the last
        assert shmclean.unlink_mine(tmp_path) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.dat", "mpich_shm_2_0"]
        maps[0][0] = 1                                                     # still mapped
        for m in maps:
            m.close()
    finally:
        for f in files.values():
            f.close()
