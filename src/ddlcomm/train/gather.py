"""Named arrays of every rank to rank 0 in one gather: packed, gathered, unpacked by name.

Every rank packs the same names with the same shapes into one flat float64
array (:func:`pack`), so a single ``gather`` carries them all; the root cuts
each rank's row back into its arrays by name (:func:`unpack`), each with a
leading axis of ranks.  :func:`pack` and :func:`unpack` are pure.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

#: (name, shape) of each packed array, in packing order.
Layout = list[tuple[str, tuple[int, ...]]]


def pack(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, Layout]:
    """The arrays flattened into one float64 array, in the mapping's order, and their layout."""
    layout = [(name, tuple(np.shape(a))) for name, a in arrays.items()]
    parts = [np.asarray(a, np.float64).reshape(-1) for a in arrays.values()]
    return (np.concatenate(parts) if parts else np.zeros(0)), layout


def unpack(rows: np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    """Each rank's packed row (``rows``: ranks x packed length) cut back into its arrays by name.

    ``out[name]`` has shape ``(ranks, *shape)``.
    """
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise ValueError(f"packed rows must be (ranks, values), not of shape {rows.shape}")
    size = sum(int(np.prod(shape)) for _, shape in layout)
    if rows.shape[1] != size:
        raise ValueError(f"packed rows hold {rows.shape[1]} values, the layout {size}")
    out, off = {}, 0
    for name, shape in layout:
        n = int(np.prod(shape))
        out[name] = rows[:, off:off + n].reshape(rows.shape[0], *shape)
        off += n
    return out


def gather_named(comm, arrays: Mapping[str, np.ndarray], root: int = 0
                 ) -> Optional[dict[str, np.ndarray]]:
    """Every rank's ``arrays`` (same names and shapes on every rank) at ``root``, by name.

    The root gets ``{name: array of shape (ranks, *shape)}``; the other ranks None.
    """
    flat, layout = pack(arrays)
    gathered = comm.gather(flat, root=root)
    if comm.rank != root:
        return None
    return unpack(gathered.reshape(comm.size, -1), layout)
