"""What a buffer is to a Communicator: a NumPy array (host memory of any kind,
pinned included) or a torch tensor (a CUDA tensor: device memory).

Only duck typing here, so that this module needs no torch: a tensor is
anything with ``data_ptr``, ``numel`` and ``is_cuda``.  Its dtype is read from
``str(tensor.dtype)`` (``"torch.float32"`` -> ddlcomm's ``float32``).  The
checks of :mod:`ddlcomm.comm.base` call these only for buffers that are not
NumPy arrays, so the host path pays nothing for them.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..collectives import COLLECTIVES
from ..dtypes import DTYPES, DType
from ..errors import DdlcommError, UnsupportedError, UsageError

HOST, DEVICE = "host", "device"


def is_tensor(buf: Any) -> bool:
    """Whether ``buf`` looks like a torch tensor."""
    return hasattr(buf, "data_ptr") and hasattr(buf, "numel") and hasattr(buf, "is_cuda")


def memory_of(buf: Any) -> str:
    """``"device"`` for a CUDA tensor, else ``"host"`` (NumPy arrays, CPU tensors)."""
    return DEVICE if is_tensor(buf) and buf.is_cuda else HOST


def tensor_dtype(tensor: Any) -> DType:
    """ddlcomm's DType of a torch tensor (UnsupportedError for a dtype ddlcomm has no name for)."""
    name = str(tensor.dtype).rpartition(".")[2]
    found = DTYPES.get(name)
    if found is None:
        raise UnsupportedError(f"a tensor of {tensor.dtype} is not a ddlcomm dtype",
                               f"use one of {', '.join(DTYPES)}")
    return found


def count(buf: Any) -> int:
    """Elements of an array or a tensor."""
    return buf.size if isinstance(buf, np.ndarray) else int(buf.numel())


def numpy_dtype(buf: Any) -> np.dtype:
    """The NumPy dtype of an array, or of the same name as a tensor's."""
    return buf.dtype if isinstance(buf, np.ndarray) else tensor_dtype(buf).numpy


def check_tensor(tensor: Any) -> DType:
    """A tensor's DType if it is a contiguous tensor ddlcomm can carry (else a precise error)."""
    if not is_tensor(tensor):
        raise UsageError(f"buffers must be NumPy arrays or torch tensors, got {type(tensor).__name__}",
                         "send other Python objects with the *_object calls")
    dtype = tensor_dtype(tensor)
    if not tensor.is_contiguous():
        raise UsageError("tensor buffers must be contiguous", "pass tensor.contiguous()")
    if getattr(tensor, "requires_grad", False):
        raise UsageError("tensor buffers must not require grad (autograd does not see a "
                         "collective's writes)", "pass tensor.detach(): it shares the memory")
    return dtype


def overlap(a: Any, b: Any) -> bool:
    """Whether two contiguous buffers (arrays or tensors, on the same device) share bytes."""
    if a.__class__ is np.ndarray and b.__class__ is np.ndarray:      # the host path, cheaply
        return bool(np.may_share_memory(a, b))
    if memory_of(a) != memory_of(b) or (is_tensor(a) and is_tensor(b) and a.device != b.device):
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def check_apart(recvbuf: Any, sendbuf: Any, what: str) -> None:
    """Refuse a receive buffer that shares bytes with the send buffer without being it:
    every algorithm reads the send buffer while it writes the result, so only the send
    buffer itself (``recvbuf is sendbuf``) means in place."""
    if recvbuf is not sendbuf and overlap(recvbuf, sendbuf):
        raise UsageError(f"{what} overlaps the send buffer",
                         "pass the send buffer itself as recvbuf to work in place")


def _span(buf: Any) -> tuple[int, int]:
    """The addresses a contiguous array or tensor occupies: [start, end)."""
    if isinstance(buf, np.ndarray):
        start = buf.__array_interface__["data"][0]
        return start, start + buf.nbytes
    start = buf.data_ptr()
    return start, start + buf.numel() * buf.element_size()


def empty(count_: int, like: Any) -> Any:
    """A new buffer of ``count_`` elements of ``like``'s dtype, where ``like`` lives: a NumPy
    array for an array, a tensor on the same device for a tensor."""
    if isinstance(like, np.ndarray):
        return np.empty(count_, like.dtype)
    return like.new_empty(count_)


def empty_like(like: Any) -> Any:
    """A new buffer of ``like``'s shape and dtype, where ``like`` lives."""
    return np.empty(like.shape, like.dtype) if isinstance(like, np.ndarray) else like.new_empty(like.shape)


def contiguous(buf: Any) -> Any:
    """A contiguous array or tensor of ``buf``'s elements (a detached one for a tensor);
    UsageError for anything else."""
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf)
    if is_tensor(buf):
        return buf.detach().contiguous()
    raise UsageError(f"buffers must be NumPy arrays or torch tensors, got {type(buf).__name__}")


def copy_of(buf: Any) -> Any:
    """A writable, contiguous copy of an array or a tensor."""
    return np.array(buf) if isinstance(buf, np.ndarray) else buf.clone()


#: The collectives whose receive buffer may be the send buffer (in place).
IN_PLACE = [c.name for c in COLLECTIVES.values() if c.in_place_ok]


def check_recv(recvbuf: Any, sendbuf: Any, n: int, what: str, check_buffer: Callable[[Any], Any],
               in_place: bool = False) -> Any:
    """``recvbuf`` if it is a writable buffer of ``n`` elements of sendbuf's dtype that the
    backend carries (``check_buffer``: its own check), apart from the send buffer, or the
    send buffer itself only where the collective runs ``in_place``: the one check of the
    Communicator's methods and of ddlcomm's own algorithms."""
    if recvbuf is None:
        raise UsageError(f"{what} needs {n} elements, got none")
    if recvbuf is sendbuf and not in_place:
        raise UsageError(f"{what} is its send buffer: only {' and '.join(IN_PLACE)} run in place",
                         "pass another receive buffer, or none for a new one")
    if recvbuf is not sendbuf:
        check_buffer(recvbuf)
        have, want = numpy_dtype(recvbuf), numpy_dtype(sendbuf)
        if have != want:
            raise UsageError(f"{what} is {have}, not {want} like the send buffer")
        check_apart(recvbuf, sendbuf, what)
    got = recvbuf.size if recvbuf.__class__ is np.ndarray else count(recvbuf)
    if got != n:
        raise UsageError(f"{what} needs {n} elements, got {got}")
    check_writable(recvbuf, what)
    return recvbuf


def check_writable(array: np.ndarray, what: str) -> None:
    """Refuse a read-only array as a buffer ddlcomm writes into (tensors are always writable)."""
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        raise UsageError(f"{what} is read-only", "pass a writable array (e.g. a.copy())")


def take_part(refused: DdlcommError, call_anyway: Callable[[], Any]) -> DdlcommError:
    """Where a check of this rank's own buffers that the others cannot see refused (a
    receive buffer of the wrong size, read-only, not contiguous): this rank still takes
    part in the call (``call_anyway``, with scratch memory), so the other ranks are
    neither left in it nor matched by its next call; returns the refusal to raise.  (A
    ``try`` costs nothing where the check passes: these are every call's checks.)"""
    try:
        call_anyway()
    except Exception:  # noqa: BLE001 - the scratch call failed too: the refusal says why
        pass
    return refused
