"""The intra-node shared-memory path: one segment, every rank reduces its slice.

For ranks on one node, three forms, chosen when the call is bound:

* **pipelined** (the C reduction kernel, with :mod:`ddlcomm.comm._shmpipe`
  built): the input is cut into chunks (:func:`pipe_chunk`); per chunk every
  rank stages the parts the others reduce in one of :data:`PIPE_WINDOWS`
  windows of the segment, reduces its own line-aligned part from every rank's
  input (its own straight from its buffer) into its result, copies that part
  into the window, and copies the others' reduced parts out, meeting the
  others through counters in the segment (no MPI call).  At
  step s a rank stages chunk s, reduces chunk s-1 and copies chunk s-2 out, so
  it waits only for what the others did a step before.  A chunk's staging
  stays in the caches, so a rank reads its input and writes its output from
  memory about once.  The bound call's ``facts()`` name its chunk and, from
  :data:`PIPE_PHASES_BYTES` up, each rank's time per call in each phase
  (:data:`PIPE_PHASES`): where a call's time goes.
* **staged** (the NumPy kernel, or no C build): each rank copies its whole
  input into its slot of the segment; after a barrier, rank r reduces slice r
  of the result straight from every rank's slot; after a second barrier,
  every rank copies the whole result out.  Two result slots alternate between
  calls, so a fast rank's next reduction never overwrites what a slow rank
  still reads.  Per call a rank moves about 3 n bytes against the 2 (p-1)/p n
  each way of a ring, and the p ranks reduce in parallel.
* **mapped** (the compiled engines, every rank's buffers already in shared
  segments: ``--memory shared``): nothing is staged; each rank reduces its
  part straight from every input into every output
  (:mod:`ddlcomm.comm.shm_mapped`, which ``shm-map`` also runs after moving
  the buffers' pages into shared memory).

The segment is made once per bound call (the set-up that ``bind`` pays) and
freed with it.  Ranks on several nodes: see ``hierarchical``.
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional

import numpy as np

from ..dtypes import ReduceOp
from ..errors import UnsupportedError
from ..memory.shared import segment_of
from . import shm_mapped
from .agree import agree_all
from .bound import BoundCall
from .native._common import blocks, check_reduce
from .nodes import node_segment, same_node, spin_us

try:
    from . import _shmpipe
except ImportError:         # not built (no C compiler at install time): the staged form runs
    _shmpipe = None

#: Staging windows of the pipelined form: chunks s-2..s are live while a rank is at step s.
PIPE_WINDOWS = 4
#: Bytes of staging the pipelined form aims for, windows x (ranks + 1) x chunk: within
#: the last-level cache.  Its chunk is this over windows x (ranks + 1), kept within
#: [PIPE_CHUNK_MIN, PIPE_CHUNK_MAX] (512 KiB at 2 ranks, 90 KiB at 16).
PIPE_STAGING_BYTES = 6 << 20
PIPE_CHUNK_MIN, PIPE_CHUNK_MAX = 64 << 10, 512 << 10
#: From this size up an out-of-place result is written with streaming stores: the
#: inputs and results of the node's ranks no longer fit in the caches, and the
#: results' lines need not be read first (2 ranks here: 16 MiB 2.4 -> 1.9 ms,
#: 64 MiB 11 -> 8 ms; below, streaming was slower).
PIPE_STREAM_BYTES = 8 << 20
#: From this size up the pipelined form times each rank's phases (:data:`PIPE_PHASES`):
#: 9 clock readings per step (about 25 ns each on our 2-core EPYC), about 1% of a 1 MiB
#: call at 2 ranks (4 steps of about 20 µs), less above; a 4 KiB call takes 2.4 µs in all.
PIPE_PHASES_BYTES = 1 << 20
#: The pipelined form's phases, in the order each step takes them: waiting for a free
#: window, staging, waiting for the others' pieces, reducing, waiting for the others'
#: parts, copying out.
PIPE_PHASES = tuple(_shmpipe.PHASES.split()) if _shmpipe is not None else ()


def slices(count: int, nranks: int) -> list[tuple[int, int]]:
    """Balanced contiguous ranges of ``count`` elements, one per rank (pure): the native
    algorithms' blocks."""
    offsets = blocks(count, nranks)
    return list(zip(offsets, offsets[1:]))


def reduce_slice(reduce, parts, piece) -> None:
    """``piece`` = the fold of ``parts`` (one slice per rank) with ``reduce(a, b, out)``."""
    if len(parts) == 1:
        np.copyto(piece, parts[0])
        return
    reduce(parts[0], parts[1], piece)
    for other in parts[2:]:
        reduce(piece, other, piece)


def pipelines(reduce) -> bool:
    """Whether the pipelined form runs with ``reduce``: a C kernel's reducer, and the engine built."""
    return _shmpipe is not None and hasattr(reduce, "loop")


def pipe_chunk(nranks: int, nbytes: int, asked: Optional[int] = None) -> int:
    """The pipelined form's chunk in bytes at ``nranks`` for ``nbytes`` (pure): ``asked``
    (``shm@SIZE``) or the default, never more than the message in whole lines (a larger
    one would only stage a segment of windows that big)."""
    line = 64
    chunk = PIPE_STAGING_BYTES // (PIPE_WINDOWS * (nranks + 1)) // line * line
    chunk = max(PIPE_CHUNK_MIN, min(chunk, PIPE_CHUNK_MAX)) if asked is None else asked
    return min(chunk, -(-max(nbytes, 1) // line) * line)


def phases_us(first, rest, calls: int) -> dict:
    """A rank's mean µs per call in each phase (pure): over the calls after the first where
    there are any (the first pays for its pages' first touch), else the first's."""
    ns, n = (rest, calls - 1) if calls > 1 else (first, max(calls, 1))
    return {name: round(float(t) / n / 1e3, 1) for name, t in zip(PIPE_PHASES, ns)}


def _pipelined(comm, sendbuf, recvbuf, op, reduce, chunk_bytes: Optional[int]) -> BoundCall:
    p, spin = comm.size, spin_us(comm)
    chunk = pipe_chunk(p, sendbuf.nbytes, chunk_bytes)
    seg = node_segment(comm, 0, _shmpipe.segment_bytes(p, chunk, PIPE_WINDOWS))
    raw = seg.array(np.uint8, seg.nbytes)
    rank, state = comm.rank, {"base": 0, "calls": 0}
    # the first call's phases, then the others' (None: not timed)
    timed = np.zeros((2, len(PIPE_PHASES)), np.int64) if sendbuf.nbytes >= PIPE_PHASES_BYTES else None

    def run() -> None:
        phases = None if timed is None else timed[min(state["calls"], 1)]
        state["base"] = _shmpipe.allreduce(raw, sendbuf, recvbuf, reduce, rank, p, chunk, PIPE_WINDOWS,
                                           state["base"], spin, PIPE_STREAM_BYTES, phases)
        state["calls"] += 1
        op.finish(recvbuf, p)

    def facts() -> dict:
        out = {"shm_chunk": chunk, "shm_spin_us": spin,
               "shm_stream": sendbuf.ctypes.data != recvbuf.ctypes.data and sendbuf.nbytes >= PIPE_STREAM_BYTES}
        if timed is not None and state["calls"]:
            out["shm_phases_us"] = {str(rank): phases_us(timed[0], timed[1], state["calls"])}
        return out

    call = BoundCall(run, facts)
    weakref.finalize(call, seg.free)
    return call


def bind_allreduce(comm, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   reduce: Optional[Callable] = None,
                   chunk_bytes: Optional[int] = None) -> Callable[[], None]:
    """Set up the segment and return the all-reduce on these buffers.

    With every rank's buffers in shared memory (``--memory shared``) and the
    compiled engines, the mapped form (no copy but the results'); otherwise the
    pipelined form where the C kernel reduces (in chunks of ``chunk_bytes``, a
    multiple of 64; default :func:`pipe_chunk`), else the staged one (see the
    module's docstring).
    """
    if not same_node(comm):
        raise UnsupportedError("the shm all-reduce needs every rank on one node",
                               "use --algorithm hierarchical (or ring) across nodes")
    reduce = check_reduce(reduce, op)
    p, n, dtype = comm.size, sendbuf.size, sendbuf.dtype
    if pipelines(reduce):
        if shm_mapped.runs(reduce):
            if agree_all(comm, segment_of(sendbuf) is not None and segment_of(recvbuf) is not None):
                return shm_mapped.bind_allreduce(comm, sendbuf, recvbuf, op, reduce, chunk_bytes, share=False)
        return _pipelined(comm, sendbuf, recvbuf, op, reduce, chunk_bytes)
    lo, hi = slices(n, p)[comm.rank]
    seg = node_segment(comm, 0, (p + 2) * n * dtype.itemsize)
    flat = seg.array(dtype, (p + 2) * n)
    inputs = [flat[r * n:(r + 1) * n] for r in range(p)]
    results = [flat[(p + k) * n:(p + k + 1) * n] for k in (0, 1)]
    mine = inputs[comm.rank]
    parts = [x[lo:hi] for x in inputs]
    barrier = comm.barrier
    state = {"k": 0}

    def call() -> None:
        out = results[state["k"]]
        state["k"] ^= 1
        np.copyto(mine, sendbuf)
        barrier()
        reduce_slice(reduce, parts, out[lo:hi])
        op.finish(out[lo:hi], p)
        barrier()
        np.copyto(recvbuf, out)

    weakref.finalize(call, seg.free)
    return call
