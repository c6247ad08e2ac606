"""The ``ddlcomm`` command: one module per sub-command, each parsing its options
and handing over to the pieces.

Every error a user can cause ends with one line on stderr and a non-zero exit:
2 for bad input, 1 when a result failed its check, 3 when a rank failed, 130
when interrupted.  A command module has ``add_parser(sub)`` and
``run(args, argv) -> int``; :data:`COMMANDS` names them.  Every command's parser is
built at each start, so ``bench`` and ``train`` import their sessions (the
collectives, the reports, the launch) inside ``run``: a refused ``ddlcomm bench``
took 0.61 s with them at the top, 0.37 s without (docs/benchmarks.md, "Start-up").
"""
from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import Optional, Sequence

from .. import __version__
from ..errors import DdlcommError, EveryRankError, UsageError
from ..launch.env import detect
from ..launch.mpirun import mark_started
from . import bench, info, kernels, model, report, reproduce, results, train
from .common import _Parser

#: sub-command -> its module (``add_parser``, ``run``), in the order ``--help`` lists them
COMMANDS: dict[str, ModuleType] = {
    "bench": bench, "results": results, "reproduce": reproduce, "kernels": kernels,
    "report": report, "model": model, "train": train, "info": info,
}

__all__ = ["COMMANDS", "build_parser", "main", "_Parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ddlcomm", description=(
        "Measure, model and speed up the communication of distributed deep learning. "
        "Run `ddlcomm bench` for the default suite (broadcast, gather, allreduce; "
        "4B..64MiB; buffer and object form; 2 ranks)."))
    parser.add_argument("--version", action="version", version=f"ddlcomm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def command_of(args: argparse.Namespace) -> str:
    """The command line's command as typed, with its action where it has one
    (``ddlcomm model calibrate``)."""
    action = getattr(args, f"{args.command}_command", None)
    return " ".join(["ddlcomm", args.command, *([action] if action else [])])


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mark_started()          # in a rank that ddlcomm's launcher started: the rank ran
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}", f"see {command_of(args)} --help")
        return COMMANDS[args.command].run(args, argv)
    except DdlcommError as exc:
        launched = detect()
        if not isinstance(exc, EveryRankError) or launched is None or launched.rank == 0:
            print(f"ddlcomm: error: {exc}", file=sys.stderr)     # (every rank found it: rank 0 says it)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ddlcomm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:      # a file the checks let through (root passes every access check)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"ddlcomm: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
