"""A collective bound to its buffers, ready to check and time: buffer form, object
form, or one of ddlcomm's own algorithms.

The buffers come from :meth:`ddlcomm.collectives.Collective.buffers` (inputs
filled, outputs cleared); :func:`prepare` returns the call, the getter of this
rank's result and the reset that puts the buffers back before a check.
With a device side (``--memory device``) the backend is handed device copies
of those host buffers: inputs are filled and results verified on the host,
copied across around the (untimed) check call only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

import numpy as np

from ..collectives import Alloc, Collective, numpy_alloc
from ..comm import algorithms
from ..dtypes import DType, ReduceOp


@dataclass
class Prepared:
    """A ready call: ``run()`` does one collective; ``result()`` gives what this rank got."""

    run: Callable[[], Any]
    result: Callable[[], Any]
    reset: Callable[[], None]
    #: what ran, said by the bound call where it can (ddlcomm's own algorithms on device
    #: buffers: reduction kernel, transports, kind look-ups; the pipelined shm all-reduce:
    #: its chunk and time by phase); empty otherwise
    facts: Callable[[], dict] = dict


def _no_reset() -> None:
    return None


class DeviceSide(Protocol):
    """Where a point's buffers live when they are on a device (bench.buffers.DeviceCopies)."""

    def put(self, host: np.ndarray) -> Any:
        """A new device buffer holding a copy of ``host``."""

    def load(self, device: Any, host: np.ndarray) -> None:
        """Copy ``host`` into ``device``."""

    def fetch(self, device: Any, host: np.ndarray) -> np.ndarray:
        """Copy ``device`` into ``host`` and return ``host``."""


def prepare(coll: Collective, comm: Any, form: str, dtype: DType, count: int,
            op: Optional[ReduceOp], root: int, in_place: bool, alloc: Alloc = numpy_alloc,
            algorithm: str = "library", device: Optional[DeviceSide] = None,
            kind_cache: bool = True) -> Prepared:
    """Allocate inputs/outputs and return the call to time and the result getter.

    ``algorithm`` "library" calls the backend's own collective; any other
    (concrete) name runs ddlcomm's own algorithm of that name (buffer form only).
    ``device``: the backend (or ddlcomm's algorithm) gets device copies of the buffers;
    ``kind_cache``: ddlcomm's algorithms on device copies look buffer kinds up once
    (on) or ask the driver every call (off); ``in_place``: as the point says
    (:class:`ddlcomm.bench.plan.CollectivePoint`: never for object calls).
    """
    rank, nranks = comm.rank, comm.size
    send, recv = coll.buffers(dtype, count, rank, nranks, op, root, in_place, alloc)
    if form == "object":
        return _object_call(coll, comm, send, op, root)
    if device is not None:
        return _device_call(coll, comm, send, recv, dtype, count, op, root, device,
                            algorithm, kind_cache)
    if algorithm == "library":
        run = comm.bind(coll.name, send, recv, op=op, root=root)
    else:
        run = algorithms.bind(comm, coll.name, algorithm, send, recv, op, root)

    def reset() -> None:
        coll.reset(send, recv, dtype, count, rank, op, root)
    return Prepared(run, lambda: coll.result_of(send, recv), reset, getattr(run, "facts", dict))


def _device_call(coll: Collective, comm: Any, send: np.ndarray, recv: Optional[np.ndarray],
                 dtype: DType, count: int, op: Optional[ReduceOp], root: int,
                 device: DeviceSide, algorithm: str = "library", kind_cache: bool = True) -> Prepared:
    """The backend's call (or ddlcomm's ``algorithm``) on device copies of ``send``/``recv``
    (same in-place-ness)."""
    dsend = device.put(send)
    drecv = None if recv is None else dsend if recv is send else device.put(recv)
    facts: Callable[[], dict] = dict
    if algorithm == "library":
        run = comm.bind(coll.name, dsend, drecv, op=op, root=root)
    else:
        run = algorithms.bind(comm, coll.name, algorithm, dsend, drecv, op, root,
                              kind_cache=kind_cache)
        facts = run.facts

    def reset() -> None:
        coll.reset(send, recv, dtype, count, comm.rank, op, root)
        device.load(dsend, send)
        if drecv is not None and drecv is not dsend:
            device.load(drecv, recv)

    def result() -> Optional[np.ndarray]:
        where = coll.result_of(dsend, drecv)
        return None if where is None else device.fetch(where, coll.result_of(send, recv))
    return Prepared(run, result, reset, facts)


def _object_call(coll: Collective, comm: Any, send: np.ndarray, op: Optional[ReduceOp],
                 root: int) -> Prepared:
    """The object form: ``comm.<name>_object`` on this rank's input as one object
    (its blocks, one per rank, where the collective splits it)."""
    if not coll.moves_data:
        return Prepared(comm.barrier, lambda: None, _no_reset)
    if coll.in_send:
        obj = send if comm.rank == root else None      # only the root's object travels
    else:
        obj = list(np.split(send, comm.size)) if coll.object_per_rank else send
    call = getattr(comm, coll.name + "_object")
    kwargs: dict[str, Any] = {}
    if coll.reduces:
        kwargs["op"] = op
    if coll.rooted:
        kwargs["root"] = root
    box: dict[str, Any] = {"out": None}

    def run() -> None:
        box["out"] = call(obj, **kwargs)
    return Prepared(run, lambda: box["out"], _no_reset)
