"""Bad calls of the Python API as plain data, and how to make one (shared by the
in-process tests and the 1-rank MPI worker of ``test_bad_input.py``).

A case is ``(call, args, kwargs)``; a buffer in it is ``("buf", dtype, shape, mode)``
built by :func:`materialize` on the side that runs it (pickling would lose the
read-only flag and the strides).
"""
from __future__ import annotations

import traceback

import numpy as np

import ddlcomm
from ddlcomm.comm.base import Communicator
from ddlcomm.comm.group import Group
from ddlcomm.errors import DdlcommError


def buffer(array_dtype, shape, mode: str = "plain") -> np.ndarray:
    """An array of ``shape``: plain, non-contiguous (every other column), read-only or Fortran."""
    if mode == "noncontig":
        return np.ones((*shape[:-1], shape[-1] * 2), array_dtype)[..., ::2]
    a = np.ones(shape, array_dtype, order="F" if mode == "fortran" else "C")
    if mode == "readonly":
        a.setflags(write=False)
    return a


def materialize(value):
    """``value`` with its buffer specs made into arrays (lists and dicts walked)."""
    if isinstance(value, tuple) and value[:1] == ("buf",):
        return buffer(*value[1:])
    if isinstance(value, list):
        return [materialize(v) for v in value]
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    return value


def run(comm, case) -> tuple[str, str]:
    """Run one case on ``comm``: ``("ok", "")``, ``("refused", the error's line)`` or
    ``("crashed", its traceback)`` for anything that is not a ddlcomm error."""
    call, args, kwargs = case
    args, kwargs = materialize(list(args)), materialize(dict(kwargs))
    target = {"init": ddlcomm.init, "Group": lambda *a: Group(comm, *a)}.get(call)
    try:
        (target or getattr(comm, call))(*args, **kwargs)
    except DdlcommError as exc:
        return "refused", f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - the point of the suite: name any other failure
        return "crashed", traceback.format_exc()
    return "ok", ""


class Loopback(Communicator):
    """A 1-rank communicator with no library underneath: every primitive copies."""

    name, rank, size, local_rank = "loopback", 0, 1, 0
    library = library_version = "none"

    def _barrier(self):
        pass

    def _send(self, buf, dest, tag):
        self._held = buf.copy()

    def _recv(self, buf, source, tag):
        buf[...] = self._held

    def _recv_any(self, buf, tag):
        self._recv(buf, 0, tag)
        return 0

    def _sendrecv(self, sendbuf, dest, recvbuf, source, tag):
        recvbuf[...] = sendbuf

    def _isend(self, buf, dest, tag):
        self._send(buf, dest, tag)

    def _irecv(self, buf, source, tag):
        self._recv(buf, source, tag)

    def _broadcast(self, buf, root):
        pass

    def _gather(self, sendbuf, recvbuf, root):
        recvbuf.reshape(-1)[...] = sendbuf.reshape(-1)         # as a library: bytes in order

    def _allgather(self, sendbuf, recvbuf):
        self._gather(sendbuf, recvbuf, 0)

    def _alltoall(self, sendbuf, recvbuf):
        self._gather(sendbuf, recvbuf, 0)

    def _reduce(self, sendbuf, recvbuf, op, root):
        if recvbuf is not None and recvbuf is not sendbuf:
            self._gather(sendbuf, recvbuf, root)

    def _allreduce(self, sendbuf, recvbuf, op):
        self._reduce(sendbuf, recvbuf, op, 0)

    def _reduce_scatter(self, sendbuf, recvbuf, op):
        self._gather(sendbuf, recvbuf, 0)
