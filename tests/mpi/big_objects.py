"""Objects above 2 GiB through the object form (chunked under the 2**31 count limit).

Rank 0 broadcasts a 2.1 GiB array and sends another to rank 1; both compare.
"""
import sys

import numpy as np

import ddlcomm
from suite_kit import guarded

NBYTES = (1 << 31) + (100 << 20)     # 2 GiB + 100 MiB


def main() -> int:
    comm = ddlcomm.init("mpi")
    return guarded(comm, lambda: run_suite(comm))


def run_suite(comm) -> int:
    marker = np.arange(4096, dtype=np.uint8)
    if comm.rank == 0:
        big = np.empty(NBYTES, np.uint8)
        big[:4096] = marker
        big[-4096:] = marker[::-1]
    else:
        big = None
    got = comm.broadcast_object(big, 0)
    ok = got.size == NBYTES and np.array_equal(got[:4096], marker) and np.array_equal(got[-4096:], marker[::-1])
    del got
    if comm.rank == 0:
        comm.send_object(big, 1)
    elif comm.rank == 1:
        got = comm.recv_object(0)
        ok = ok and got.size == NBYTES and np.array_equal(got[-4096:], marker[::-1])
        del got
    everyone = comm.allgather_object(bool(ok))
    if comm.rank == 0:
        print(f"{comm.library}: >2GiB objects {'ok' if all(everyone) else 'FAILED'}")
    return 0 if all(everyone) else 1


if __name__ == "__main__":
    sys.exit(main())
