"""ddlcomm: measure, model and speed up the communication of distributed deep learning.

``import ddlcomm`` needs only NumPy; backends load their libraries when asked.

>>> import ddlcomm, numpy as np
>>> comm = ddlcomm.init("mpi")          # inside ranks started by mpirun
>>> comm.allreduce(np.ones(4, np.float32), op="sum")
"""
from __future__ import annotations

__version__ = "0.1.0"

from .comm import Communicator
from .comm.registry import join
from .dtypes import DTYPES, OPS, ReduceOp, get_dtype, get_op
from .errors import DdlcommError
from .launch.env import detect


def init(backend: str = "mpi", **kwargs) -> Communicator:
    """Start ``backend`` in this rank (rank/size come from the launcher)."""
    return join(backend, detect(), **kwargs)


__all__ = ["init", "Communicator", "ReduceOp", "DTYPES", "OPS", "get_dtype", "get_op",
           "DdlcommError", "__version__"]
