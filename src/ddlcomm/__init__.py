"""ddlcomm: measure, model and speed up the communication of distributed deep learning.

``import ddlcomm`` loads nothing until used (then NumPy); backends load their libraries when asked.

>>> import ddlcomm, numpy as np
>>> comm = ddlcomm.init("mpi")          # inside ranks started by mpirun
>>> comm.allreduce(np.ones(4, np.float32), op="sum")
"""
from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from .lazy import load

if TYPE_CHECKING:
    from .comm import Communicator

#: What ``import ddlcomm`` offers, loaded on first use (PEP 562): importing the package
#: loads next to nothing, so the command's entry (``ddlcomm.entry``) can catch a Ctrl-C
#: while NumPy and the rest load.
_LAZY = {name: f"ddlcomm.{module}:{name}" for module, names in (
    ("comm", ("Communicator",)), ("dtypes", ("ReduceOp", "DTYPES", "OPS", "get_dtype", "get_op")),
    ("errors", ("DdlcommError",))) for name in names}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ddlcomm' has no attribute {name!r}")
    globals()[name] = value = load(_LAZY[name])
    return value


def init(backend: str = "mpi", **kwargs) -> "Communicator":
    """Start ``backend`` in this rank (rank/size come from the launcher)."""
    from .comm.registry import join     # lazy: see _LAZY
    from .launch.env import detect
    return join(backend, detect(), **kwargs)


__all__ = ["init", "Communicator", "ReduceOp", "DTYPES", "OPS", "get_dtype", "get_op",
           "DdlcommError", "__version__"]
