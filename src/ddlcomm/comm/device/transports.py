"""How a block of a device buffer reaches one peer: a table of transports.

- ``staged``: through pinned host buffers over the backend's point-to-point
  (any backend, ranks on any node): the sender copies the block to the host
  and sends it, the receiver receives into the host and copies it to the
  device.  The backend only ever sees host memory.
- ``ipc``: ranks of one node.  The sender tells the receiver "ready" (a small
  header: buffer id, byte offset, bytes); the first time a buffer goes to a
  peer the header says so and the mapper's handle follows (once per buffer
  and peer); the receiver reads the block straight from the sender's buffer
  (a device-to-device copy, or a reduction reading it), then answers
  "done", after which the sender may overwrite it.  The backend carries
  only these small host messages.

Both run in three halves so that an algorithm's step can send to one peer
and receive from another without deadlock: ``post_send`` and ``post_recv``
start everything without waiting, ``finish_recv`` returns the received
block (a host tensor for ``staged``, the peer's memory for ``ipc``),
``release_recv`` says done (a request to wait on at the end), ``finish_send``
waits until the peer is done.
:func:`choose` picks a pair's transport (pure).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...errors import UsageError
from ...lazy import torch_module as _torch
from ..native._common import DATA_TAG, DONE_TAG, READY_TAG
from .peers import offset_bytes, whole

#: A "ready" header: buffer id, byte offset, bytes, length of the handle that follows (0: known).
HEADER = 4


def choose(wanted: str, my_node: str, peer_node: str) -> str:
    """The transport between this rank and a peer (pure): ``wanted`` unless ``auto``;
    ``auto`` is ``ipc`` on one node, ``staged`` across nodes.  ``ipc`` across nodes is refused."""
    if wanted == "auto":
        return "ipc" if my_node == peer_node else "staged"
    if wanted not in TRANSPORTS:
        raise UsageError(f"unknown device transport {wanted!r}", f"choose auto, {', '.join(TRANSPORTS)}")
    if wanted == "ipc" and my_node != peer_node:
        raise UsageError(f"the ipc transport maps peers' memory on one node: {my_node} and "
                         f"{peer_node} are two", "use staged (or auto) across nodes")
    return wanted


class Staging:
    """Grow-only host buffers (pinned where there is CUDA), one per slot, as uint8 tensors."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self._bufs: dict[str, Any] = {}

    def get(self, slot: str, nbytes: int) -> Any:
        buf = self._bufs.get(slot)
        if buf is None or buf.numel() < nbytes:
            torch = _torch()
            buf = self._bufs[slot] = torch.empty(max(nbytes, 64), dtype=torch.uint8,
                                                 pin_memory=self.pinned)
        return buf[:nbytes]


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


class StagedTransport:
    """Blocks through pinned host memory over the backend (see the module doc)."""

    name = "staged"

    def __init__(self, comm: Any, staging: Staging) -> None:
        self.comm, self.staging = comm, staging

    def post_send(self, part: Any, dest: int) -> Any:
        host = self.staging.get("send", _nbytes(part))
        host.view(part.dtype).copy_(part)                 # device -> host, done on return
        array = host.numpy()
        return self.comm._isend(array, dest, DATA_TAG), array

    def post_recv(self, part: Any, source: int) -> Any:
        host = self.staging.get("recv", _nbytes(part))
        return self.comm._irecv(host.numpy(), source, DATA_TAG), host, part.dtype

    def finish_recv(self, pending: Any) -> Any:
        req, host, dtype = pending
        req.wait()
        return host.view(dtype)

    def release_recv(self, pending: Any) -> Optional[Any]:
        return None

    def finish_send(self, sent: Any) -> None:
        sent[0].wait()

    def forget(self, buf: Any) -> None:
        return None


class IpcTransport:
    """Blocks read from the peer's own memory, mapped once per buffer (see the module doc)."""

    name = "ipc"

    def __init__(self, comm: Any, mapper: Any) -> None:
        self.comm, self.mapper = comm, mapper
        self._ids: dict[tuple[int, int], int] = {}          # my storages -> id
        self._told: set[tuple[int, int]] = set()            # (peer, id) whose handle was sent
        self._opened: dict[tuple[int, int], Any] = {}       # (peer, id) -> that peer's storage here
        self._done = np.zeros(1, np.int64)
        self._next = 0

    def _id(self, part: Any) -> tuple[int, Any]:
        storage = part.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        ident = self._ids.get(key)
        if ident is None:
            self._next += 1
            ident = self._ids[key] = self._next
        return ident, storage

    def post_send(self, part: Any, dest: int) -> Any:
        ident, _ = self._id(part)
        blob = b""
        if (dest, ident) not in self._told:
            blob = self.mapper.export(whole(part))
            self._told.add((dest, ident))
        self.mapper.sync()                                  # the block is there before "ready"
        header = np.array([ident, offset_bytes(part), _nbytes(part), len(blob)], np.int64)
        reqs = [self.comm._isend(header, dest, READY_TAG)]
        handle = np.frombuffer(blob, np.uint8).copy() if blob else None
        if handle is not None:
            reqs.append(self.comm._isend(handle, dest, READY_TAG))
        return reqs, header, handle, dest

    def post_recv(self, part: Any, source: int) -> Any:
        header = np.zeros(HEADER, np.int64)
        return self.comm._irecv(header, source, READY_TAG), header, part, source

    def finish_recv(self, pending: Any) -> Any:
        req, header, part, source = pending
        req.wait()
        ident, offset, nbytes, blob_len = (int(x) for x in header)
        if blob_len:
            blob = np.empty(blob_len, np.uint8)
            self.comm._recv(blob, source, READY_TAG)
            self._opened[source, ident] = self.mapper.open(blob.tobytes())
        if nbytes != _nbytes(part):
            raise UsageError(f"rank {source} made ready {nbytes} bytes where {_nbytes(part)} "
                             "were expected (the ranks run different calls)")
        return self._opened[source, ident][offset:offset + nbytes].view(part.dtype)

    def release_recv(self, pending: Any) -> Optional[Any]:
        """Say "done" (non-blocking: a blocking send here could wait on a ring of peers
        all saying done at once); the caller waits on the request after ``finish_send``."""
        self.mapper.sync()                                  # done reading before "done"
        return self.comm._isend(self._done, pending[3], DONE_TAG)

    def finish_send(self, sent: Any) -> None:
        reqs, _, _, dest = sent
        for req in reqs:
            req.wait()
        self.comm._recv(np.zeros(1, np.int64), dest, DONE_TAG)

    def forget(self, buf: Any) -> None:
        """Drop ``buf``'s id before its memory is freed (a later buffer there gets a new id,
        and its handle is sent again)."""
        storage = buf.untyped_storage()
        self._ids.pop((storage.data_ptr(), storage.nbytes()), None)


#: Transports by name.
TRANSPORTS = {"staged": StagedTransport, "ipc": IpcTransport}
