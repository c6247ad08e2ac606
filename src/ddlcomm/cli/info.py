"""``ddlcomm info``: what a user must know about this machine before measuring."""
from __future__ import annotations

import argparse
import json

from ..machine import facts, membw, probe
from ..report.machine import render_info
from ..units import parse_positive_int

FIELDS = """\
--json fields (sizes in bytes; a thing that is missing says available: false and its reason):
  host, facts_version, probe_s (seconds the probes took), gpu_verdict (the last line of the text)
  cpus      model, logical (CPUs), physical_cores (under the online CPUs), affinity and usable
            (this process's CPUs), usable_cores (the physical cores under them), last_level_cache_bytes,
            numa: [{node, cpus, memory_bytes, memory_allowed}]
  memory    total_bytes, available_bytes, thp {enabled, defrag, shmem_enabled}, hugetlb {page_bytes,
            total, free, pools: [{page_bytes, total, free}]}, shm {path, size_bytes, free_bytes, huge:
            the tmpfs's huge= mode, never where small pages only (shared, shm, shm-map live there)},
            page_scan {available | reason}: whether points can record which pages of NumPy's
            arrays are huge (the kernel's PAGEMAP_SCAN),
            copy_bandwidth (with --memory-bandwidth): {by_copiers: {k: bytes/s copied by k
            processes at once, together}, bytes_per_copier, reps, rounds, cpus, seconds}
  mpi       the MPI of this environment (mpi4py's library, asked in a child process that
            initialises MPI alone): library, version, library_version, mpi4py, libmpi,
            launcher {path, family}, cuda_aware (true, false or "unknown"), evidence: [what was
            run and what it said: MPIX_Query_cuda_support() through ctypes after MPI_Init;
            ompi_info, or mpichversion and mpivars]
  gpus      torch, cuda (torch's CUDA build), cuda_available, nccl {version, source | reason},
            cupy {name, version} | null, driver, devices: [{index, name, memory_bytes, bus_id}],
            count, reason (when none), nvidia_smi, mps {running, pipe_dir, control}, torch_probe (how
            torch was asked);
            with --ranks: ranks, ranks_per_gpu (local rank r uses GPU r % count), shared
  features  namespaces, memkind (hbw), slurm {tools, version, job}, cma {ptrace_scope, ptracer_any,
            kcmp, process_vm_readv: "ok" or the errno}: each available or reason
Each section that failed is {"error": "..."}.  Every stored run keeps these facts (its `machine`)."""


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="what this machine has: CPUs, memory, MPI (CUDA-aware?), GPUs",
                       description="Report what a user must know before measuring, from real queries: "
                                   "CPUs, NUMA nodes, transparent and hugetlb huge pages; the MPI of "
                                   "this environment, its version, and whether it is CUDA-aware with "
                                   "the evidence; torch, CUDA, NCCL and CuPy; the GPUs and how many "
                                   "ranks would share each; namespaces, memkind, Slurm, and whether "
                                   "processes can copy from each other's memory (CMA).",
                       epilog=FIELDS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", metavar="N", help="local ranks to place on the GPUs (rank r on GPU r %% "
                                                "GPUs): how many share each GPU")
    p.add_argument("--json", action="store_true", help="print the facts as JSON (fields below)")
    p.add_argument("--memory-bandwidth", action="store_true",
                   help="also measure the copy bandwidth of 1, 2, 3, 4, 6, 8, ... processes copying "
                        "at once, one per CPU (a few seconds; run it on a quiet machine): what the "
                        "ranks of one node share, and what `ddlcomm model calibrate --machine` prices "
                        "concurrent copies with")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    ranks = None if args.ranks is None else parse_positive_int(args.ranks, "--ranks")
    found = facts(ranks)
    if args.memory_bandwidth:           # after the other probes, alone on the machine
        found["memory"]["copy_bandwidth"] = probe.guarded(membw.copy_bandwidth)
    print(json.dumps(found, indent=2) if args.json else render_info(found))
    return 0
