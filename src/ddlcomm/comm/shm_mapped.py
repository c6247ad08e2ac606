"""``shm-map``: the all-reduce of ranks on one node with every rank's buffers mapped into
every rank, so that nothing is staged.

When the call is bound, each rank's send and receive buffers go into shared memory
where they are not there already (``--memory shared``): their whole pages move
into segments at the same addresses (:func:`ddlcomm.memory.remap.share`; the
arrays keep their addresses and values), and every rank maps every other rank's.
Each call (:mod:`ddlcomm.comm._shmmap`) then reduces every rank's line-aligned
part straight from all inputs into its own result, :data:`PIECE_BYTES` at a time,
and copies each piece from its caches into every other rank's result: each input
byte is read once and each result byte written once, against the pipelined
``shm``'s extra staging copy per byte.  Ranks meet twice a call on counters in a
small node segment, not through the backend.  The bytes of a buffer's partial
first and last pages (a few KiB at most) go through that segment.

The pages stay shared until the bound call is gone; then they are private
again (values kept).  Only plain private memory moves (see remap); other buffers
are refused on every rank alike, naming the rank and why.
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional

import numpy as np

from ..dtypes import ReduceOp
from ..errors import UnsupportedError
from ..memory import remap
from ..memory.shared import attach, segment_of, unlink
from .agree import agreed, attempt
from .bound import BoundCall
from .nodes import node_segment, same_node, spin_us

try:
    from . import _shmmap
except ImportError:         # not built (no C compiler at install time): shm-map is refused
    _shmmap = None

#: Bytes a rank reduces and then copies to every other rank at a time: within its L2
#: cache (2 ranks on the Intel Xeon: 32 KiB to 1 MiB pieces within the noise at 16 and
#: 64 MiB, docs/benchmarks.md "shm-map: nothing staged").
PIECE_BYTES = 256 << 10
#: From this size up the copies into the others' results use streaming stores, out of place
#: only: in place those lines were just read, and streaming them out of the caches doubled
#: the time (2 ranks, 16 MiB: 2.1 against 0.9 ms; docs/benchmarks.md).
STREAM_BYTES = 8 << 20


def runs(reduce) -> bool:
    """Whether the mapped engine runs with ``reduce``: built, and a C kernel's reducer."""
    return _shmmap is not None and hasattr(reduce, "loop")


def _where(buf: np.ndarray, share: bool, held: list, alone: bool = False) -> Optional[tuple]:
    """Where ``buf`` lies in shared memory, moving its pages there when ``share``: (segment
    name, first, end, offset): its bytes [first, end) are in that segment from ``offset`` on;
    None where none are.  What this rank moved goes into ``held``.  Pages a live bound call
    holds are refused unless ``alone`` (one rank: no other attaches them)."""
    found = segment_of(buf)
    if found is not None:
        return found[0], 0, buf.nbytes, found[1]
    if not share:
        return None
    pages = remap.share(buf)
    if pages is None:
        return None
    held.append(pages)                  # released where the bind fails
    if pages.users > 1 and not alone:
        # the first bound call unlinked the segment's name once its ranks had mapped it (so
        # that a rank killed leaves nothing in /dev/shm): the others cannot attach it again
        raise UnsupportedError("these buffers are bound by another live shm-map call",
                               "drop that bound call before binding them again, or use shm")
    first = pages.address - buf.__array_interface__["data"][0]
    return pages.name, first, first + pages.length, 0


def _span(wheres: list, nbytes: int, itemsize: int) -> tuple[int, int]:
    """[lo, hi): the whole elements every rank's buffers have in shared memory (pure); where
    some have none, (nbytes, nbytes): everything goes through the edge slots."""
    if any(w is None for w in wheres):
        return nbytes, nbytes
    lo = max(-(-w[1] // itemsize) * itemsize for w in wheres)
    hi = min(w[2] // itemsize * itemsize for w in wheres)
    return (lo, hi) if hi > lo else (nbytes, nbytes)


def _mapped_part(where: tuple, lo: int, hi: int, maps: dict) -> np.ndarray:
    """Bytes [lo, hi) of another rank's buffer, through its segment (mapped once, in ``maps``)."""
    if hi == lo:                        # nothing mapped: every byte goes through the edge slots
        return np.empty(0, np.uint8)
    name, first, _, offset = where
    if name not in maps:
        maps[name] = attach(name)
    start = offset + lo - first
    return maps[name].array(np.uint8, start + hi - lo)[start:]


def _gather(comm, sendbuf, recvbuf, share: bool, held: list) -> list:
    """Every rank's (send, recv) shared-memory places (see :func:`_where`), the same on every
    rank; what this rank moved goes into ``held``.  A rank that could not move its pages
    makes every rank raise EveryRankError, naming it."""
    def places() -> tuple:
        alone = comm.size == 1
        send = _where(sendbuf, share, held, alone)
        return send, send if recvbuf is sendbuf else _where(recvbuf, share, held, alone)

    mine, why = attempt(places)
    return [w for pair in agreed(comm, why, "shm-map", mine) for w in pair]


def _peers(wheres: list, send8, recv8, lo: int, hi: int, rank: int, maps: dict) -> tuple:
    """Every rank's bytes [lo, hi) of its send and receive buffers, this rank's own straight."""
    p = len(wheres) // 2
    sends = tuple(send8[lo:hi] if q == rank else _mapped_part(wheres[2 * q], lo, hi, maps) for q in range(p))
    recvs = tuple(recv8[lo:hi] if q == rank else _mapped_part(wheres[2 * q + 1], lo, hi, maps)
                  for q in range(p))
    return sends, recvs


def bind_allreduce(comm, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   reduce: Optional[Callable] = None, chunk_bytes: Optional[int] = None,
                   share: bool = True) -> BoundCall:
    """The mapped all-reduce on these buffers (flat, C-contiguous): ``chunk_bytes`` is the
    piece (default :data:`PIECE_BYTES`); ``share``: move pages into shared memory where they
    are not there (False: only buffers in shared segments already map)."""
    if not same_node(comm):
        raise UnsupportedError("shm-map needs every rank on one node",
                               "use --algorithm hierarchical (or ring) across nodes")
    if not runs(reduce):
        raise UnsupportedError("shm-map needs ddlcomm's compiled engine and C reduction kernel",
                               "reinstall ddlcomm where a C compiler is found, or use shm")
    p, rank, spin = comm.size, comm.rank, spin_us(comm)
    maps: dict = {}
    held: list = []
    ctl_buf = None

    def close() -> None:
        for buf in maps.values():
            buf.free()
        for pages in held:
            pages.release()
        if ctl_buf is not None:
            ctl_buf.free()

    send8, recv8 = sendbuf.view(np.uint8), recvbuf.view(np.uint8)
    try:
        wheres = _gather(comm, sendbuf, recvbuf, share, held)
        lo, hi = _span(wheres, sendbuf.nbytes, sendbuf.itemsize)
        peers, why = attempt(_peers, wheres, send8, recv8, lo, hi, rank, maps)
        agreed(comm, why, "shm-map: mapping the others' buffers")
        ctl_buf = node_segment(comm, 0, _shmmap.control_bytes(p))   # its barrier: every rank has mapped
    except BaseException:
        close()
        raise
    sends, recvs = peers
    for pages in held:
        unlink(pages.name)              # mapped by all: a rank killed later leaves nothing behind
    ctl = ctl_buf.array(np.uint8, ctl_buf.nbytes)
    piece = chunk_bytes or PIECE_BYTES
    state = {"call": 0}

    def run() -> None:
        state["call"] = _shmmap.allreduce(ctl, sends, recvs, send8, recv8, lo, hi, reduce, rank, p, piece,
                                          state["call"], spin, STREAM_BYTES)
        op.finish(recvbuf, p)

    def facts() -> dict:
        return {"shm_mapped_bytes": hi - lo, "shm_moved_pages": bool(held), "shm_chunk": piece,
                "shm_spin_us": spin}

    call = BoundCall(run, facts)
    weakref.finalize(call, close)
    return call
