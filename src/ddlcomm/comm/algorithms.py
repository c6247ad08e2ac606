"""Which implementation runs a collective: the library's, ddlcomm's own, or ``auto``.

``--algorithm`` names are looked up here: ``library`` (the backend's own
collective), the native algorithms over point-to-point
(:mod:`ddlcomm.comm.native`: ring, rhd, binomial, ...), the all-reduces
through shared memory (:data:`SHARED_MEMORY`: ``shm`` inside one node,
``hierarchical`` across nodes), and ``auto``.

``auto`` picks per collective, size and rank count: from a measured table of
this machine where one is given (:mod:`ddlcomm.comm.tuning`, ``bench
--tuning``), else from what we measured on our machine and the cost model.  With every rank on one node and the
pipelined shm all-reduce built (:func:`ddlcomm.comm.shm.pipelines`), the
all-reduce runs ``shm`` from ``SHM_MIN_BYTES`` up and the library's below
(docs/benchmarks.md, "The pipelined shm all-reduce"); over Gloo, whose own
all-reduce takes hundreds of µs at any size, ``shm`` at every size on host
buffers (``SHM_MIN_BYTES_OF``).  Across nodes: below
``RING_MIN_BYTES`` the library's collective (small messages, where the
library's latency wins: see docs/benchmarks.md, "ddlcomm's own
all-reduce"); from there up, of the ring
and recursive halving/doubling, the one whose α-β-γ schedule
(:func:`ddlcomm.comm.native.schedule`) is cheaper on that many ranks with
:data:`AUTO_PARAMS` -- both move the same bytes on powers of two, where rhd
needs fewer rounds; elsewhere rhd's fold costs 2n more bytes and the ring
wins.  Ties go to the ring (2 ranks).  Collectives with no faster native
path measured stay with the library.  The choice is recorded with each point
as ``algorithm_run``.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import numpy as np

from ..collectives import get_collective
from ..dtypes import ReduceOp
from ..errors import UsageError
from ..kernels import reducer
from ..kernels.device import DEVICE_KERNELS, HOST_KERNELS
from ..lazy import load
from ..units import format_size
from . import device, native, shm
from .agree import agreed_alike, attempt
from .native._common import check_buf, check_op, check_recv, flat
from .names import KERNEL_SEP, piece, split
from .tuning import Tuning

#: From this size up ``auto`` uses ddlcomm's all-reduce (ring or rhd).
RING_MIN_BYTES = 1 << 20
#: On one node, from this size up ``auto`` runs the pipelined shm all-reduce (2 ranks,
#: both MPIs: 4 KiB 2.4 against the library's 3.2 µs, 1 KiB a tie, below the library wins).
SHM_MIN_BYTES = 4 << 10
#: The same by library (lower case) where it differs, on host buffers.  Gloo's own all-reduce
#: takes 0.2-7 ms from 4 B to 1 KiB on one node (its TCP and threads), shm 20-320 µs: 2.4-25x
#: faster at 2-4 ranks (docs/benchmarks.md, "auto over Gloo"), so shm from the first byte.
#: Not on device buffers: the device shm meets through three of the backend's barriers a
#: call, each about one of Gloo's small all-reduces (not measured there below 4 KiB).
SHM_MIN_BYTES_OF = {"gloo": 0}
#: Pieces of this many bytes pipeline each step of the ring and rhd all-reduces that
#: ``--algorithm`` runs: the piece just received is reduced while still in cache
#: (15-25% faster at 64-256 MiB, 2 ranks, both MPIs: docs/benchmarks.md).
PIPELINE_BYTES = 1 << 20
#: (α s per message, β s per byte, γ s per reduced byte) by which ``auto`` ranks ring
#: against rhd: ddlcomm's point-to-point over Open MPI here, to an order of magnitude.
AUTO_PARAMS = (5e-6, 1e-10, 1e-10)

#: The algorithms a piece applies to, per collective.
PIECED = {"allreduce": ("shm", "shm-map", "ring", "rhd")}
#: Kernels a suffix may name (no suffix: on host arrays the compiled kernel where built, else
#: NumPy; on device tensors torch's).  c and numpy reduce host arrays, torch and cupy tensors.
KERNELS = ("c", "numpy", "torch", "cupy")

#: Through shared memory: (collective, name) -> "module:bind_<collective>".
SHARED_MEMORY = {
    ("allreduce", "shm"): "ddlcomm.comm.shm:bind_allreduce",
    ("allreduce", "shm-map"): "ddlcomm.comm.shm_mapped:bind_allreduce",
    ("allreduce", "hierarchical"): "ddlcomm.comm.hierarchical:bind_allreduce",
}
#: The shared-memory all-reduces that need every rank on one node.
ONE_NODE = ("shm", "shm-map")
#: The native algorithms ``auto`` chooses among, per collective (from RING_MIN_BYTES up).
AUTO_CANDIDATES = {"allreduce": ("ring", "rhd")}
#: Collectives whose native algorithms run pipelined in PIPELINE_BYTES pieces.
PIPELINED = ("allreduce",)


def names(collective: str) -> list[str]:
    """Every algorithm name ``--algorithm`` accepts for ``collective``."""
    shared = [name for coll, name in SHARED_MEMORY if coll == collective]
    return ["library", "auto", *native.algorithms_for(collective), *shared]


def choose_auto(collective: str, nbytes: int, nranks: int = 2, pipelined_shm: bool = False,
                library: Optional[str] = None) -> str:
    """The algorithm ``auto`` runs (pure): see the module docstring.  ``pipelined_shm``:
    every rank is on one node and the pipelined shm all-reduce can run; ``library``: the
    backend's (:data:`SHM_MIN_BYTES_OF`)."""
    if pipelined_shm and collective == "allreduce" and nranks >= 2:
        least = SHM_MIN_BYTES_OF.get((library or "").lower(), SHM_MIN_BYTES)
        return "shm" if nbytes >= least else "library"
    candidates = AUTO_CANDIDATES.get(collective)
    if candidates is None or nbytes < RING_MIN_BYTES or nranks < 2:
        return "library"
    return min(candidates,
               key=lambda name: native.schedule(collective, name, nranks, nbytes).time(*AUTO_PARAMS))


def check_distinct(algorithms: Sequence[str]) -> None:
    """Refuse two names of one measurement: ``ring@1MiB`` beside ``ring`` (PIPELINE_BYTES is
    the ring's and rhd's default piece; the shm's depends on the size, so ``shm@512KiB``
    beside ``shm`` stays two)."""
    # the pieced all-reduces that are not shared memory's are native: bind gives them this
    native_default = {base: PIPELINE_BYTES for base in PIECED["allreduce"]
                      if ("allreduce", base) not in SHARED_MEMORY}
    seen: dict[tuple, str] = {}
    for name in algorithms:
        base, kernel = split(name)
        named = piece(name)
        key = (base, kernel, native_default.get(base) if named is None else named)
        if key in seen:
            raise UsageError(f"--algorithm names one measurement twice: {seen[key]} and {name}",
                             f"{format_size(PIPELINE_BYTES)} is {base}'s piece by default: "
                             "name it once")
        seen[key] = name


def check(collective: str, algorithm: str) -> None:
    """Refuse an ``--algorithm`` name ``collective`` does not have (UsageError lists them)."""
    base, kernel = split(algorithm)
    known = names(collective)
    if base not in known:
        raise UsageError(f"no algorithm {base} for {collective}", f"{collective} has: {', '.join(known)}")
    if piece(algorithm) is not None:
        pieced = PIECED.get(collective, ())
        if base not in pieced or (base == "shm" and kernel == "numpy"):
            raise UsageError(f"{algorithm}: a piece applies to the pipelined all-reduces",
                             f"e.g. {', '.join(f'{name}@256KiB' for name in PIECED['allreduce'])}")
    if KERNEL_SEP in algorithm:
        if base == "library" or not get_collective(collective).reduces:
            raise UsageError(f"{algorithm}: a reduction kernel applies to ddlcomm's own reducing "
                             "algorithms", "e.g. ring+numpy for allreduce")
        if kernel not in KERNELS:
            raise UsageError(f"unknown reduction kernel {kernel!r} in {algorithm}",
                             f"choose {' or '.join(KERNELS)}")
        if base == "shm-map" and kernel != "c":
            raise UsageError(f"{algorithm}: shm-map reduces with the compiled kernel only", "use shm-map")


def kernel(algorithm: str, op: Optional[ReduceOp], dtype) -> Optional[Callable]:
    """The reduction kernel ``algorithm`` runs for (op, dtype); None when it reduces nothing."""
    if op is None or split(algorithm)[0] == "library":
        return None
    return reducer(op.name if not op.divide_by_ranks else "sum", dtype, split(algorithm)[1])


def decide(collective: str, algorithm: str, nbytes: int, nranks: int = 2, one_node: bool = False,
           tuning: Optional[Tuning] = None, library: Optional[str] = None,
           on_device: bool = False, one_device: bool = False,
           host_messages: bool = True) -> tuple[str, str]:
    """``auto`` made concrete for this size and rank count (the same on every rank):
    (the algorithm, what chose it: ``asked``, ``tuning`` or ``rules``).

    ``auto`` takes the measured choice of ``tuning`` for ``library``'s
    ``collective`` at ``nranks`` where the table has it and it can run here
    (:func:`runs_here`), else :func:`choose_auto`'s; a kernel suffix is kept on
    ddlcomm's own algorithms (the library's has none).  ``one_node``: every rank
    runs on one node; ``on_device``: the buffers are device tensors
    (:data:`SHM_MIN_BYTES_OF` is of host buffers), and ``one_device``: every
    rank's on one device (:func:`ddlcomm.comm.device.one_gpu`), which the device
    shm all-reduce needs; ``host_messages``: whether the backend carries non-blocking host
    messages, which the device ring and rhd post (their transports' headers, staged
    blocks) and the device shm does not (its barriers and set-up are the backend's own
    collectives): over NCCL ``auto`` is the library's or the device shm."""
    base, suffix = split(algorithm)
    if base != "auto":
        return algorithm, "asked"
    shared = one_device if on_device else one_node
    choice = tuning.choose(library, collective, nranks, nbytes) if tuning is not None else None
    if choice is not None and not runs_here(collective, choice, on_device, shared):
        choice = None
    if choice is not None and not host_messages and _posts_host_messages(choice):
        choice = None
    by = "tuning" if choice is not None else "rules"
    if choice is None:
        # on device the shm all-reduce runs torch's or CuPy's kernels, not the host pipeline
        pipelined = shared and get_collective(collective).reduces and (
            on_device or shm.pipelines(reducer("sum", "float32", suffix)))
        choice = choose_auto(collective, nbytes, nranks, pipelined, None if on_device else library)
        if not host_messages and _posts_host_messages(choice):
            choice = "library"
    if split(choice)[0] == "library":
        return "library", by
    if KERNEL_SEP in choice:                    # the table measured that kernel
        return choice, by
    return choice + algorithm[len(base):], by


def _posts_host_messages(choice: str) -> bool:
    """Whether ``choice`` hands the backend non-blocking host messages (the device ring's and
    rhd's transports); the library's call and the device shm's barriers do not (pure)."""
    return split(choice)[0] not in ("library", "shm")


def runs_here(collective: str, choice: str, on_device: bool, shared: bool) -> bool:
    """Whether a tuning table's ``choice`` can run on these buffers (pure): the shared-memory
    all-reduces with every rank on one node (on device: one GPU), and on device buffers an
    algorithm that runs there with a device kernel (a table measured on host buffers may
    name ``ring+c``, one measured on one node ``shm``)."""
    base, kernel_name = split(choice)
    if base == "library":
        return True
    if base in ONE_NODE and not shared:
        return False
    if on_device:
        return base in device.algorithms_for(collective) and kernel_name in ("auto", *DEVICE_KERNELS) \
            and piece(choice) is None
    return kernel_name in ("auto", *HOST_KERNELS)


def bind(comm, collective: str, algorithm: str, sendbuf, recvbuf, op: Optional[ReduceOp],
         root: int, *, kind_cache: bool = True, transport: str = "auto") -> Callable[[], None]:
    """``collective`` by ``algorithm`` (not ``library`` or ``auto``) bound to these buffers.

    Collective: every rank binds, and the arguments are checked on every rank and agreed
    (:func:`ddlcomm.comm.agree.agreed`): where one rank's are refused (a receive buffer
    of its own), every rank raises, none left waiting in the set-up or the first call.
    Torch tensors (device buffers) go to :mod:`ddlcomm.comm.device` (``kind_cache``:
    the buffer-kind cache or the driver asked every call; ``transport``: auto, ipc or
    staged); the bound call's ``facts()`` then says what ran."""
    check(collective, algorithm)
    base, suffix = split(algorithm)
    if base in ("library", "auto"):
        raise UsageError(f"bind needs a concrete algorithm, not {base}", "decide() it first")
    if not isinstance(sendbuf, np.ndarray):               # tensors: ddlcomm.comm.device
        return device.bind(comm, collective, base, sendbuf, recvbuf, op, root, kernel=suffix,
                           kind_cache=kind_cache, transport=transport)
    make, why = attempt(_on_host, comm, collective, algorithm, sendbuf, recvbuf, op, root)
    # the shm engines size and step by each rank's own message
    agreed_alike(comm, why, f"{collective} by {base}",
                 (sendbuf.size, sendbuf.dtype.name, getattr(op, "name", None)),
                 "one count, dtype and op", "bind the same message on every rank")
    return make()


def _on_host(comm, collective: str, algorithm: str, sendbuf: np.ndarray, recvbuf, op: Optional[ReduceOp],
             root: int) -> Callable[[], Callable[[], None]]:
    """This rank's part of :func:`bind` on host arrays, checked: what makes the bound call
    (the shared-memory all-reduces' set-up is collective: it runs once every rank's checks
    are agreed)."""
    base = split(algorithm)[0]
    reduce = kernel(algorithm, op, sendbuf.dtype)
    pieces = piece(algorithm)
    if (collective, base) in SHARED_MEMORY:
        # checked as the point-to-point algorithms check theirs: a receive buffer of another
        # dtype was written with raw bytes, a transposed one left unwritten, a 2-D one refused
        # by NumPy's copy
        send = check_buf(comm, sendbuf, f"{collective}'s send buffer")
        op = check_op(comm, op, send)             # e.g. avg of integers, as the native ones refuse
        recv = check_recv(comm, sendbuf, recvbuf, sendbuf.size, f"{collective}'s receive buffer", True)
        recv = send if recvbuf is sendbuf else flat(recv)
        more = {} if pieces is None else {"chunk_bytes": pieces}
        return lambda: load(SHARED_MEMORY[collective, base])(comm, send, recv, op, reduce=reduce, **more)
    coll = get_collective(collective)
    kwargs = {"reduce": reduce} if coll.reduces else {}
    if collective in PIPELINED:
        kwargs["chunk_bytes"] = PIPELINE_BYTES if pieces is None else pieces
    entry = native.get(collective, base)
    args = coll.call_args(sendbuf, recvbuf, op, root)
    if hasattr(entry, "bound"):                 # checked here once, not on every call
        call = entry.bound(comm, *args, **kwargs)
        return lambda: call
    return lambda: functools.partial(entry, comm, *args, **kwargs)
