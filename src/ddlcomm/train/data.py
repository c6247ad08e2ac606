"""Where a worker's batches come from: synthetic (the default) or files read ahead.

Synthetic data keeps storage out of the measurement (README, "ddlcomm train"): a small pool of
random images with fixed labels, generated once per rank from a seed, cycled
through; reading a batch is then free, and a network can learn the pool, so
the loss falls and training can be checked.

:class:`FolderData` is the real-data path: ``.npz`` files (arrays ``x`` of
shape (N, 3, H, W), float32 or uint8, and ``y`` of N integer labels) in a
folder, each rank reading its own share of the files.  A reader thread loads
files and cuts batches ahead of the training loop into a bounded queue, so the
io phase measures only how long the loop waited for a batch (what prefetching
failed to hide).  The thread never calls MPI.
"""
from __future__ import annotations

import queue
import threading
import zipfile
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from ..errors import UsageError

#: Batches in the synthetic pool of each rank.
POOL = 4


class SyntheticData:
    """``POOL`` fixed batches of normal-random images and fixed labels, cycled."""

    def __init__(self, batch: int, image_size: int, classes: int, seed: int) -> None:
        # torch is optional: imported only when training makes its data
        import torch
        g = torch.Generator().manual_seed(seed)
        self.batches = [(torch.randn(batch, 3, image_size, image_size, generator=g),
                         torch.randint(0, classes, (batch,), generator=g)) for _ in range(POOL)]
        self._i = 0

    def next(self):
        x, y = self.batches[self._i % POOL]
        self._i += 1
        return x, y

    def close(self) -> None:
        pass


def data_files(folder: str | Path) -> list[Path]:
    """The ``.npz`` files of a data folder, sorted (UsageError if there are none)."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise UsageError(f"--data {folder}: no such folder")
    files = sorted(path.glob("*.npz"))
    if not files:
        raise UsageError(f"--data {folder} holds no .npz files",
                         "each file needs arrays x (N, 3, H, W) and y (N,)")
    return files


def _header(archive: zipfile.ZipFile, name: str) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of one array of an ``.npz``, from its header alone."""
    with archive.open(name) as member:
        major, _ = np.lib.format.read_magic(member)
        read = np.lib.format.read_array_header_1_0 if major == 1 else \
            np.lib.format.read_array_header_2_0
        shape, _, dtype = read(member)
    return shape, dtype


def data_shape(files: list[Path]) -> tuple[int, int, int]:
    """(samples in all, height, width) of the data files, read from their headers before any
    rank starts; UsageError naming the file where one cannot be trained on."""
    total, sizes = 0, set()
    for f in files:
        try:
            with zipfile.ZipFile(f) as archive:
                names = set(archive.namelist())
                if not {"x.npy", "y.npy"} <= names:
                    raise UsageError(f"--data file {f} lacks array x or y",
                                     "each file needs arrays x (N, 3, H, W) and y (N,)")
                (xs, xt), (ys, yt) = _header(archive, "x.npy"), _header(archive, "y.npy")
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise UsageError(f"--data file {f} is not a readable .npz: {exc}") from None
        if len(xs) != 4 or xs[1] != 3 or ys != xs[:1] or xt.hasobject or yt.hasobject:
            raise UsageError(f"--data file {f}: x must be (N, 3, H, W) and y (N,) of numbers, "
                             f"got {xs} {xt} and {ys} {yt}")
        if not (xt == np.uint8 or xt.kind == "f") or yt.kind not in "iu":
            raise UsageError(f"--data file {f}: x must hold uint8 (0..255) or float pixels and "
                             f"y integer class labels, got {xt} and {yt}")
        total += xs[0]
        sizes.add(xs[2:])
    if len(sizes) > 1 or any(h != w for h, w in sizes):
        raise UsageError(f"--data images must be square and of one size, got "
                         f"{', '.join(f'{h}x{w}' for h, w in sorted(sizes))}")
    if total == 0:
        raise UsageError("--data holds no images (every file's x has 0 rows)")
    (h, w), = sizes
    return total, h, w


def file_images(files: list[Path]) -> list[int]:
    """How many images each data file holds (from its header; the files checked by
    :func:`data_shape` first)."""
    counts = []
    for f in files:
        with zipfile.ZipFile(f) as archive:
            counts.append(int(_header(archive, "x.npy")[0][0]))
    return counts


def shares(counts: list[int], size: int) -> list[int]:
    """Images each of ``size`` ranks reads from files of ``counts`` images, as
    :class:`FolderData` shares the files out (pure)."""
    return [sum(counts[rank::size]) if counts[rank::size] else sum(counts) for rank in range(size)]


def label_range(files: list[Path]) -> tuple[int, int]:
    """The smallest and largest class label of the data files (their y arrays alone)."""
    lows, highs = [], []
    for f in files:
        with np.load(f) as z:
            y = z["y"]
        if len(y):
            lows.append(int(y.min()))
            highs.append(int(y.max()))
    return min(lows, default=0), max(highs, default=0)


def _read(f: Path) -> tuple[np.ndarray, np.ndarray]:
    """A data file's arrays x and y, read during training (UsageError naming the file where
    it changed since the checks before the start: removed, cut short, overwritten)."""
    try:
        with np.load(f) as z:
            if "x" not in z or "y" not in z:
                raise UsageError(f"--data file {f} lacks array x or y")
            return z["x"], z["y"]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
            "not a readable .npz" if isinstance(exc, ValueError) else str(exc)
        raise UsageError(f"--data file {f} changed while training read it ({why})",
                         "leave the data files in place while a run trains on them") from None


def pixels(x: np.ndarray) -> np.ndarray:
    """Images as float32 pixels: uint8 ones scaled to 0..1, float ones as they are."""
    return x / np.float32(255) if x.dtype == np.uint8 else np.asarray(x, np.float32)


class FolderData:
    """Batches from ``.npz`` files, read ahead by one thread into a queue of ``prefetch`` batches."""

    def __init__(self, files: list[Path], batch: int, rank: int, size: int,
                 prefetch: int = 4) -> None:
        mine = files[rank::size] or files       # a rank left without a file reads them all
        # (as :func:`shares` counts them)
        self.batch = batch
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._read, args=(mine,), name="ddlcomm-reader",
                                        daemon=True)
        self._thread.start()

    def _batches(self, files: list[Path]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Batches of float32 pixels (:func:`pixels`) and labels, epoch after epoch; a batch
        may span files (of uint8 and float pixels alike)."""
        carry_x, carry_y = [], []                       # a batch begun in earlier files
        while True:                                     # epochs, until stopped
            seen = 0
            for f in files:
                x, y = _read(f)
                if x.ndim != 4 or x.shape[1] != 3 or len(y) != len(x):
                    raise UsageError(f"{f}: x must be (N, 3, H, W) and y (N,), got {x.shape}, {y.shape}")
                seen += len(x)
                first = 0                               # this file's rows that end a begun batch
                if carry_y:
                    have = sum(map(len, carry_y))
                    first = min(len(x), self.batch - have)
                    carry_x.append(pixels(x[:first]))
                    carry_y.append(y[:first])
                    if have + first < self.batch:
                        continue
                    yield np.concatenate(carry_x), np.concatenate(carry_y)
                n = first + (len(x) - first) // self.batch * self.batch
                for i in range(first, n, self.batch):
                    yield pixels(x[i:i + self.batch]), y[i:i + self.batch]
                carry_x, carry_y = ([pixels(x[n:])], [y[n:]]) if n < len(x) else ([], [])
            if seen < self.batch:                       # an epoch would never fill a batch
                raise UsageError(f"this rank's share of --data ({len(files)} files) holds "
                                 f"{seen} images, fewer than a batch of {self.batch}",
                                 "give more images, more files per rank, or a smaller --batch")

    def _read(self, files: list[Path]) -> None:
        # torch is optional: imported only when training reads its data
        import torch
        try:
            for x, y in self._batches(files):
                xt = torch.from_numpy(np.ascontiguousarray(x))
                if not self._put((xt, torch.from_numpy(np.asarray(y, np.int64)))):
                    return
        except BaseException as exc:       # noqa: BLE001 - handed to the training loop
            self._error = exc
            self._put(None)

    def _put(self, item) -> bool:
        """Queue ``item`` unless stopped first; whether it was queued."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> Any:
        item = self._queue.get()
        if item is None:
            raise self._error if self._error else UsageError("the data reader stopped")
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
