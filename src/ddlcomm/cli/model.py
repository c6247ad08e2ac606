"""``ddlcomm model calibrate|predict|ssgd|report|tune``: parse, check, delegate.

The model itself (``model/``) is pure: this module reads the stored points and
the option files, and ``report/model.py`` renders what the model computes.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Callable, Optional

from ..comm import tuning
from ..dtypes import get_dtype
from ..errors import UsageError
from ..machine.cpus import last_level_cache
from ..model import ssgd
from ..model.calibrate import (METRICS, POINT_FIELDS, calibrate, load, parse_holdout, select_points,
                               with_cores)
from ..model.costs import Params
from ..model.node import bandwidth_of
from ..model.predict import caveats, check_request, comm_from_fit, predict, priced_by
from ..model.ssgd import Phases, model_layers
from ..outputs import writable_dir, write_text
from ..report import model as view
from ..results import Store, default_db_path
from ..results.export import point_record
from ..units import parse_positive_int, parse_size, parse_sizes, shell_join
from .common import _Parser, db_flag, existing, out_file

#: Largest rank or worker count accepted (the formulas are O(log p); this bounds typos).
MAX_RANKS = 1 << 40


# ------------------------------------------------------------------ parsing
#: What parse_counts reads, as --ranks and --workers say it.
COUNTS_HELP = ("4096; a list 2,4,8; LO:HI[xF]: LO times powers of F (default 2) up to HI "
               "(2:1000 ends at 512); or A,B,...,Z: the last step continued, and Z itself "
               "(1,2,4,...,1000 ends 512,1000; 2,4,6,...,12 adds 2); with two values before ..., "
               "B a multiple of A multiplies (2,4,...,16 is 2,4,8,16)")


def parse_counts(text: str, flag: str) -> list[int]:
    """Rank/worker counts: ``4096``, ``1,2,4``, ``2:1024`` (powers of 2; ``x4`` for
    another factor), or ``1,2,4,...,1024`` (the last step's ratio continued)."""
    text = (text or "").strip()
    if not text:
        raise UsageError(f"{flag} is empty", "e.g. 4096, 2,4,8, 2:1024 or 1,2,4,...,1024")
    factor = 2
    if ":" in text:
        body, x, f = text.partition("x")
        if x:
            factor = parse_positive_int(f, f"{flag} growth factor", 2)
        lo_t, _, hi_t = body.partition(":")
        lo, hi = parse_positive_int(lo_t, flag), parse_positive_int(hi_t, flag)
        if hi < lo:
            raise UsageError(f"{flag} {text!r} ends below its start")
        _check_max(hi, flag)
        out, v = [], lo
        while v <= hi:
            out.append(v)
            v *= factor
        return out
    parts = [p.strip() for p in text.split(",")]
    if "..." in parts:
        i = parts.index("...")
        if i < 2 or i != len(parts) - 2 or parts.count("...") != 1:
            raise UsageError(f"{flag} {text!r}: write A,B,...,Z (two values before ..., one after)")
        a, b = parse_positive_int(parts[i - 2], flag), parse_positive_int(parts[i - 1], flag)
        z = parse_positive_int(parts[-1], flag)
        _check_max(z, flag)
        head = [parse_positive_int(p, flag) for p in parts[:i]]
        before = head[-3] if i >= 3 else None     # three values tell a sum from a product
        if b <= a or before is not None and a <= before:
            raise UsageError(f"{flag} {text!r}: the values before ... must grow")
        if (b % a == 0 and before is None) or (before is not None and a * a == before * b and b % a == 0):
            step = lambda v: v * (b // a)          # noqa: E731 - geometric
        elif before is None or b - a == a - before:
            step = lambda v: v + (b - a)           # noqa: E731 - arithmetic
        else:
            raise UsageError(f"{flag} {text!r}: the values before ... neither add nor multiply "
                             "by one step", "e.g. 1,2,4,...,64 or 2,4,6,...,12")
        out, v = head, step(b)
        while v <= z:
            out.append(v)
            v = step(v)
        if out[-1] != z:
            out.append(z)
        return sorted(set(out))
    out = [parse_positive_int(p, flag) for p in parts if p]
    for v in out:
        _check_max(v, flag)
    return sorted(set(out))


def _check_max(value: int, flag: str) -> None:
    if value > MAX_RANKS:
        raise UsageError(f"{flag} {value} is above the largest count modelled ({MAX_RANKS})")


def parse_bytes_list(text: str, flag: str = "--bytes") -> list[int]:
    """Sizes: ``1GiB``, ``1KiB,1MiB`` or a sweep ``4B:64MiB[xF]`` (see units)."""
    if not text or not text.strip():
        raise UsageError(f"{flag} is empty", "e.g. 1GiB, 64KiB,1MiB or 4B:64MiB")
    return parse_sizes(text, "the model prices the bytes a call moves: give sizes from 1B", flag)


def parse_number(text: Optional[str], flag: str, *, positive: bool = False) -> Optional[float]:
    """A float >= 0 (> 0 with ``positive``), or None when not given."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise UsageError(f"{flag} must be a number {'>' if positive else '>='} 0, got {text!r}")
    return value


# ------------------------------------------------------------------ parsers
def add_parser(sub) -> None:
    """Add ``model`` and its actions to the sub-parsers ``sub`` of ddlcomm's parser."""
    m = sub.add_parser("model",
                       help="cost models: calibrate, predict, ssgd (the S-SGD model), report, tune",
                       description=(
                           "Performance models: α-β-γ costs of collectives fitted to stored "
                           "points (calibrate), predicted for any size and rank count "
                           "(predict), Shi and Chu's S-SGD iteration model (ssgd), a "
                           "report page (report), and the table of what was fastest here for "
                           "`bench --algorithm auto --tuning` (tune)."))
    msub = m.add_subparsers(dest="model_command", metavar="ACTION", parser_class=_Parser)
    for add in (_add_calibrate, _add_predict, _add_ssgd, _add_report, _add_tune):
        add(msub)


#: The options that pick parameter sets (predict, ssgd) or points (calibrate), alike everywhere.
SELECTION = ("backend", "library", "placement", "form")


def _add_selection(p: argparse.ArgumentParser, what: str, library_too: str = "") -> None:
    """--backend/--library/--placement/--form: which ``what`` (points, or a fit's sets);
    ``library_too``: what else --library says."""
    p.add_argument("--backend", help=f"only {what} of this backend (mpi, gloo)")
    p.add_argument("--library", help=f"only {what} of this library (Open MPI, MPICH, gloo)"
                                     + (f"; {library_too}" if library_too else ""))
    p.add_argument("--placement", help=f"only {what} of this placement (host, containers=2, ...)")
    p.add_argument("--form", help=f"only {what} of this form (buffer, object)")


def _add_points(p: argparse.ArgumentParser) -> None:
    """Which stored points a command reads (calibrate, tune): databases, runs, the selection,
    dtype and collectives."""
    p.add_argument("--db", action="append", metavar="PATH",
                   help="results database (repeat for several; default: the default database)")
    p.add_argument("--run", help="only these run ids (comma list; with several --db: in each)")
    _add_selection(p, "the points")
    p.add_argument("--dtype", help="only the points of this dtype (needed where the points "
                                   "have several: float16 and float32 reduce at their own speed)")
    p.add_argument("--collective", help="only these collectives (comma list)")


def _selection(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in SELECTION}


def _add_calibrate(msub) -> None:
    """``model calibrate``'s options."""
    c = msub.add_parser("calibrate", help="fit α, β, γ to stored points, with residuals")
    _add_points(c)
    c.add_argument("--holdout", action="append", metavar="SPEC",
                   help="leave points out of the fit and report the error on them: ranks=4, "
                        "ranks=4:64, bytes=1MiB:64MiB, bytes=64KiB,1MiB, run=7 (repeatable)")
    c.add_argument("--split", metavar="SIZES",
                   help="start a new parameter set at these sizes (comma list, e.g. 64KiB): "
                        "libraries switch protocols by size")
    c.add_argument("--shared", action="store_true",
                   help="one parameter set for all collectives (default: one per collective)")
    c.add_argument("--metric", default="p50", choices=["p50", "avg", "min", "max"],
                   help="which stored time to fit (default p50: the slowest rank's median "
                        "call, the critical path the model prices; avg: the mean over ranks)")
    c.add_argument("--combine", default="min", choices=["min", "median", "none"],
                   help="a point measured in several runs counts once, by its fastest "
                        "(default min: interference only adds time) or median measurement, "
                        "or once per run (none)")
    c.add_argument("--cache", metavar="SIZE",
                   help="last-level cache of the machine the points ran on, from which the "
                        "cache of the term of copies that spill out of it is fitted (default: "
                        "this machine's, from sysfs; 0: no such term)")
    c.add_argument("--machine", metavar="INFO.json",
                   help="the machine the points ran on, as `ddlcomm info --json --memory-bandwidth` "
                        "wrote it there: its last-level cache (unless --cache) and its copy "
                        "bandwidth by concurrent copies, for the term of copies that share the "
                        "memory (default: no such term)")
    c.add_argument("--summary-bytes", default="64KiB", metavar="SIZE",
                   help="also summarise errors from this size up (default 64KiB)")
    c.add_argument("--out", metavar="FIT.json", help="write the fit here")
    c.add_argument("--residuals", action="store_true", help="print every point's residual")
    c.add_argument("--json", action="store_true", help="print the fit as JSON")


def _add_tune(msub) -> None:
    """``model tune``'s options."""
    t = msub.add_parser("tune", help="what was fastest here, per size: a table for "
                                     "`bench --algorithm auto --tuning FILE`",
                        description=(
                            "From runs that measured several algorithms side by side "
                            "(`ddlcomm bench --algorithm library,ring,rhd,shm`), the fastest "
                            "at each size (each by its fastest run's --metric), per library, "
                            "collective and rank count, as bands that `--algorithm auto` "
                            "follows when `bench --tuning FILE` names the table."))
    _add_points(t)
    t.add_argument("--metric", default="p50", choices=["p50", "avg", "min", "max"],
                   help="which stored time ranks the algorithms (default p50: the median "
                        "call, as `results versus` ranks them; avg lets a few slow calls decide)")
    t.add_argument("--out", metavar="TUNING.json", required=True, help="write the table here")
    t.add_argument("--json", action="store_true", help="print the table as JSON")


def _add_predict(msub) -> None:
    """``model predict``'s options."""
    p = msub.add_parser("predict", help="time of a collective at any size and rank count")
    p.add_argument("--fit", metavar="FIT.json", help="a fit from `ddlcomm model calibrate`")
    p.add_argument("--alpha", help="seconds per message (instead of --fit)")
    p.add_argument("--beta", help="seconds per byte (instead of --fit)")
    p.add_argument("--gamma", help="seconds per reduced byte (default 0)")
    p.add_argument("--collective", default="allreduce",
                   help="allreduce, broadcast, gather, reduce, or ps (a PS step: broadcast + "
                        "gather through the server); default allreduce")
    p.add_argument("--algorithm", default="library",
                   help="library (the library's own choice), ring, rhd, binomial, ..., "
                        "hierarchical; for ps: library or BCAST+GATHER")
    p.add_argument("--ranks", required=True, help=COUNTS_HELP)
    p.add_argument("--bytes", required=True, help="per-rank bytes: 1GiB, 1KiB,1MiB or 4B:64MiB[xF]")
    _add_selection(p, "the fit's parameter sets",
                   library_too="also whose default algorithm `library` means")
    p.add_argument("--ranks-per-node", help="ranks sharing a node (oversubscription past its "
                                            "cores; the hierarchical all-reduce's node size)")
    p.add_argument("--cores", help="cores per node (default: the fit's host; none without a fit)")
    p.add_argument("--dtype", default="float32", help="the messages' dtype: MPICH chooses its "
                                                      "all-reduce by element count (default float32)")
    p.add_argument("--inter-alpha", help="hierarchical: inter-node seconds per message")
    p.add_argument("--inter-beta", help="hierarchical: inter-node seconds per byte")
    p.add_argument("--inter-gamma", help="hierarchical: inter-node seconds per reduced byte")
    p.add_argument("--leaders", default="auto", choices=["auto", "ring", "rhd", "library"],
                   help="hierarchical: the leaders' all-reduce: auto (ring from 1 MiB, rhd "
                        "below, as comm/hierarchical.py), ring, rhd, library; default auto")
    p.add_argument("--json", action="store_true", help="print JSON (a list of rows) instead of a table")


def _add_ssgd(msub) -> None:
    """``model ssgd``'s options."""
    s = msub.add_parser("ssgd", help="S-SGD iteration time, speed-up and efficiency (Shi & Chu)")
    for name, what in (("io", "read a batch"), ("h2d", "copy it to the device"),
                       ("f", "forward"), ("b", "backward"), ("u", "update")):
        s.add_argument(f"--t-{name}", required=True, metavar="SECONDS",
                       help=f"seconds per iteration to {what} on one worker")
    s.add_argument("--t-c", metavar="SECONDS",
                   help="seconds per iteration of gradient aggregation (instead of --fit)")
    s.add_argument("--fit", metavar="FIT.json", help="price the aggregation with a calibrated fit")
    s.add_argument("--arch", default="allreduce", choices=["allreduce", "ps"],
                   help="with --fit: all-reduce among the workers, or a parameter server "
                        "(one more rank: broadcast + gather)")
    s.add_argument("--algorithm", default="library",
                   help="with --fit: the all-reduce algorithm (library, ring, rhd, ...) or "
                        "the PS step's (library or BCAST+GATHER)")
    _add_selection(s, "the fit's parameter sets")
    s.add_argument("--model", help="gradient sizes from a model: alexnet, googlenet, resnet50, "
                                   "mobilenet, vgg16 (t_b spread over its layers by parameters)")
    s.add_argument("--layers", metavar="FILE",
                   help="JSON list of [backward seconds, gradient bytes] per layer, backward "
                        "order (their times give the backward pass's shape: scaled to --t-b)")
    s.add_argument("--dtype", help="gradient dtype (default float32): sizes --model's gradients, and "
                                   "with --fit the messages' elements (MPICH chooses its all-reduce "
                                   "by element count)")
    s.add_argument("--fusion", metavar="BYTES", help="fuse gradients into buckets of at most BYTES")
    s.add_argument("--workers", required=True, help=COUNTS_HELP)
    s.add_argument("--workers-per-node",
                   help="the workers (GPUs) of a node: with --io-per-node those one reader "
                        "feeds (default 1); with --fit those whose aggregation shares a node "
                        "(default: as many as the fitted node's cores)")
    s.add_argument("--overlap", default="none", choices=["none", "io", "wfbp", "io+wfbp"],
                   help="none; io (prefetched reading); wfbp (wait-free back-propagation); "
                        "io+wfbp: both (default none)")
    s.add_argument("--io-per-node", action="store_true",
                   help="one reader feeds every worker of a node: reading grows with them")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _add_report(msub) -> None:
    """``model report``'s options."""
    r = msub.add_parser("report", help="a page: measured vs modelled per size, predictions to "
                                      "1024 ranks")
    r.add_argument("--fit", required=True, metavar="FIT.json",
                   help="a fit from `ddlcomm model calibrate`")
    r.add_argument("--out", required=True, metavar="DIR", help="where index.html and PNGs go")
    r.add_argument("--max-ranks", default="1024", help="predict up to this many ranks (default 1024)")
    r.add_argument("--bytes", default="1MiB,64MiB",
                   help="sizes of the predictions to --max-ranks (default 1MiB,64MiB)")


# ------------------------------------------------------------------ handlers
def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The ``model`` command: one of :data:`ACTIONS`."""
    action = getattr(args, "model_command", None)
    if action is None:
        raise UsageError("ddlcomm model: say what to do", "calibrate, predict, ssgd, report or tune")
    return ACTIONS[action](args)


def _db_paths(args) -> list[Path]:
    paths = [Path(p).expanduser().resolve() for p in (args.db or [])] or [default_db_path()]
    return [existing(path, db_flag(args.db)) for path in paths]


def _load_points(args) -> list[dict]:
    runs_wanted = None
    if args.run:
        runs_wanted = {parse_positive_int(r, "--run") for r in args.run.split(",") if r.strip()}
    colls = {c.strip() for c in args.collective.split(",")} if args.collective else None
    points: list[dict] = []
    for path in _db_paths(args):
        with Store(path, readonly=True) as store:
            runs = store.runs()
            recs = [point_record(p) for p in store.points()]
        points.extend(with_cores(recs, runs, str(path)))
    asked = {"runs": runs_wanted, "collectives": colls, "dtype": args.dtype, **_selection(args)}
    _refuse_what_matches_nothing(points, asked)
    points = select_points(points, **asked)
    if not points:
        raise UsageError("no stored points match all of these filters at once",
                         "check --db, --run, --backend, --library, --placement, --form, "
                         "--dtype and --collective")
    dtypes = sorted({str(p["dtype"]) for p in points if p.get("dtype")})
    if len(dtypes) > 1:             # the fit and the table price bytes, whatever they hold
        raise UsageError(f"the points are of several dtypes ({', '.join(dtypes)}), whose "
                         "reductions cost differently per byte", "choose one with --dtype")
    return points


#: select_points' filters -> the option that sets each
OPTIONS = {"runs": "--run", "collectives": "--collective", "dtype": "--dtype", "backend": "--backend",
           "library": "--library", "placement": "--placement", "form": "--form"}


def _refuse_what_matches_nothing(points: list[dict], asked: dict) -> None:
    """One line for a filter that no stored point matches on its own, with the values the
    points hold (a misspelt --backend said as such, not as "no points match")."""
    for name, value in asked.items():
        for one in sorted(value) if isinstance(value, set) else [value] if value else []:
            if select_points(points, **{name: {one} if isinstance(value, set) else one}):
                continue
            option, of = OPTIONS[name], POINT_FIELDS[name]
            held = sorted({of(p) for p in points if of(p) is not None})
            shown = ", ".join(map(str, held[:12])) + (", ..." if len(held) > 12 else "")
            raise UsageError(f"no stored point has {option} {one}",
                             f"the databases hold {shown}" if held else "the databases hold no points")


def cmd_calibrate(args) -> int:
    holdout = [parse_holdout(h) for h in (args.holdout or [])]
    split = [parse_size(s, "--split") for s in args.split.split(",") if s.strip()] if args.split else []
    summary_bytes = parse_size(args.summary_bytes, "--summary-bytes")
    machine = _machine_facts(args.machine) if args.machine else {}
    if args.cache is not None:
        cache = parse_size(args.cache, "--cache")
    elif args.machine:
        cache = (machine.get("cpus") or {}).get("last_level_cache_bytes")
    else:
        cache = last_level_cache()
    bandwidth = bandwidth_of((machine.get("memory") or {}).get("copy_bandwidth"))
    out = out_file(args.out, "--out") if args.out else None
    points = _load_points(args)
    said, ran = (machine.get("cpus") or {}).get("usable"), {p.get("host_cores") for p in points} - {None}
    if said and ran and said not in ran:
        print(f"note: --machine {args.machine} has {said} usable CPUs, the runs recorded "
              f"{', '.join(map(str, sorted(ran)))} cores: is it the machine they ran on? (its "
              "cache and copy bandwidth price the fit)", file=sys.stderr)
    fit = calibrate(points, metric=args.metric, combine=args.combine, shared=args.shared,
                    split=split, holdout=holdout, summary_bytes=summary_bytes, cache=cache,
                    bandwidth=bandwidth, meta={"databases": [str(p) for p in _db_paths(args)],
                          "command": shell_join(["ddlcomm", "model", *sys.argv[2:]])})
    if out is not None:
        fit.save(out)
    if args.json:
        print(json.dumps(fit.to_dict(), indent=1, default=str))
        return 0
    print(view.render_fit(fit, residuals=args.residuals))
    if out is not None:
        print(f"fit: {out}")
    return 0


def _machine_facts(path: str) -> dict:
    """``ddlcomm info --json`` of the machine the points ran on, read from ``path``."""
    try:
        facts = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--machine {path}: cannot read it as JSON ({exc})",
                         "give the file `ddlcomm info --json --memory-bandwidth > FILE` wrote") from None
    if not isinstance(facts, dict) or "cpus" not in facts:
        raise UsageError(f"--machine {path}: not the output of `ddlcomm info --json`",
                         "give the file `ddlcomm info --json --memory-bandwidth > FILE` wrote")
    return facts


def _params_from_args(args, prefix: str = "") -> Optional[Params]:
    flag = f"--{prefix.replace('_', '-')}"
    a = parse_number(getattr(args, f"{prefix}alpha"), f"{flag}alpha")
    b = parse_number(getattr(args, f"{prefix}beta"), f"{flag}beta")
    g = parse_number(getattr(args, f"{prefix}gamma"), f"{flag}gamma")
    if a is None and b is None and g is None:
        return None
    if a is None or b is None:
        raise UsageError(f"give both {flag}alpha and {flag}beta (and optionally {flag}gamma)")
    return Params(a, b, g or 0.0)


def cmd_predict(args) -> int:
    ranks = parse_counts(args.ranks, "--ranks")
    sizes = parse_bytes_list(args.bytes)
    explicit = _params_from_args(args)
    if (args.fit is None) == (explicit is None):
        raise UsageError("give --fit FIT.json or --alpha/--beta[/--gamma], one of them")
    collective = check_request(args.collective, args.algorithm)
    per_node = parse_positive_int(args.ranks_per_node, "--ranks-per-node") \
        if args.ranks_per_node else None
    cores = parse_positive_int(args.cores, "--cores") if args.cores else None
    inter = _params_from_args(args, "inter_")
    if (inter is not None or args.leaders != "auto") and args.algorithm != "hierarchical":
        raise UsageError("--inter-alpha/--inter-beta and --leaders apply to --algorithm hierarchical")
    if inter is not None and explicit is not None and per_node is None and cores is None:
        raise UsageError("--inter-alpha/--inter-beta price the network between nodes: without a "
                         "node's size every rank is priced on one node and they are unused",
                         "give the node's size: --ranks-per-node N or --cores N")
    ignored = [f"--{k}" for k in ("backend", "placement", "form") if getattr(args, k)]
    if explicit is not None and ignored:
        raise UsageError(f"with --alpha/--beta there are no fitted parameter sets for "
                         f"{', '.join(ignored)} to pick from", "leave them out, or give --fit")
    fit = load(args.fit) if args.fit else None
    rows = predict(collective, args.algorithm, ranks, sizes, fit=fit, params=explicit,
                   want=_selection(args), ranks_per_node=per_node, cores=cores, inter=inter,
                   leaders=args.leaders, itemsize=get_dtype(args.dtype).itemsize)
    for note in (caveats(fit, collective, args.algorithm, sizes, _selection(args)) if fit else ()):
        print(f"note: {note}", file=sys.stderr)
    node = cores or (max((priced_by(fit, collective, args.algorithm, n, _selection(args)).cores or 0
                          for n in sizes), default=0) if fit else 0)   # the sets that priced the rows
    if per_node is None and node and max(ranks) > node and inter is None:
        print(f"note: ranks past {node} (the cores of a node) are priced as several nodes of "
              f"{node} ranks, each message as the fitted node's own transport moved it (no network is "
              "modelled, nor Open MPI's coll/han across nodes: --algorithm hierarchical with "
              "--inter-alpha/--inter-beta prices a network); --ranks-per-node N prices N ranks "
              "sharing one node", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(view.render_predictions(rows))
    return 0


def _phases(args) -> tuple[Phases, Optional[int]]:
    t = {k: parse_number(getattr(args, f"t_{k}"), f"--t-{k.replace('_', '-')}")
         for k in ("io", "h2d", "f", "b", "u")}
    if args.model and args.layers:
        raise UsageError("give --model or --layers, not both")
    layers: tuple = ()
    if args.dtype is not None and not (args.model or args.fit):
        raise UsageError("--dtype sizes --model's gradients, or --fit's messages' elements",
                         "--layers with --t-c gives bytes and times: drop --dtype")
    if args.model:
        layers = model_layers(args.model, t["b"], get_dtype(args.dtype or "float32").itemsize)
    elif args.layers:
        layers = _read_layers(args.layers)
    fusion = parse_size(args.fusion, "--fusion") if args.fusion is not None else None
    return Phases(t["io"], t["h2d"], t["f"], t["b"], t["u"], layers), fusion


def _read_layers(path: str) -> tuple:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"no layers file at {path}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read layers file {path}: {exc}") from None
    if not isinstance(data, list) or not all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(v, (int, float)) for v in x)
            for x in data):
        raise UsageError(f"{path} must be a JSON list of [backward seconds, gradient bytes] "
                         "number pairs")
    return tuple((float(s), int(b)) for s, b in data)


def cmd_ssgd(args) -> int:
    phases, fusion = _phases(args)
    workers = parse_counts(args.workers, "--workers")
    per_node = None if args.workers_per_node is None else \
        parse_positive_int(args.workers_per_node, "--workers-per-node")
    if per_node is not None and not args.io_per_node and args.fit is None:
        raise UsageError("--workers-per-node applies with --io-per-node (the workers one reader "
                         "feeds) or --fit (the workers whose aggregation shares a node); --t-c "
                         "gives the aggregation whole")
    if "wfbp" in args.overlap and not phases.layers:
        raise UsageError(f"--overlap {args.overlap} needs each layer's gradients",
                         "give --model or --layers")
    t_c = parse_number(args.t_c, "--t-c")
    if (t_c is None) == (args.fit is None):
        raise UsageError("give --t-c SECONDS or --fit FIT.json (with --arch), one of them")
    comm_at: Optional[Callable[[int], Callable[[int], float]]] = None
    if args.fit is not None:
        if not phases.layers:
            raise UsageError("--fit prices each message: give --model or --layers")
        comm_at = comm_from_fit(load(args.fit), args.arch, args.algorithm, _selection(args), per_node,
                                get_dtype(args.dtype or "float32").itemsize)
    elif args.arch != "allreduce" or args.algorithm != "library":
        raise UsageError("--arch and --algorithm apply with --fit")
    elif any(getattr(args, k) for k in SELECTION):
        raise UsageError(f"{', '.join(f'--{k}' for k in SELECTION if getattr(args, k))} pick a fit's "
                         "parameter set; --t-c gives the aggregation whole", "leave them out, or give --fit")
    elif fusion is not None and "wfbp" not in args.overlap:
        raise UsageError("--fusion with --t-c changes nothing without --overlap wfbp (the "
                         "aggregation's time is given whole)", "add --overlap wfbp, or give --fit")
    preds = ssgd.sweep(phases, workers, t_c=t_c, comm_at=comm_at, overlap=args.overlap,
                       workers_per_node=per_node or 1, io_per_node=args.io_per_node,
                       fusion_bytes=fusion)
    if args.json:
        print(json.dumps([p.to_dict() for p in preds], indent=1))
    else:
        print(view.render_ssgd(preds, phases, args.overlap))
    return 0


def cmd_report(args) -> int:
    out = writable_dir(Path(args.out).expanduser().resolve(), "--out")
    max_ranks = parse_positive_int(args.max_ranks, "--max-ranks", 2)
    sizes = parse_bytes_list(args.bytes)
    fit = load(args.fit)
    page = view.write_model_report(fit, out, max_ranks, sizes)
    print(f"report: {page}")
    return 0


def cmd_tune(args) -> int:
    out = out_file(args.out, "--out")
    table = tuning.build(_load_points(args), metric=METRICS[args.metric], source={
        "databases": [str(p) for p in _db_paths(args)],
        "command": shell_join(["ddlcomm", "model", *sys.argv[2:]])})
    write_text(out, json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1) if args.json else view.render_tuning(table))
    print(f"tuning table: {out} (use: ddlcomm bench --algorithm auto --tuning {out})",
          file=sys.stderr)
    return 0


#: action -> its handler
ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "calibrate": cmd_calibrate, "predict": cmd_predict, "ssgd": cmd_ssgd, "report": cmd_report,
    "tune": cmd_tune,
}
