"""Synthetic batches and the files read ahead by a reader thread."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ddlcomm.errors import UsageError  # noqa: E402
from ddlcomm.train.data import POOL, FolderData, SyntheticData, data_files  # noqa: E402


def test_synthetic_is_fixed_and_cycles():
    a, b = SyntheticData(4, 8, 10, seed=3), SyntheticData(4, 8, 10, seed=3)
    first = [a.next() for _ in range(POOL + 1)]
    assert torch.equal(first[0][0], first[POOL][0]) and torch.equal(first[0][1], first[POOL][1])
    assert torch.equal(b.next()[0], first[0][0])                 # same seed, same data
    assert not torch.equal(SyntheticData(4, 8, 10, seed=4).next()[0], first[0][0])
    x, y = first[1]
    assert tuple(x.shape) == (4, 3, 8, 8) and int(y.max()) < 10


def write(folder, n_files=3, n=10):
    folder.mkdir()
    for i in range(n_files):
        x = np.full((n, 3, 4, 4), i * 10 + 5, np.uint8)
        np.savez(folder / f"p{i}.npz", x=x, y=np.arange(n) + 100 * i)
    return folder


def test_files_read_ahead_in_batches_across_files(tmp_path):
    files = data_files(write(tmp_path / "d"))
    data = FolderData(files, batch=4, classes=1000, rank=0, size=1, prefetch=2)
    try:
        got = [data.next() for _ in range(8)]                    # 30 images: 7 batches, then again
    finally:
        data.close()
    assert all(tuple(x.shape) == (4, 3, 4, 4) and x.dtype == torch.float32 for x, _ in got)
    labels = np.concatenate([y.numpy() for _, y in got[:7]])
    assert labels[:12].tolist() == list(range(10)) + [100, 101]  # the 3rd batch spans two files
    assert float(got[0][0].max()) == pytest.approx(5 / 255)     # uint8 scaled to [0, 1]


def test_each_rank_reads_its_share(tmp_path):
    files = data_files(write(tmp_path / "d", n_files=4))
    data = FolderData(files, batch=10, classes=1000, rank=1, size=2)
    try:
        labels = {int(data.next()[1][0]) for _ in range(4)}
    finally:
        data.close()
    assert labels == {100, 300}


def test_bad_folders_and_files(tmp_path):
    with pytest.raises(UsageError, match="no such folder"):
        data_files(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no .npz files"):
        data_files(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    np.savez(tmp_path / "bad" / "a.npz", images=np.zeros(3))
    data = FolderData(data_files(tmp_path / "bad"), 2, 10, 0, 1)
    with pytest.raises(UsageError, match="lacks array x or y"):
        data.next()
    data.close()
