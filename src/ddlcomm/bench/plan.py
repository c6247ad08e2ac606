"""What a benchmark run will do, checked before any rank starts.

:func:`resolve` turns ``ddlcomm bench``'s options (as given) into the checked
:class:`BenchPlan`, asking each piece to check what it owns: the backends'
registry, the collectives, the workloads, the algorithms, the memory kinds and
the C reference's abilities.  It starts nothing and allocates nothing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional

from .. import memory
from ..kernels import device as kernels_device
from ..collectives import COLLECTIVES, Collective, check_in_place, get_collective
from ..comm import algorithms, device, registry, tuning
from ..dtypes import DType, ReduceOp, check_whole, get_dtype, get_op
from ..errors import UnsupportedError, UsageError
from ..units import (MAX_ITERS, about_size, counted, format_size, parse_list, parse_positive_int, parse_seconds,
                     parse_size, parse_sizes)
from ..workloads import base as workloads
from ..workloads.paths import check_path, get_path
from .cref import ABILITIES as C_REFERENCE

FORMS = ("buffer", "object")
#: Ranks per CPU this process may use beyond which ranks start only with --oversubscribe.
MAX_RANKS_PER_CPU = 8
#: The largest message of the default sweep.
DEFAULT_MAX_SIZE = "64MiB"
#: Implementations ``--impl`` accepts: the two Python forms and the C reference.
IMPLS = ("c", "buffer", "object")


@dataclass(frozen=True)
class PointSpec:
    """One thing to measure: a collective or a workload, at one size, on one backend."""

    kind: str        # "collective" | "workload" | "c"
    name: str        # the collective's or the workload's name
    nbytes: int      # message bytes (for a model: the total of its gradients)
    form: str
    backend: str
    algorithm: str = "library"
    path: str = "host"     # a workload's data path

    def label(self, with_backend: bool) -> str:
        where = f"{self.backend}, " if with_backend else ""
        how = "" if self.algorithm == "library" else f"{self.algorithm}, "
        how += "" if self.path == "host" else f"{self.path}, "
        return f"{self.name} ({where}{how}{self.form}, {format_size(self.nbytes)})"


class CollectivePoint(NamedTuple):
    """A collective point resolved for a communicator of ``size`` ranks: what it calls."""

    coll: Collective
    dtype: DType
    op: Optional[ReduceOp]      # None: the collective does not reduce
    count: int                  # elements per call (the collective's count for the bytes)
    in_place: bool

    @classmethod
    def of(cls, plan: "BenchPlan", spec: PointSpec, size: int) -> "CollectivePoint":
        coll, dtype = get_collective(spec.name), get_dtype(plan.dtype)
        return cls(coll, dtype, get_op(plan.op) if coll.reduces else None,
                   coll.count_for(spec.nbytes, dtype, size),
                   plan.in_place and coll.in_place_ok and spec.form == "buffer")   # objects: never


def _whole_blocks(specs: list[PointSpec], dtype: DType, size: int) -> list[PointSpec]:
    """``specs`` less the points of block-cutting collectives (reduce_scatter, alltoall)
    that would repeat an earlier point at ``size`` ranks: their message is rounded down to
    whole blocks, so at 3 ranks of float32 4 B and 8 B both move nothing, 16 B moves 12 B."""
    seen, kept = set(), []
    for spec in specs:
        coll = COLLECTIVES[spec.name]
        if coll.divisible:
            count = coll.count_for(spec.nbytes, dtype, size)
            key = (spec.kind, spec.name, spec.form, spec.backend, spec.algorithm, spec.path, count)
            if count == 0 or key in seen:
                continue
            seen.add(key)
        kept.append(spec)
    return kept


@dataclass
class BenchPlan:
    """The resolved options of one ``ddlcomm bench`` run."""

    backends: list[str]
    collectives: list[str]
    sizes: list[int]
    dtype: str
    op: str
    forms: list[str]
    workloads: list[str] = field(default_factory=list)
    model: Optional[str] = None
    fusion: Optional[int] = None
    steps: Optional[int] = None
    paths: list[str] = field(default_factory=lambda: ["host"])
    #: backends whose library collectives go host-staged where --path is left out: the
    #: buffers are on the device and the backend cannot take them there (:func:`staged_backends`)
    staged: list[str] = field(default_factory=list)
    algorithms: list[str] = field(default_factory=lambda: ["library"])
    memory: Optional[str] = None          # None: NumPy's allocator; else a ddlcomm.memory kind
    hbw_fallback: Optional[str] = None
    kind_cache: bool = True               # device buffers' kinds looked up once (on) or every call
    tuning: Optional[str] = None          # a measured table for --algorithm auto (comm/tuning.py)
    heap: str = "glibc"                   # the C library's heap in the ranks (memory/heap.py)
    containers: int = 0                   # 0: ranks on the host, no containers
    bind: str = "none"
    in_place: bool = False
    check: bool = True
    ranks: Optional[int] = None
    iters: Optional[int] = None
    warmup: Optional[int] = None
    budget_s: float = 0.2
    timeout_s: float = 120.0
    root: int = 0
    extra: dict = field(default_factory=dict)

    def points(self, size: Optional[int] = None) -> list[PointSpec]:
        """What is measured, in order: per collective, per size, every backend in turn.

        Backends (and workloads) alternate at each size, so drift of the
        machine hits them alike.
        A barrier moves no data, so it is measured once, not once per size.
        At ``size`` ranks, a collective that cuts its message into one block per
        rank measures each whole-block message once (:func:`_whole_blocks`).
        """
        if self.workloads:
            return [PointSpec("workload", w, s, "buffer", b, path=p)
                    for s in self.sizes for w in self.workloads for p in self.paths
                    for b in self.backends]
        paths = self.paths + [OWN_PATH] * (OWN_PATH not in self.paths
                                           and any(a != "library" for a in self.algorithms))
        specs = [PointSpec(_kind(f, q), c, s, f, b, a, path=q)
                 for c in self.collectives
                 for s in (self.sizes if COLLECTIVES[c].moves_data else self.sizes[:1])
                 for p in paths for b in self.backends for a in self.algorithms
                 for f in self.forms
                 if (a == "library" or f == "buffer") and (p == "host" or f == "buffer")
                 and (p == OWN_PATH if a != "library" else p in self.paths)
                 for q in (self.path_of(b, p) if a == "library" else p,)]
        return specs if size is None else _whole_blocks(specs, get_dtype(self.dtype), size)

    def path_of(self, backend: str, path: str) -> str:
        """The data path ``backend``'s library collectives take where the run names ``path``:
        host-staged for a :attr:`staged` backend on the host path."""
        return STAGED_PATH if path == "host" and backend in self.staged else path

    def as_config(self) -> dict:
        """A JSON-able record of the plan for the run row."""
        return {k: v for k, v in self.__dict__.items()}


#: The path of a backend's library collectives where it cannot take the run's device
#: buffers and --path is left out (:func:`staged_backends`).
STAGED_PATH = "host-staged"


def staged_backends(backends: list[str], memory_kind: Optional[str],
                    algorithms: list[str]) -> list[str]:
    """Of ``backends``, those whose library collectives go host-staged where ``--path`` is
    left out: the run calls the library (``algorithms``), the buffers are on the device
    (``memory_kind``) and the backend takes device memory only through a CUDA-aware MPI
    (an MPI).  A GPU pointer goes to an MPI only on
    ``--path direct``, asked for, and checked (``workloads.paths.Direct``).  Workloads keep
    the path they are given (a PS server's point-to-point runs along its own)."""
    if "library" not in algorithms or not memory.on_device(memory_kind):
        return []
    specs = {b: registry.get_spec(b) for b in backends}
    return [b for b, spec in specs.items() if "device" not in spec.memories and spec.device_if_cuda_aware]


def staged_note(plan: "BenchPlan") -> Optional[str]:
    """The line that says which backends run host-staged though no --path named it."""
    if not plan.staged:
        return None
    return (f"backend {', '.join(plan.staged)}: the library's collectives on --memory "
            f"{plan.memory} go {STAGED_PATH} (device -> pinned host, the collective, back; each "
            "phase timed apart): a GPU pointer goes to an MPI only on --path direct, where the "
            "MPI says it is CUDA-aware")


#: Where ddlcomm's own algorithms (and ``auto``) run whatever ``--path`` says: on the
#: buffers themselves (on device buffers they bring their own device transport); a GPU
#: data path applies to the library's collectives.
OWN_PATH = "host"


def _kind(form: str, path: str) -> str:
    """How a collective point is measured: the C loop, along a data path other than the
    default, or the collective itself (see ``runner.MEASURES``)."""
    if form == "c":
        return "c"
    return "collective" if path == "host" else "staged"


def parse_forms(text: str) -> list[str]:
    if text == "both":
        return list(FORMS)
    if text not in FORMS:
        raise UsageError(f"unknown form {text!r}", "choose buffer, object or both")
    return [text]


def parse_impls(text: str) -> list[str]:
    """``--impl``: a comma list of c, buffer, object (kept in the order given)."""
    impls = [part.strip() for part in text.split(",") if part.strip()]
    bad = [i for i in impls if i not in IMPLS]
    if bad or not impls or len(set(impls)) != len(impls):
        raise UsageError(f"bad --impl {text!r}", f"a comma list of {', '.join(IMPLS)}, each once")
    return impls


def memory_needed(coll: Collective, nbytes: int, ranks: int, object_form: bool) -> int:
    """Bytes one host needs for one point with all ``ranks`` on it (an estimate).

    Each rank holds its input, its output and the expected result for the
    check; each receiver of a gather (the root; every rank of an allgather)
    holds ``ranks`` messages twice.  Pickled objects double what is held.  The barrier
    holds nothing.
    """
    if not coll.moves_data:
        return 0
    receivers = sum(coll.has_recvbuf(r, 0) for r in range(ranks)) if coll.gathers else 1
    need = ranks * 3 * nbytes + 2 * receivers * coll.receiver_bytes(nbytes, ranks)
    return need * 2 if object_form else need


def check_memory(coll: Collective, nbytes: int, ranks: int, object_form: bool,
                 available: int) -> None:
    """Refuse a point that cannot fit, before anything is allocated."""
    need = memory_needed(coll, nbytes, ranks, object_form)
    if need > available:
        raise UsageError(
            f"{coll.name} of {format_size(nbytes)} per rank at {ranks} ranks needs about "
            f"{about_size(need)} of memory, more than the {format_size(available)} available",
            "use smaller --sizes or fewer --ranks")


def check_fits(plan: BenchPlan, available: int) -> None:
    """Refuse a plan whose ranks and largest point cannot fit in ``available`` bytes,
    all ranks here."""
    ranks_bytes = check_rank_memory(plan.ranks, rank_bytes(plan.backends), available)
    # A workload holds what a gather holds at its server (ps-sync) or less.
    for name in plan.collectives or ["gather"]:
        check_memory(get_collective(name), max(plan.sizes), plan.ranks,
                     "object" in plan.forms and not plan.workloads, available - ranks_bytes)


def rank_bytes(backends: list[str]) -> int:
    """Memory one rank running ``backends`` takes before any buffer (the largest's)."""
    return max(registry.get_spec(b).rank_bytes for b in backends)


def check_rank_memory(ranks: int, rank_bytes: int, available: int) -> int:
    """The bytes ``ranks`` ranks of ``rank_bytes`` each take before any buffer; refused
    when more than ``available``."""
    ranks_bytes = ranks * rank_bytes
    if ranks_bytes > available:
        raise UsageError(f"{ranks} ranks need about {about_size(ranks_bytes)} of memory "
                         f"before any buffer, more than the {format_size(available)} available",
                         "use fewer --ranks")
    return ranks_bytes


def check_start(ranks: int, oversubscribe: bool, backends: list[str]) -> None:
    """Before starting ``ranks`` local ranks running ``backends``: against the CPUs this
    process may use (see :func:`check_ranks`) and the memory available."""
    check_ranks(ranks, usable_cpus(), oversubscribe)
    check_rank_memory(ranks, rank_bytes(backends), mem_available())


def usable_cpus() -> int:
    """The CPUs this process may run on (logical CPUs, as taskset lists them: two hardware
    threads of one core are two)."""
    return len(os.sched_getaffinity(0))


def check_ranks(ranks: int, cpus: int, oversubscribe: bool) -> None:
    """Refuse to start more than MAX_RANKS_PER_CPU ranks per CPU unless asked to."""
    limit = MAX_RANKS_PER_CPU * cpus
    if ranks > limit and not oversubscribe:
        raise UsageError(f"--ranks {ranks} is more than {MAX_RANKS_PER_CPU} ranks per CPU on "
                         f"the {counted(cpus, 'CPU')} this process may use",
                         f"use --ranks {limit} or fewer, or add --oversubscribe to start them anyway")


def mem_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (or a very large number elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


# ------------------------------------------------------------------ options
@dataclass(frozen=True)
class BenchOptions:
    """``ddlcomm bench``'s options as the user gave them: strings, flags, None when left out."""

    backend: str
    collective: Optional[str]
    workload: Optional[str]
    sizes: Optional[str]
    model: Optional[str]
    fusion: Optional[str]
    steps: Optional[str]
    path: Optional[str]         # None: left out (host, or host-staged: :func:`staged_backends`)
    dtype: str
    op: str
    form: Optional[str]
    impl: Optional[str]
    algorithm: str
    memory: Optional[str]
    hbw_fallback: Optional[str]
    containers: Optional[str]
    kind_cache: Optional[str]
    bind: str
    in_place: bool
    check: bool
    ranks: Optional[str]
    iters: Optional[str]
    warmup: Optional[str]
    budget: str
    timeout: str
    root: str
    tag: Optional[str]
    tuning: Optional[str] = None
    heap: str = "glibc"


def resolve(o: BenchOptions, default_ranks: Optional[int]) -> BenchPlan:
    """Check every bench option and return the plan (raises UsageError)."""
    backends = parse_list(o.backend, "--backend")
    for name in backends:
        registry.check(name)          # first: a backend that cannot run here says so at once
    registry.check_together(backends)
    dtype, op = get_dtype(o.dtype), get_op(o.op)
    ranks = parse_positive_int(o.ranks, "--ranks") if o.ranks is not None else default_ranks
    algorithms_ = parse_list(o.algorithm, "--algorithm")
    algorithms.check_distinct(algorithms_)
    collectives, workloads_ = _targets(o, dtype, op, algorithms_)
    left_out = o.path is None and not workloads_      # --path not given, for collectives
    plan = BenchPlan(
        backends=backends, collectives=collectives, sizes=_sizes(o, dtype),
        workloads=workloads_, model=o.model,
        fusion=parse_size(o.fusion, "--fusion") if o.fusion is not None else None,
        steps=parse_positive_int(o.steps, "--steps", 1, MAX_ITERS) if o.steps is not None else None,
        paths=parse_list("host" if o.path is None else o.path, "--path"),
        staged=staged_backends(backends, o.memory, algorithms_) if left_out else [],
        dtype=dtype.name, op=op.name, forms=_forms(o), in_place=o.in_place,
        memory=o.memory, hbw_fallback=o.hbw_fallback, bind=o.bind,
        algorithms=algorithms_, kind_cache=parse_kind_cache(o.kind_cache),
        containers=parse_positive_int(o.containers, "--containers") if o.containers else 0,
        check=o.check, ranks=ranks,
        iters=parse_positive_int(o.iters, "--iters", 1, MAX_ITERS) if o.iters else None,
        warmup=parse_positive_int(o.warmup, "--warmup", 0, MAX_ITERS) if o.warmup is not None else None,
        budget_s=parse_seconds(o.budget, "--budget"),
        timeout_s=parse_seconds(o.timeout, "--timeout"),
        root=parse_positive_int(o.root, "--root", 0), tuning=_tuning(o.tuning, algorithms_), heap=o.heap,
        extra={"tag": o.tag} if o.tag else {})
    check(plan)
    check_kind_cache(plan, o.kind_cache)
    if (o.form or o.impl) and "library" not in plan.algorithms:
        _check_library_forms(plan.forms)
    return plan


def _check_library_forms(forms: list[str]) -> None:
    """Forms asked for that only the library's collective has (the C reference, pickled
    objects), with none of ``--algorithm`` the library: its points were left out unsaid."""
    others = [f for f in forms if f != "buffer"]
    if others:
        raise UsageError(f"--form/--impl {', '.join(others)} measures the library's collective, "
                         "and --algorithm leaves it out",
                         "add library to --algorithm, or ask for the buffer form alone")


def _tuning(path: Optional[str], asked: list[str]) -> Optional[str]:
    """``--tuning``: the table's absolute path, read and checked now (UsageError if bad: a
    band naming an algorithm this ddlcomm lacks failed every rank at the first ``auto``
    point; and a table without ``auto`` among ``asked`` would change nothing)."""
    if path is None:
        return None
    if not any(algorithms.split(a)[0] == "auto" for a in asked):
        raise UsageError("--tuning is the table --algorithm auto chooses from, and no auto is asked",
                         "add auto to --algorithm, or drop --tuning")
    full = str(Path(path).expanduser().resolve())
    table = tuning.load(full)
    for (_, collective, _), bands in table.bands.items():
        for _, name in bands:
            try:
                algorithms.check(collective, name)
            except UsageError as exc:
                raise UsageError(f"--tuning {path}: {exc.args[0]}", exc.hint) from None
    return full


#: The collectives a run measures where --collective is left out (those of them that have
#: every --algorithm named: :func:`default_collectives`).
DEFAULT_COLLECTIVES = ("broadcast", "gather", "allreduce")


def default_collectives(algorithm_names: list[str]) -> list[str]:
    """Of :data:`DEFAULT_COLLECTIVES`, those that have every algorithm named (``--algorithm
    ring`` alone: allreduce); all of them where none has (the check then says which lacks
    what) (pure)."""
    fits = [c for c in DEFAULT_COLLECTIVES
            if all(algorithms.split(a)[0] in algorithms.names(c) for a in algorithm_names)]
    return fits or list(DEFAULT_COLLECTIVES)


def _targets(o: BenchOptions, dtype: DType, op: ReduceOp,
             algorithm_names: list[str]) -> tuple[list[str], list[str]]:
    """(collectives, workloads): one of them is given, the other empty."""
    if o.workload is not None:
        workloads_ = parse_list(o.workload, "--workload")
        if o.collective is not None:
            raise UsageError("give --collective or --workload, not both")
        for flag, given in (("--form", o.form not in (None, "buffer")),
                            ("--impl", o.impl not in (None, "buffer")),
                            ("--op", o.op != "sum"), ("--in-place", o.in_place),
                            ("--root", o.root not in (None, "0"))):
            if given:
                raise UsageError(f"{flag} applies to --collective runs",
                                 "a workload reduces its gradients its own way, in buffer form, "
                                 "its server rank 0")
        return [], workloads_
    for flag in ("model", "fusion", "steps"):
        if getattr(o, flag) is not None:
            raise UsageError(f"--{flag} applies to --workload runs")
    collectives = (default_collectives(algorithm_names) if o.collective is None
                   else parse_list(o.collective, "--collective"))
    for name in collectives:
        get_collective(name).check_request(op=op, dtype=dtype)
    chosen = [get_collective(name) for name in collectives]
    verb = "s" if len(collectives) == 1 else ""
    if o.op != "sum" and not any(c.reduces for c in chosen):
        raise UsageError(f"--op applies to reductions, and {', '.join(collectives)} reduce{verb} nothing",
                         "add allreduce, reduce or reduce_scatter, or drop --op")
    if o.sizes is not None and not any(c.moves_data for c in chosen):
        raise UsageError(f"--sizes applies to collectives that move data, and {', '.join(collectives)} "
                         f"move{verb} none", "drop --sizes")
    if o.in_place:
        check_in_place([get_collective(name) for name in collectives])
    return collectives, []


def _sizes(o: BenchOptions, dtype: DType) -> list[int]:
    """--sizes (each a whole number of elements), or a model's gradient bytes.

    The default sweep starts at one element of the dtype (4B:64MiB for float32).
    """
    sizes = parse_sizes(f"{dtype.itemsize}B:{DEFAULT_MAX_SIZE}" if o.sizes is None else o.sizes)
    if o.model is not None:
        if o.sizes is not None:
            raise UsageError("give --sizes or --model, not both", "--model sets the sizes")
        return [workloads.model_bytes(o.model, dtype.name)]
    if o.fusion is not None:
        raise UsageError("--fusion applies to --model runs")
    for n in sizes:
        check_whole(n, dtype, "--sizes")
    return sizes


def _forms(o: BenchOptions) -> list[str]:
    """--form or --impl; on a device memory kind, or along GPU data paths only, the buffer
    form only (objects are pickled host bytes, the C reference moves host memory; a path's
    object points were left out unsaid)."""
    if o.impl is not None and o.form is not None:
        raise UsageError("give --form or --impl, not both", "--impl c,buffer,object covers both")
    forms = parse_impls(o.impl) if o.impl is not None else parse_forms("both" if o.form is None else o.form)
    along = o.path is not None and "host" not in parse_list(o.path, "--path")
    if not (memory.on_device(o.memory) or along):
        return forms
    if o.form is None and o.impl is None:
        return ["buffer"]
    # along a path the C reference is refused with its own reason (check_collective_paths)
    wrong = [f for f in forms if f != "buffer" and (f == "object" or not along)]
    if wrong:
        where = f"--path {o.path} moves" if along else f"--memory {o.memory} holds"
        raise UsageError(f"{where} buffer-form calls only, not {', '.join(wrong)}", "use --form buffer")
    return forms


def check_containers(plan: BenchPlan) -> None:
    """--containers K: at least K ranks, and no algorithm that needs every rank on one node
    (each container is a node of its own: shm refused only once the ranks had started)."""
    if plan.ranks is not None and plan.containers > plan.ranks:
        raise UsageError(f"--containers {plan.containers} needs at least as many ranks",
                         f"use --ranks {plan.containers} or more")
    one_node = [a for a in plan.algorithms if algorithms.split(a)[0] in algorithms.ONE_NODE]
    if plan.containers > 1 and one_node and "allreduce" in plan.collectives:
        raise UsageError(f"--algorithm {one_node[0]} needs every rank on one node, and --containers "
                         f"{plan.containers} makes {plan.containers} nodes",
                         "use --algorithm hierarchical (or ring) across containers")


#: Budgets a point takes at most, about: the probe (a tenth or more), the warm-up (a tenth of
#: the iterations), the timed calls (one budget) and x_add's NumPy pass (up to a quarter).
POINT_BUDGETS = 1.5


def check(plan: BenchPlan) -> None:
    """What the pieces refuse: ranks, workloads, memory, the C reference, containers, algorithms."""
    if plan.ranks is not None and plan.root >= plan.ranks:
        raise UsageError(f"--root {plan.root} is not one of the {plan.ranks} ranks")
    if plan.root and plan.collectives and not any(get_collective(c).rooted for c in plan.collectives):
        raise UsageError(f"--root applies to rooted collectives, not {', '.join(plan.collectives)}",
                         "add broadcast, gather, reduce, ... to --collective, or leave --root out")
    if plan.iters is None and POINT_BUDGETS * plan.budget_s >= plan.timeout_s:
        raise UsageError(f"--timeout {plan.timeout_s:g} s is not more than a point takes at --budget "
                         f"{plan.budget_s:g} s (about {POINT_BUDGETS:g}x: the probe, the warm-up, the "
                         "timed calls and x_add's pass): every large point would time out",
                         "raise --timeout, or lower --budget")
    if plan.workloads:
        workloads.check_request(plan)
    elif plan.paths != ["host"]:
        check_collective_paths(plan)
    if plan.memory is not None:
        memory.check(plan.memory, plan.hbw_fallback)
    elif plan.hbw_fallback is not None:
        raise UsageError("--hbw-fallback applies to --memory hbw")
    if plan.staged:
        check_path(STAGED_PATH, plan)
    check_backend_memory(plan)
    if "c" in plan.forms:
        C_REFERENCE.check_request(plan.backends, plan.collectives, plan.dtype, plan.op)
    if plan.ranks is not None:
        check_whole_blocks(plan, plan.ranks)
    if plan.in_place and "buffer" not in plan.forms:     # the run's config said in place, no point was
        raise UsageError(f"--in-place applies to buffer-form calls, and --form/--impl gives "
                         f"{', '.join(plan.forms)} (object calls and the C reference run out of place)",
                         "add buffer to --form or --impl, or drop --in-place")
    if plan.containers:
        check_containers(plan)
    if plan.algorithms != ["library"]:
        if "buffer" not in plan.forms:
            raise UsageError("ddlcomm's own algorithms run in buffer form, which --form/--impl "
                             f"leaves out ({', '.join(plan.forms)})", "add buffer to --form or --impl")
        for name in plan.collectives:
            for algorithm in plan.algorithms:
                algorithms.check(name, algorithm)
        if plan.workloads:
            raise UsageError("--algorithm applies to collectives (workloads use the library's)")
        if on_device(plan):
            check_device_algorithms(plan)
        else:
            for algorithm in plan.algorithms:
                kernel = algorithms.split(algorithm)[1]
                if kernel in kernels_device.DEVICE_KERNELS:
                    raise UsageError(f"{algorithm}: the {kernel} kernel reduces device buffers",
                                     "add --memory device, or use +c or +numpy")
        mapped = [a for a in plan.algorithms if algorithms.split(a)[0] == "shm-map"]
        if mapped and plan.memory is not None and memory.parse(plan.memory)[0] == "pinned":
            raise UsageError(f"--algorithm {mapped[0]} moves the buffers' pages, and --memory pinned's "
                             "must stay where the GPU's copies find them", "use --algorithm shm")


def check_whole_blocks(plan: BenchPlan, ranks: int) -> None:
    """Refuse a block-cutting collective none of whose sizes holds a block per rank."""
    kept = {spec.name for spec in plan.points(ranks)}
    for name in plan.collectives:
        if COLLECTIVES[name].divisible and name not in kept:
            least = ranks * get_dtype(plan.dtype).itemsize
            raise UsageError(f"{name} at {ranks} ranks cuts the message into {ranks} blocks: "
                             f"no size given is {format_size(least)} or more",
                             f"give sizes from {format_size(least)}")


def check_kind_cache(plan: BenchPlan, given: Optional[str]) -> None:
    """``--kind-cache`` given where ddlcomm's own algorithms run on device buffers only."""
    if given is not None and not (on_device(plan) and own_only(plan)):
        raise UsageError("--kind-cache applies to ddlcomm's own algorithms on --memory device",
                         "add --memory device --algorithm ring,rhd,shm (on a GPU machine)")


def own_only(plan: BenchPlan) -> bool:
    """Collectives by ddlcomm's own algorithms only (no library, no auto that may pick it)."""
    return not plan.workloads and not any(_calls_library(a) for a in plan.algorithms)


#: ``--kind-cache`` values.
KIND_CACHE = {"on": True, "off": False}


def parse_kind_cache(text: Optional[str]) -> bool:
    """``--kind-cache on|off`` (default on)."""
    if text is None:
        return True
    if text not in KIND_CACHE:
        raise UsageError(f"--kind-cache {text!r}: choose on or off")
    return KIND_CACHE[text]


def on_device(plan: BenchPlan) -> bool:
    """Whether the run's buffers are device memory."""
    return memory.on_device(plan.memory)


def check_device_algorithms(plan: BenchPlan) -> None:
    """On device buffers, ddlcomm's algorithms that run there, with a device kernel."""
    for name in plan.collectives:
        for algorithm in plan.algorithms:
            check_device_algorithm(name, algorithm, f"--memory {plan.memory}")


def check_device_algorithm(name: str, algorithm: str, where: str) -> None:
    """Refuse ``algorithm`` for collective ``name`` on device buffers (``where`` says which,
    e.g. "--memory device") unless it runs there with a device kernel (``auto+numpy`` too:
    it chose ring+numpy, refused mid-call)."""
    base, kernel = algorithms.split(algorithm)
    if kernel in kernels_device.HOST_KERNELS:
        raise UsageError(f"{algorithm}: the {kernel} kernel reduces host arrays, not {where}",
                         f"use {base}, {base}+torch or {base}+cupy")
    if _calls_library(algorithm):
        return
    if base not in device.algorithms_for(name):
        raise UsageError(f"{name} by {base} does not run on {where}",
                         f"on device buffers {name} has: library, "
                         f"{', '.join(device.algorithms_for(name)) or 'nothing else'}")
    if algorithms.piece(algorithm) is not None:
        raise UsageError(f"{algorithm}: a piece applies to the host all-reduces, not {where}",
                         f"use {base}")


def check_collective_paths(plan: BenchPlan) -> None:
    """Collectives along data paths: paths made for single collectives, buffer form, the
    library's collectives, and paths that can run here."""
    for name in plan.paths:
        if not get_path(name).for_collectives:
            raise UsageError(f"--path {name} is a parameter-server path: it applies to --workload "
                             "runs", "use --path host-staged or direct for collectives")
    if "c" in plan.forms:
        raise UsageError("--impl c runs on host buffers: not along a GPU data path")
    if "library" not in plan.algorithms:
        raise UsageError(f"--path {','.join(plan.paths)} applies to the library's collectives; "
                         "ddlcomm's own algorithms run on the buffers themselves",
                         "add library to --algorithm, or leave --path out")
    if plan.algorithms != ["library"] and len(plan.paths) > 1:
        raise UsageError("beside ddlcomm's own algorithms (which run on the buffers themselves) "
                         f"the library takes one --path, not {len(plan.paths)}",
                         "e.g. --path host-staged --algorithm library,ring,rhd,shm")
    for name in plan.paths:
        check_path(name, plan)


def check_backend_memory(plan: BenchPlan) -> None:
    """Refuse a backend handed memory it cannot take: where each data path puts the buffers
    it hands over (the run's --memory kind on the host path) against what each backend's
    registry entry takes.  The library's collectives go along every --path; ddlcomm's own
    algorithms run on the buffers themselves (:data:`OWN_PATH`) and hand the backend host
    memory only (staged blocks, small ready messages), whatever the buffers' memory, but
    ``auto`` may call the library there.  A CUDA-aware MPI's device buffers are the direct
    path's to check."""
    device_bufs = on_device(plan)
    own = {(OWN_PATH, _calls_library(a)) for a in plan.algorithms if a != "library"}
    for backend in plan.backends:
        spec = registry.get_spec(backend)
        pairs = own | {(plan.path_of(backend, name), True) for name in plan.paths
                       if plan.workloads or "library" in plan.algorithms}
        for name, library in sorted(pairs):
            path = get_path(name)
            where = path.backend_memory or ("device" if device_bufs and library else "host")
            if where in spec.memories or (where == "device" and spec.device_if_cuda_aware
                                          and path.backend_memory == "device"):
                continue
            if not library and device_bufs:
                raise UnsupportedError(
                    f"ddlcomm's own algorithms on --memory {plan.memory} hand the backend host "
                    f"messages only (ipc's ready/done headers, staged blocks); backend {backend} "
                    "moves device memory only", "use --backend mpi or gloo with ddlcomm's "
                    f"algorithms, or --algorithm library with --backend {backend}")
            raise UnsupportedError(*_memory_refusal(backend, spec, where, plan.memory))


def _calls_library(algorithm: str) -> bool:
    """Whether ``algorithm`` runs (or, ``auto``, may run) the library's own collective."""
    return algorithms.split(algorithm)[0] in ("library", "auto")


def _memory_refusal(backend: str, spec, where: str, kind: Optional[str]) -> tuple[str, str]:
    """(message, hint) of a backend refused the memory it would be handed."""
    if where == "host":
        return (f"backend {backend} moves device (GPU) memory only, not host memory "
                f"({kind or 'numpy'})", "add --memory device (collectives, workloads on --path host)")
    if spec.device_if_cuda_aware:
        return (f"backend {backend} takes device memory only through a CUDA-aware MPI "
                "(--path direct): never a GPU pointer to a CPU-only library",
                "add --path host-staged (the library's collectives through pinned host memory; "
                "ddlcomm's own algorithms still run on the device buffers), "
                "or use --backend nccl or gloo on --memory device")
    return (f"backend {backend} moves host memory only, not --memory {kind}",
            "use a host memory kind, or --path host-staged for workloads")
