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
    data = FolderData(files, batch=4, rank=0, size=1, prefetch=2)
    try:
        got = [data.next() for _ in range(8)]                    # 30 images: 7 batches, then again
    finally:
        data.close()
    assert all(tuple(x.shape) == (4, 3, 4, 4) and x.dtype == torch.float32 for x, _ in got)
    labels = np.concatenate([y.numpy() for _, y in got[:7]])
    assert labels[:12].tolist() == list(range(10)) + [100, 101]  # the 3rd batch spans two files
    assert float(got[0][0].max()) == pytest.approx(5 / 255)     # uint8 scaled to [0, 1]



def test_a_batch_across_a_uint8_and_a_float_file_has_every_pixel_scaled(tmp_path):
    """A batch spanning a uint8 file and a float one was one float array: its uint8 rows
    escaped the scaling to [0, 1] (pixels of 255 where 1.0 was meant)."""
    (tmp_path / "d").mkdir()
    np.savez(tmp_path / "d" / "a.npz", x=np.full((3, 3, 4, 4), 255, np.uint8), y=np.zeros(3, int))
    np.savez(tmp_path / "d" / "b.npz", x=np.full((3, 3, 4, 4), 0.5, np.float32), y=np.ones(3, int))
    data = FolderData(data_files(tmp_path / "d"), batch=4, rank=0, size=1)
    try:
        got = [data.next()[0] for _ in range(3)]     # 6 images an epoch: a a a b, b b + a a, a b b b
    finally:
        data.close()
    rows = torch.cat(got).flatten(1)[:, 0].tolist()
    assert rows == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5]
    assert all(x.dtype == torch.float32 for x in got)

@pytest.mark.parametrize("change", ["overwrite", "remove"])
def test_a_file_that_changes_while_training_reads_it_is_named(tmp_path, change):
    """NumPy's advice on a file overwritten mid-run (allow_pickle=...) or a bare
    FileNotFoundError reached the run's error."""
    files = data_files(write(tmp_path / "d"))
    for f in files:
        f.write_bytes(b"garbage" * 64) if change == "overwrite" else f.unlink()
    data = FolderData(files, batch=4, rank=0, size=1, prefetch=2)
    try:
        with pytest.raises(UsageError, match=f"--data file {files[0]} changed while training read it"):
            data.next()
    finally:
        data.close()


def test_each_rank_reads_its_share(tmp_path):
    files = data_files(write(tmp_path / "d", n_files=4))
    data = FolderData(files, batch=10, rank=1, size=2)
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
    data = FolderData(data_files(tmp_path / "bad"), 2, 0, 1)
    with pytest.raises(UsageError, match="lacks array x or y"):
        data.next()
    data.close()


def test_data_checked_from_headers_before_any_rank(tmp_path):
    """A file of no images hung the ranks until --timeout; pickled or non-zip files failed in
    a rank after the start, and images of another size trained as --image-size's."""
    from ddlcomm.train.data import data_shape
    assert data_shape(data_files(write(tmp_path / "d"))) == (30, 4, 4)
    labels = np.zeros(2, np.int64)
    cases = {"zero": dict(x=np.zeros((0, 3, 4, 4), np.uint8), y=labels[:0]),
             "flat": dict(x=np.zeros((2, 4, 4), np.uint8), y=labels),
             "pickled": dict(x=np.array([None, None], object).reshape(2, 1, 1, 1), y=labels),
             "oblong": dict(x=np.zeros((2, 3, 4, 5), np.uint8), y=labels),
             # int16 pixels trained unscaled (loss 6211 -> 51065, passed); float, bool labels
             # were taken modulo the classes
             "int16": dict(x=np.zeros((2, 3, 4, 4), np.int16), y=labels),
             "complex": dict(x=np.zeros((2, 3, 4, 4), np.complex64), y=labels),
             "float_y": dict(x=np.zeros((2, 3, 4, 4), np.float32), y=np.zeros(2)),
             "bool_y": dict(x=np.zeros((2, 3, 4, 4), np.float32), y=np.zeros(2, bool))}
    match = {"zero": "no images", "flat": "must be", "pickled": "must be", "oblong": "square",
             **dict.fromkeys(("int16", "complex", "float_y", "bool_y"), "integer class labels")}
    for name, arrays in cases.items():
        (tmp_path / name).mkdir()
        np.savez(tmp_path / name / "a.npz", **arrays)
        with pytest.raises(UsageError, match=match[name]):
            data_shape(data_files(tmp_path / name))
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.npz").write_text("not a zip")
    with pytest.raises(UsageError, match="not a readable .npz"):
        data_shape(data_files(tmp_path / "text"))


def test_a_share_smaller_than_a_batch_is_refused_not_awaited(tmp_path):
    data = FolderData(data_files(write(tmp_path / "d", n_files=1, n=3)), 4, 0, 1)
    with pytest.raises(UsageError, match="holds 3 images, fewer than a batch of 4"):
        data.next()
    data.close()


def test_the_image_size_is_the_datas(tmp_path, capsys):
    from ddlcomm.cli import main
    folder = tmp_path / "d"
    folder.mkdir()
    np.savez(folder / "a.npz", x=np.zeros((8, 3, 28, 28), np.uint8), y=np.zeros(8, np.int64))
    assert main(["train", "--db", str(tmp_path / "t.db"), "--data", str(folder),
                 "--image-size", "32", "--no-report"]) == 2
    assert "--image-size 32, but the --data images are 28x28" in capsys.readouterr().err
    from ddlcomm.cli.train import options
    from ddlcomm.cli import build_parser
    from ddlcomm.train.config import base_config
    args = build_parser().parse_args(["train", "--data", str(folder)])
    assert base_config(options(args)).image_size == 28


@pytest.mark.parametrize("x, y, message", [
    # labels past the classes were taken modulo the classes, silently
    (np.zeros((8, 3, 32, 32), np.uint8), np.arange(8) * 100, "labels run 0..700, but smallcnn has 10"),
    (np.zeros((8, 3, 32, 32), np.uint8), -np.arange(8), "labels run -7..0"),
    # without --image-size it blamed an --image-size 4 the user never gave
    (np.zeros((8, 3, 4, 4), np.uint8), np.zeros(8, np.int64), "--data images are 4x4, too small"),
])
def test_data_the_network_cannot_train_on_is_refused(tmp_path, capsys, x, y, message):
    from ddlcomm.cli import main
    folder = tmp_path / "d"
    folder.mkdir()
    np.savez(folder / "a.npz", x=x, y=y)
    assert main(["train", "--db", str(tmp_path / "t.db"), "--data", str(folder), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_shares_follow_the_readers():
    from ddlcomm.train.data import shares
    assert shares([10, 20, 30], 2) == [40, 20]
    assert shares([10], 3) == [10, 10, 10]          # fewer files than ranks: every rank reads all


def test_a_share_smaller_than_a_batch_is_refused_before_the_start(tmp_path, capsys):
    """It failed in the ranks, after the start, with the error printed twice."""
    from ddlcomm.cli import main
    folder = tmp_path / "d"
    folder.mkdir()
    for i, n in enumerate((40, 8)):
        np.savez(folder / f"p{i}.npz", x=np.zeros((n, 3, 32, 32), np.uint8), y=np.zeros(n, np.int64))
    assert main(["train", "--db", str(tmp_path / "t.db"), "--data", str(folder), "--ranks", "2",
                 "--batch", "16", "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ddlcomm: error: at 2 workers a worker's share of --data holds 8 images, fewer "
                   "than a batch of 16 (give more images, more files, or a smaller --batch)"]


def test_ddp_beside_ps_has_its_shares_checked(tmp_path, capsys):
    """--arch ps alone checked the ranks-but-one split; DDP beside it splits over every rank."""
    from ddlcomm.cli import main
    folder = tmp_path / "d"
    folder.mkdir()
    for i, n in enumerate((40, 8)):
        np.savez(folder / f"p{i}.npz", x=np.zeros((n, 3, 32, 32), np.uint8), y=np.zeros(n, np.int64))
    args = ["train", "--db", str(tmp_path / "t.db"), "--data", str(folder), "--ranks", "2",
            "--batch", "16", "--no-report", "--arch", "ps"]
    assert main([*args, "--peer", "ddp"]) == 2
    assert "at 2 workers a worker's share of --data holds 8 images" in capsys.readouterr().err
