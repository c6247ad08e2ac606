"""``DeviceLink``: the native algorithms' moves (``_common.HostLink``'s methods) on device tensors.

The ring, rhd and binomial algorithms of :mod:`ddlcomm.comm.native` call
``link.exchange``, ``link.exchange_reduce``, ``link.send``, ``link.recv`` and
``link.scratch``; here each message goes to a peer by that pair's transport
(:mod:`.transports`: ``ipc`` on one node, ``staged`` across nodes, or one
forced for every pair), and reductions are done by the reducer the caller
chose for the buffers' kind (on the GPU for device tensors).  A received
block on the host (``staged``) is copied to a device scratch buffer before
it is reduced, so reductions never run on the host.  Pieces (``chunk``) are
not pipelined on the device: a step's block moves whole.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..nodes import node_name
from .peers import mapper_for
from .transports import TRANSPORTS, Staging, choose

#: Scratch slot of received blocks copied to the device before a reduction.
RECV_SLOT = -1


def _empty(t: Any) -> bool:
    return t is None or len(t) == 0


class DeviceLink:
    """Moves between this rank's device tensors and its peers' (see the module doc).

    Collective: every rank creates its link together (the node names are
    gathered once).  ``like`` is a tensor of the buffers' device;
    ``transport``: ``auto``, ``ipc`` or ``staged`` for every pair;
    ``mapper``: the peer mapper of ``ipc`` (``auto``: CUDA IPC on CUDA tensors).
    """

    def __init__(self, comm: Any, like: Any, transport: str = "auto", mapper: str = "auto") -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        nodes = comm.allgather_object(node_name()) if comm.size > 1 else [node_name()]
        names = [choose(transport, nodes[comm.rank], node) for node in nodes]
        self._mapper = mapper_for(like, mapper) if "ipc" in names else None
        made = {"staged": lambda: TRANSPORTS["staged"](comm, Staging(pinned=bool(like.is_cuda))),
                "ipc": lambda: TRANSPORTS["ipc"](comm, self._mapper)}
        built = {name: made[name]() for name in set(names)}
        self._peers = [built[name] for name in names]
        self._scratch: dict[int, Any] = {}
        self.used: set[str] = set()

    def transport(self, peer: int) -> Any:
        return self._peers[peer]

    def scratch(self, like: Any, count: int, slot: int = 0) -> Any:
        """A reusable tensor of ``count`` elements of ``like``'s dtype that peers can map."""
        nbytes = count * like.element_size()
        buf = self._scratch.get(slot)
        if buf is None or buf.numel() < nbytes:
            if buf is not None:
                for t in self._peers:
                    t.forget(buf)
            buf = self._scratch[slot] = (self._mapper.alloc(nbytes, like) if self._mapper
                                         else like.new_empty(max(nbytes, 1), dtype=_uint8()))
        return buf[:nbytes].view(like.dtype)

    def _move(self, sendpart: Any, dest: int, recvpart: Any, source: int,
              land: Callable[[Any], None]) -> None:
        """Send ``sendpart`` to ``dest``; receive a block like ``recvpart`` from ``source`` and
        ``land(block)`` it (copy or reduce); empty parts move nothing, at both ends alike."""
        sent = pending = done = None
        if not _empty(sendpart):
            tx = self._peers[dest]
            self.used.add(tx.name)
            sent = tx.post_send(sendpart, dest)
        if not _empty(recvpart):
            rx = self._peers[source]
            self.used.add(rx.name)
            pending = rx.post_recv(recvpart, source)
            land(rx.finish_recv(pending))
            done = rx.release_recv(pending)
        if sent is not None:
            self._peers[dest].finish_send(sent)
        if done is not None:
            done.wait()

    def exchange(self, sendpart: Any, dest: int, recvpart: Any, source: int) -> None:
        self._move(sendpart, dest, recvpart, source, recvpart.copy_)

    def exchange_reduce(self, sendpart: Any, dest: int, mine: Any, out: Any, source: int,
                        reduce: Callable, chunk: Optional[int] = None) -> None:
        def land(block: Any) -> None:
            if block.device != out.device:                   # staged: to the device first
                tmp = self.scratch(out, len(out), RECV_SLOT)
                tmp.copy_(block)
                block = tmp
            reduce(mine, block, out)
        self._move(sendpart, dest, out, source, land)

    def send(self, buf: Any, dest: int, chunk: Optional[int] = None) -> None:
        self._move(buf, dest, None, -1, _nothing)

    def recv(self, buf: Any, source: int, chunk: Optional[int] = None) -> None:
        self._move(None, -1, buf, source, buf.copy_)

    def transports_used(self) -> str:
        """The transports this rank's moves went by, e.g. ``"ipc"`` or ``"ipc+staged"``."""
        return "+".join(sorted(self.used)) or "none"


def _nothing(_block: Any) -> None:
    return None


def _uint8() -> Any:
    # torch is optional: device algorithms run on torch tensors only
    import torch
    return torch.uint8
