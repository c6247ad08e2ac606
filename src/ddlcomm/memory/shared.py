"""``shared``: a POSIX shared-memory segment other processes on the node can map by name.

The segment is a file in ``/dev/shm`` (what ``shm_open`` creates) named
``ddlcomm-<pid>-<n>-<random>``, created exclusively, sized with
``posix_fallocate`` (so a too-small /dev/shm, as in a default Docker
container, fails now with ENOSPC instead of a SIGBUS at the first write) and
mapped ``MAP_SHARED``.  Another process maps it with :func:`attach`, or with
``multiprocessing.shared_memory.SharedMemory(name)``.  :meth:`Buffer.free`
unmaps it and, in the creating process, unlinks the name (processes that
still map it keep their mapping).  placement records ``shm_name``.
"""
from __future__ import annotations

import errno
import itertools
import os
import secrets
from typing import Callable

from ..errors import UnsupportedError, UsageError
from . import vm
from .base import Buffer, from_mapping, require_linux

SHM_DIR = "/dev/shm"
_counter = itertools.count()
#: Segments this process created and still maps: first address -> (name, bytes).
_live: dict[int, tuple[str, int]] = {}


def segment_of(array) -> tuple[str, int] | None:
    """(name, byte offset) of the live segment holding ``array``'s data, or None.

    Lets the shared-memory collectives map another rank's buffer by name.
    """
    address = array.__array_interface__["data"][0]
    for start, (name, nbytes) in _live.items():
        if start <= address and address + array.nbytes <= start + nbytes:
            return name, address - start
    return None


def check(arg: str | None, hbw_fallback: str | None) -> None:
    require_linux("shared")
    if not (os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)):
        raise UnsupportedError(f"memory kind shared needs a writable {SHM_DIR}",
                               "mount a tmpfs on /dev/shm (docker run --shm-size=...)")


def _map(name: str, fd: int, nbytes: int, info: dict, then: Callable[[], None] | None) -> Buffer:
    mapping = vm.map_region(vm.round_up(nbytes, vm.PAGE_BYTES), flags=vm.MAP_SHARED, fd=fd)
    return from_mapping("shared", "shared", nbytes, mapping, {"shm_name": name, **info}, then)


def create(nbytes: int) -> tuple[str, int]:
    """A new segment of ``nbytes`` (whole pages) in /dev/shm: (its name, an open fd the caller
    closes).  UnsupportedError, with the name removed, where /dev/shm cannot hold it."""
    name = f"ddlcomm-{os.getpid()}-{next(_counter)}-{secrets.token_hex(4)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, vm.round_up(nbytes, vm.PAGE_BYTES))
    except OSError as exc:
        os.close(fd)
        _unlink(path)
        free = os.statvfs(SHM_DIR)
        raise UnsupportedError(
            f"{SHM_DIR} cannot hold {nbytes} bytes ({errno.errorcode.get(exc.errno or 0, exc.errno)}; "
            f"{free.f_bavail * free.f_frsize} bytes free)",
            "enlarge /dev/shm (docker run --shm-size=...), or use a smaller buffer") from None
    except BaseException:
        os.close(fd)
        _unlink(path)
        raise
    return name, fd


def allocate(spec: str, arg: str | None, nbytes: int, hbw_fallback: str | None) -> Buffer:
    check(arg, hbw_fallback)
    name, fd = create(nbytes)
    path = os.path.join(SHM_DIR, name)
    try:
        buf = _map(name, fd, nbytes, {"method": "shm"}, lambda: _forget(path))
        _live[buf.address] = (name, nbytes)
        return buf
    except BaseException:
        _unlink(path)
        raise
    finally:
        os.close(fd)  # the mapping keeps the segment


def _forget(path: str) -> None:
    name = os.path.basename(path)
    for start in [a for a, (n, _) in _live.items() if n == name]:
        del _live[start]
    _unlink(path)


def unlink(name: str) -> None:
    """Remove the segment ``name`` from /dev/shm, if it is still there (mappings stay)."""
    _unlink(os.path.join(SHM_DIR, name))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def unlink_name(buf: Buffer) -> None:
    """Remove the name of ``buf``'s segment (made here) now that every process that needs it
    has mapped it: the memory stays until the last unmap, and a process killed meanwhile
    leaves nothing in /dev/shm (``free`` then has no name left to unlink)."""
    entry = _live.get(buf.address)
    if entry is not None:
        unlink(entry[0])


def attach(name: str) -> Buffer:
    """Map the segment ``name`` made by another process's ``allocate("shared", ...)``.

    The buffer's size is the segment's (whole pages); freeing it unmaps, it does not unlink.
    """
    if not name or "/" in name:
        raise UsageError(f"bad shared-memory name {name!r}", "give the shm_name of the creating buffer")
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    except FileNotFoundError:
        raise UsageError(f"no shared-memory segment {name!r} in {SHM_DIR}",
                         "was it freed already? attach while the creating process holds it") from None
    try:
        return _map(name, fd, os.fstat(fd).st_size, {"method": "shm", "attached": True}, None)
    finally:
        os.close(fd)
