"""ddlcomm: measure, model and speed up the communication of distributed deep learning.

``import ddlcomm`` needs only NumPy; backends load their libraries when asked.

>>> import ddlcomm, numpy as np
>>> comm = ddlcomm.init("mpi")          # inside ranks started by mpirun
>>> comm.allreduce(np.ones(4, np.float32), op="sum")
"""
from __future__ import annotations

__version__ = "0.1.0"

from .comm import Communicator
from .comm.registry import create
from .dtypes import DTYPES, OPS, ReduceOp, get_dtype, get_op
from .errors import BackendUnavailable, DdlcommError
from .launch.env import detect


def init(backend: str = "mpi", **kwargs) -> Communicator:
    """Start ``backend`` in this rank (rank/size come from the launcher)."""
    info = detect()
    if info is not None and "local_rank" not in kwargs:
        kwargs["local_rank"] = info.local_rank
    comm = create(backend, **kwargs)
    if info is not None and info.launcher == "torchrun" and comm.size != info.size:
        comm.close()                  # MPI started alone in each of torchrun's processes
        raise BackendUnavailable(f"torchrun started {info.size} processes, but backend "
                                 f"{backend} sees {comm.size} rank(s) of its own in each",
                                 "start MPI ranks with mpirun, mpiexec or srun, or use "
                                 "backend gloo under torchrun")
    return comm


__all__ = ["init", "Communicator", "ReduceOp", "DTYPES", "OPS", "get_dtype", "get_op",
           "DdlcommError", "__version__"]
