"""How a rank maps a peer's buffer into its own address space: a table of mappers.

The ``ipc`` transport and the device shm all-reduce read peers' buffers
directly.  A mapper exports a buffer's whole allocation as bytes, once, that
travel over the backend, and the peer opens them as a tensor of its own:

- ``cuda-ipc``: CUDA IPC through torch (``torch.multiprocessing.reductions``:
  ``reduce_tensor`` on the producer, ``rebuild_cuda_tensor`` on the consumer).
  Chosen over CuPy's ``ipcGetMemHandle``/``ipcOpenMemHandle`` because the
  buffers are torch tensors from torch's caching allocator: a tensor is often
  a piece of a larger cudaMalloc block, and torch's handle carries the block
  and the piece's offset (CuPy's would need the block's base looked up with
  ``cuMemGetAddressRange``), torch keeps the producer's block alive while a
  consumer holds it (its IPC reference counts), caches opened handles per
  process, and makes the consumer wait on the producer's event at opening.
  This is also the route found to work on our GPU machine (docs/gpu-runs).
- ``posix-shm``: CPU tensors in POSIX shared-memory files (``/dev/shm``),
  allocated by :func:`shared_tensor`.  It stands in for GPU memory in tests
  on machines without a GPU, so that the ``ipc`` transport's protocol and the
  device shm all-reduce run for real across processes; it tests their
  plumbing, not CUDA.

Every mapper also allocates buffers its peers can map (``alloc``: the
algorithms' scratch) and waits for this rank's queued work on the buffers'
device (``sync``; a mapper is made for one device, which need not be the current
one), which must be done before a peer is told a buffer is ready.
"""
from __future__ import annotations

import mmap
import os
import pickle
import uuid
import weakref
from typing import Any, Callable

from ...errors import UnsupportedError
from ...lazy import torch_module as _torch


def whole(part: Any) -> Any:
    """A flat uint8 tensor over the whole storage ``part`` is a view of."""
    torch = _torch()
    return torch.empty(0, dtype=torch.uint8, device=part.device).set_(part.untyped_storage())


def offset_bytes(part: Any) -> int:
    """Where ``part`` starts in its storage, in bytes."""
    return part.data_ptr() - part.untyped_storage().data_ptr()


class CudaIpc:
    """CUDA IPC through torch's tensor reductions (see the module doc)."""

    name = "cuda-ipc"

    def __init__(self, device: Any) -> None:
        self.device = device             # the buffers' GPU, whichever one is current

    def export(self, storage: Any) -> bytes:
        # torch.multiprocessing is optional: only with CUDA tensors
        from torch.multiprocessing.reductions import reduce_tensor
        self.sync()                      # reduce_tensor records an event; the data must be there
        return pickle.dumps(reduce_tensor(storage))

    def open(self, blob: bytes) -> Any:
        rebuild, args = pickle.loads(blob)
        return rebuild(*args)

    def alloc(self, nbytes: int, like: Any) -> Any:
        torch = _torch()
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=like.device)

    def sync(self) -> None:
        _torch().cuda.current_stream(self.device).synchronize()


#: data_ptr of every live posix-shm tensor's storage -> (path, bytes).
_SEGMENTS: dict[int, tuple[str, int]] = {}


def _drop(ptr: int, path: str) -> None:
    _SEGMENTS.pop(ptr, None)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def shared_tensor(nbytes: int, dtype: Any = None) -> Any:
    """A CPU tensor of ``nbytes`` bytes (as ``dtype``) in a new /dev/shm file that peers
    can map (the ``posix-shm`` stand-in for device memory); the file goes with the tensor."""
    torch = _torch()
    path = f"/dev/shm/ddlcomm-peer-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    size = max(nbytes, 1)
    with open(path, "w+b") as f:
        f.truncate(size)
        mm = mmap.mmap(f.fileno(), size)
    raw = torch.frombuffer(mm, dtype=torch.uint8)
    _SEGMENTS[raw.data_ptr()] = (path, size)
    out = raw[:nbytes] if dtype is None else raw[:nbytes].view(dtype)
    weakref.finalize(out, _drop, raw.data_ptr(), path)      # the file goes with the tensor
    return out


class PosixShm:
    """CPU tensors in /dev/shm files, mapped by path (the stand-in; see the module doc)."""

    name = "posix-shm"

    def __init__(self, device: Any) -> None:
        """``device`` is the CPU's: host memory has no stream to wait on (see :meth:`sync`)."""

    def export(self, storage: Any) -> bytes:
        found = _SEGMENTS.get(storage.data_ptr())
        if found is None:
            raise UnsupportedError("the posix-shm mapper maps only buffers from "
                                   "ddlcomm.comm.device.peers.shared_tensor",
                                   "allocate the buffers with shared_tensor(), or use the staged transport")
        return pickle.dumps(found)

    def open(self, blob: bytes) -> Any:
        torch = _torch()
        path, size = pickle.loads(blob)
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), size)
        return torch.frombuffer(mm, dtype=torch.uint8)       # keeps the mapping alive

    def alloc(self, nbytes: int, like: Any) -> Any:
        return shared_tensor(nbytes)

    def sync(self) -> None:
        return None


#: Mappers by name, each made for the device of the buffers it maps.
MAPPERS: dict[str, Callable[[Any], Any]] = {"cuda-ipc": CudaIpc, "posix-shm": PosixShm}


def mapper_for(tensor: Any, name: str = "auto") -> Any:
    """The mapper ``name`` for ``tensor``'s device, or for ``auto`` the one of ``tensor``'s
    memory: CUDA IPC for CUDA tensors, the posix-shm stand-in for CPU tensors."""
    if name == "auto":
        name = "cuda-ipc" if tensor.is_cuda else "posix-shm"
    try:
        return MAPPERS[name](tensor.device)
    except KeyError:
        raise UnsupportedError(f"no peer mapper {name!r}", f"choose {', '.join(MAPPERS)}") from None
