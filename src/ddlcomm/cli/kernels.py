"""``ddlcomm kernels``: time the reduction kernels against NumPy's float32 ufunc of the op."""
from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from ..dtypes import get_dtype
from ..kernels import KERNELS, available, op_name
from ..bench.plan import mem_available
from ..kernels.bench import check_request, measure
from ..report.tables import render_kernels
from ..units import format_size, parse_list, parse_positive_int, parse_size


def add_parser(sub) -> None:
    k = sub.add_parser("kernels", help="time the reduction kernels against NumPy's ufunc",
                       description="Reduce two buffers in place with each kernel (NumPy's ufunc, "
                                   "ddlcomm's compiled C kernel) and dtype, rounds interleaved; "
                                   "print the median time, the bandwidth (buffer bytes per "
                                   "second) and its ratio to NumPy's float32 ufunc of the op "
                                   "(np.add(a, b, out=a) for sum) measured in the same rounds.")
    k.add_argument("--dtype", default="float32,float16,bfloat16", help="comma list of dtypes "
                   "(default: float32,float16,bfloat16)")
    k.add_argument("--size", default="256MiB", help="bytes per buffer (default 256MiB)")
    k.add_argument("--op", default="sum", help="sum, prod, min, max (default: sum)")
    k.add_argument("--rounds", default="7", help="timed passes of each kernel, after an untimed "
                   "one (default 7)")
    k.add_argument("--json", action="store_true", help="print JSON records instead of a table")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    rounds = parse_positive_int(args.rounds, "--rounds", 1, 10_000)
    op_name(args.op)
    nbytes = parse_size(args.size, "--size")
    # the dtypes last: checking bfloat16's (a default) loads ml_dtypes, 0.9 s here
    dtypes = [get_dtype(name).name for name in parse_list(args.dtype, "--dtype")]
    check_request(dtypes, nbytes, mem_available())
    kernels = [k for k in KERNELS if not available()[k].startswith("missing")]
    with tqdm(total=rounds * (len(dtypes) * len(kernels) + 1), unit="pass", file=sys.stderr,
              desc=f"kernels {format_size(nbytes)}", leave=False) as bar:
        rows = measure(dtypes, nbytes, kernels, rounds, args.op, progress=bar)
    print(json.dumps(rows, indent=2) if args.json else render_kernels(rows, available()))
    return 0
