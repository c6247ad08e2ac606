"""A test plugin backend (loaded through DDLCOMM_PLUGINS): MPI with an injected fault.

``DDLCOMM_FAULT=raise|hang|die|wrong``, ``DDLCOMM_FAULT_RANK`` (default 1) and
``DDLCOMM_FAULT_BYTES`` (default 16384): the chosen rank fails in allreduce
once the message reaches that many bytes (``wrong``: its result is off by one, so the
point fails its check and the rank goes on).
"""
from __future__ import annotations

import os
import time

from ddlcomm.comm.mpi import MPICommunicator
from ddlcomm.comm.registry import BackendSpec, register


class FaultyCommunicator(MPICommunicator):
    name = "faulty"

    def _bind(self, coll, sendbuf, recvbuf, op, root):
        call = super()._bind(coll, sendbuf, recvbuf, op, root)
        if (coll.name != "allreduce" or self.rank != int(os.environ.get("DDLCOMM_FAULT_RANK", "1"))
                or sendbuf.nbytes < int(os.environ.get("DDLCOMM_FAULT_BYTES", "16384"))):
            return call
        fault = os.environ.get("DDLCOMM_FAULT", "raise")

        def faulty():
            if fault == "wrong":
                call()
                recvbuf[...] += 1
                return
            if fault == "raise":
                raise RuntimeError("injected fault")
            if fault == "hang":
                time.sleep(3600)
            os._exit(9)
        return faulty


register(BackendSpec("faulty", "faulty_backend:FaultyCommunicator", ("mpi4py",),
                     "tests/mpi must be on PYTHONPATH", ("mpirun",)))
