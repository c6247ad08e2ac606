"""Build of ddlcomm's three C extensions (everything else is in pyproject.toml).

``ddlcomm.kernels._reduce`` is one C file plus two headers. It is compiled
for the baseline of the target platform: the SIMD loops carry their own
``target`` attributes and are chosen at import from what the CPU supports, so
one build runs everywhere. It is optional: where no C compiler is found the
install still succeeds, and ddlcomm reduces with NumPy (``ddlcomm.kernels.available()``
says why the C kernel is missing).  ``ddlcomm.comm._shmpipe`` is the pipelined
shared-memory all-reduce's inner loop, equally optional: without it (or without
the C kernel) ``--algorithm shm`` runs its Python form.  ``ddlcomm.comm._shmmap``, the
mapped all-reduce's (``--algorithm shm-map``), shares _shmpipe's counters
(``_shmsync.h``); without it shm-map is refused.
"""
import sys

from setuptools import Extension, setup

KERNELS = "src/ddlcomm/kernels"
# -O3 for the vectoriser; never -ffast-math (NaN and signed-zero rules matter here).
CFLAGS = [] if sys.platform == "win32" else ["-O3", "-std=c11", "-fno-strict-aliasing"]

setup(ext_modules=[
    Extension(
        "ddlcomm.kernels._reduce",
        sources=[f"{KERNELS}/_reduce.c"],
        depends=[f"{KERNELS}/loops_portable.h", f"{KERNELS}/loops_x86.h"],
        extra_compile_args=CFLAGS,
        optional=True,
    ),
    # The shm all-reduces' inner loops, pipelined and mapped: both call _reduce's loops
    # through a capsule and meet on the counters of _shmsync.h.
    *(Extension(
        f"ddlcomm.comm.{engine}",
        sources=[f"src/ddlcomm/comm/{engine}.c"],
        depends=["src/ddlcomm/comm/_shmsync.h"],
        extra_compile_args=CFLAGS,
        optional=True,
    ) for engine in ("_shmpipe", "_shmmap")),
])
