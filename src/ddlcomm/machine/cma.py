"""Cross-memory attach (CMA): can one process copy straight from another's memory here?

Open MPI's shared-memory transport copies a large message once, the receiver reading
the sender's buffer (``smsc/cma``), where the machine allows it; where not, the sender
copies into shared fragments and the receiver copies out.  Whether it is allowed is the
machine's: yama's ``ptrace_scope``, the container's seccomp filter and capabilities.  It
is a fact for users; the cost model does not read it (Open MPI's tree broadcasts send in
turn with CMA too: ``ddlcomm.model.library.SENDS_IN_TURN``).  The probe asks as Open MPI
does (``opal/mca/smsc/cma``): an owner process opens itself to any tracer
(``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``) where ``ptrace_scope`` is above 0; a
sibling asks ``kcmp(KCMP_VM)`` about it, Open MPI's test, and reads a buffer of the
owner's with ``process_vm_readv``.  It forks, so it runs in a child interpreter of its
own (:func:`facts`).
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Any, Optional

from . import probe

PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
#: ``kcmp``'s system call number by machine (``SYS_kcmp``); ``KCMP_VM`` compares address spaces.
SYS_KCMP = {"x86_64": 312, "aarch64": 272, "ppc64le": 354}
KCMP_VM = 1
PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
#: What the owner writes into its buffer after the fork (the reader's own copy keeps zeros).
PATTERN = b"ddlcomm-cma-probe"


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def outcome(rc: int, err: int) -> str:
    """``ok``, or the errno's name and text of a failed call (pure)."""
    if rc >= 0:
        return "ok"
    return f"{errno.errorcode.get(err, str(err))}: {os.strerror(err)}"


def verdict(answers: dict[str, Any]) -> dict[str, Any]:
    """``available`` and, when not, the ``reason``, from the probe's ``answers`` (pure): the
    read must have returned the owner's bytes, and ``kcmp``, where asked, answered."""
    read, kcmp = answers.get("process_vm_readv"), answers.get("kcmp")
    for call, said in (("prctl(PR_SET_PTRACER_ANY)", answers.get("ptracer_any")),
                       ("kcmp(KCMP_VM)", kcmp), ("process_vm_readv", read)):
        if said not in (None, "ok"):
            return {**answers, "available": False, "reason": f"{call} between sibling processes: {said}"}
    if read != "ok":
        return {**answers, "available": False, "reason": "process_vm_readv was not tried"}
    return {**answers, "available": True}


def _read_scope() -> Optional[int]:
    try:
        with open(PTRACE_SCOPE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _owner(buffer, ready_w: int, done_r: int, scope: Optional[int]) -> None:
    """The forked owner: opens itself to tracers as Open MPI does, writes the pattern, waits."""
    libc = ctypes.CDLL(None, use_errno=True)
    said = "ok"
    if scope:
        said = outcome(libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0),
                       ctypes.get_errno())
    ctypes.memmove(buffer, PATTERN, len(PATTERN))
    os.write(ready_w, said.encode())
    os.read(done_r, 1)


def _reader(owner: int, address: int, answer_w: int) -> None:
    """The forked sibling: kcmp, then the read of the owner's buffer; answers as text."""
    libc = ctypes.CDLL(None, use_errno=True)
    number = SYS_KCMP.get(platform.machine())
    kcmp = None if number is None else outcome(
        libc.syscall(number, os.getpid(), owner, KCMP_VM, 0, 0), ctypes.get_errno())
    got = ctypes.create_string_buffer(len(PATTERN))
    local = _Iovec(ctypes.cast(got, ctypes.c_void_p), len(PATTERN))
    remote = _Iovec(address, len(PATTERN))
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    rc = libc.process_vm_readv(owner, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    read = outcome(rc, ctypes.get_errno())
    if read == "ok" and got.raw != PATTERN:
        read = "read bytes that are not the owner's"
    os.write(answer_w, f"{kcmp}\n{read}".encode())


def _child(work) -> int:
    pid = os.fork()
    if pid == 0:                                      # pragma: no cover - the forked side
        try:
            work()
        finally:
            os._exit(0)
    return pid


def in_this_process() -> dict[str, Any]:
    """The probe itself (it forks: run it alone in its process, as :func:`facts` does)."""
    scope = _read_scope()
    buffer = ctypes.create_string_buffer(len(PATTERN))
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    owner = _child(lambda: _owner(buffer, ready_w, done_r, scope))
    os.close(ready_w)                                 # an owner that died reads as an end
    os.close(done_r)
    try:
        said = os.read(ready_r, 200).decode()        # the owner's pattern is in place
        ptracer = said if scope else None
        answer_r, answer_w = os.pipe()                # the owner holds no end of it
        reader = _child(lambda: _reader(owner, ctypes.addressof(buffer), answer_w))
        os.close(answer_w)
        kcmp, _, read = os.read(answer_r, 400).decode().partition("\n")
        os.waitpid(reader, 0)
    finally:
        try:
            os.write(done_w, b"x")
        except OSError:                               # the owner is gone already
            pass
        os.waitpid(owner, 0)
    return verdict({"ptrace_scope": scope, "ptracer_any": ptracer,
                    "kcmp": None if kcmp == "None" else kcmp, "process_vm_readv": read or None})


def facts() -> dict[str, Any]:
    """:func:`in_this_process` in a child interpreter: ``available`` (with ``reason`` when
    not), ``ptrace_scope``, and what ``prctl``, ``kcmp`` and ``process_vm_readv`` said."""
    answer = probe.child("ddlcomm.machine.cma:in_this_process")
    if "error" in answer:
        return {"available": False, "reason": answer["error"]}
    return answer
