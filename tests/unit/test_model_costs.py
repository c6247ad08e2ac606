"""Cost formulas of ddlcomm.model.costs and library.py against hand-computed values."""
from __future__ import annotations

import functools
import time

import pytest

from ddlcomm.comm.native import Schedule
from ddlcomm.errors import UsageError
from ddlcomm.model import costs, library, node
from ddlcomm.model.costs import Params, Setting
from ddlcomm.model.node import Load

N = 1000.0
P = Params(alpha=1.0, beta=0.01, gamma=0.001)


def terms(coll, alg, p, n=N, **kw):
    s = costs.terms(coll, alg, p, n, **kw)
    return (s.rounds, pytest.approx(s.bytes), pytest.approx(s.reduced_bytes))


@pytest.mark.parametrize("coll, alg, p, expected", [
    # ring: 2(p-1); 2(p-1)/p n; (p-1)/p n
    ("allreduce", "ring", 1, (0, 0, 0)),
    ("allreduce", "ring", 2, (2, N, N / 2)),
    ("allreduce", "ring", 5, (8, 1600, 800)),
    # rhd: 2 log2 p on powers of two; the fold adds 2 rounds, 2n moved, n reduced
    ("allreduce", "rhd", 1, (0, 0, 0)),
    ("allreduce", "rhd", 2, (2, N, N / 2)),
    ("allreduce", "rhd", 4, (4, 1500, 750)),
    ("allreduce", "rhd", 5, (6, 3500, 1750)),
    ("allreduce", "rabenseifner", 6, (6, 3500, 1750)),
    # recursive doubling: log2 p' exchanges of n, +2 off powers of two (one not reduced)
    ("allreduce", "recursive_doubling", 1, (0, 0, 0)),
    ("allreduce", "recursive_doubling", 2, (1, N, N)),
    ("allreduce", "recursive_doubling", 4, (2, 2 * N, 2 * N)),
    ("allreduce", "recursive_doubling", 5, (4, 4 * N, 3 * N)),
    ("allreduce", "linear", 3, (4, 4 * N, 2 * N)),
    ("allreduce", "nonoverlapping", 3, (4, 4 * N, 2 * N)),     # binomial reduce + bcast: 2+2
    ("allreduce", "shm", 1, (0, 2 * N, 0)),
    ("allreduce", "shm", 4, (3, 7 * N / 4, 750)),
    ("allreduce", "shm", 3, (3, 5 * N / 3, N * 2 / 3)),
    ("broadcast", "binomial", 1, (0, 0, 0)),
    ("broadcast", "binomial", 2, (1, N, 0)),
    ("broadcast", "binomial", 5, (3, 3 * N, 0)),
    # Open MPI's trees post to all children at once: posts are rounds, a level one n
    ("broadcast", "linear", 4, (3, N, 0)),
    ("broadcast", "binary", 2, (1, N, 0)),
    ("broadcast", "binary", 3, (2, N, 0)),
    ("broadcast", "binary", 5, (3, 2 * N, 0)),                  # node 4: left (1) then right (2)
    ("broadcast", "binary", 7, (4, 2 * N, 0)),                  # node 6: right, right
    ("broadcast", "binary", 8, (4, 3 * N, 0)),
    ("broadcast", "knomial", 4, (3, N, 0)),
    ("broadcast", "knomial", 5, (4, N, 0)),                     # 4 first, then 1, 2, 3
    ("broadcast", "knomial", 20, (7, 2 * N, 0)),                # 16, 4, 8, 12, then 1, 2, 3
    ("broadcast", "scatter_rd_allgather", 4, (4, 1500, 0)),
    ("broadcast", "scatter_ring_allgather", 4, (5, 1500, 0)),
    ("broadcast", "scatter_ring_allgather", 1, (0, 0, 0)),
    ("broadcast", "pipelined", 4, (3, 3 * N, 0)),               # one piece (default 256 KiB)
    ("gather", "linear", 1, (0, 0, 0)),
    ("gather", "linear", 3, (2, 2 * N, 0)),
    ("gather", "binomial", 5, (3, 4 * N, 0)),
    ("gather", "linear_sync", 3, (4, 2 * N, 0)),
    ("reduce", "binomial", 3, (2, 2 * N, 2 * N)),
])
def test_terms_by_hand(coll, alg, p, expected):
    assert terms(coll, alg, p) == expected


def test_open_mpi_pipeline_is_one_chain():
    assert terms("broadcast", "chain", 4, fanout=1) == (3, 3 * N, 0)


@pytest.mark.parametrize("p, expected", [
    (4, (3, N, 0)),                         # 3 chains of one rank
    (9, (5, 2 * N, 0)),                     # 4 chains of two: 4 + 2 - 1
    (7, (4, 2 * N, 0)),                     # chains 2, 2, 1, 1: 2nd ends at 2 + 1
])
def test_chains_of_fan_out_4(p, expected):
    """A forced chain (``coll_tuned_bcast_algorithm_chain_fanout`` 4)."""
    assert terms("broadcast", "chain", p, fanout=4) == expected


def _walk(tree):
    """(rounds, depth, widest) of a broadcast tree by walking it: a child is
    its parent's i-th post (i from 1)."""
    rounds = depth = 0
    stack, width = [(0, 0, 0)], {}
    while stack:
        v, r, d = stack.pop()
        rounds, depth = max(rounds, r), max(depth, d)
        width[d] = width.get(d, 0) + 1
        stack += [(c, r + i + 1, d + 1) for i, c in enumerate(tree[v])]
    return rounds, depth, max([w for d, w in width.items() if d] or [1])


def _chains(p, f):
    kids, nxt = [[] for _ in range(p)], 1
    for c in range(min(f, p - 1)):
        length = (p - 1) // min(f, p - 1) + (c < (p - 1) % min(f, p - 1))
        prev = 0
        for r in range(nxt, nxt + length):
            kids[prev].append(r)
            prev = r
        nxt += length
    return kids


def _kmtree(p, k):
    kids, steps, step = [[] for _ in range(p)], [], 1
    while step < p:
        steps.append(step)
        step *= k
    for r in range(p):
        for step in reversed(steps):
            if r % (step * k) == 0:
                kids[r] += [r + j * step for j in range(1, k) if r + j * step < p]
    return kids


@pytest.mark.parametrize("p", range(1, 130))
def test_tree_shapes_match_the_trees(p):
    assert costs.star_shape(p) == _walk([list(range(1, p))] + [[]] * (p - 1))
    for f in (1, 2, 4):
        assert costs.chain_shape(p, f) == _walk(_chains(p, f)), f
    assert costs.binary_shape(p) == _walk([[c for c in (2 * i + 1, 2 * i + 2) if c < p]
                                           for i in range(p)])
    for k in (2, 4):
        assert costs.knomial_shape(p, k) == _walk(_kmtree(p, k)), k


def test_pipelined_pieces():
    # 1 MiB in 256 KiB pieces on 4 ranks: p - 2 + m = 6 rounds of a quarter
    s = costs.terms("broadcast", "pipelined", 4, 1 << 20)
    assert (s.rounds, s.bytes) == (6, 6 * (1 << 18))


def test_params_time_by_hand():
    # ring at p=4, n=1000: 6 α + 1500 β + 750 γ = 6 + 15 + 0.75
    assert costs.time("allreduce", "ring", 4, N, P) == pytest.approx(21.75)
    # binomial broadcast at 5: 3 (α + n β) = 3 · 11
    assert costs.time("bcast", "binomial", 5, N, P) == pytest.approx(33.0)
    # linear gather at 3: 2 (α + n β)
    assert costs.time("gather", "linear", 3, N, P) == pytest.approx(22.0)


def test_oversubscription_terms():
    assert node.oversubscription(2, 2) == 0
    assert node.oversubscription(3, 2) == pytest.approx(1 / 3)
    assert node.oversubscription(4, 2) == 0.5
    assert node.oversubscription(64, None) == 0
    q = Params(1.0, 0.01, 0.001, alpha_over=2.0, beta_over=0.1)
    s = Schedule(2, 100.0, 50.0)
    assert q.time(s) == pytest.approx(2 + 1 + 0.05)
    assert q.time(s, Load(over=0.5)) == pytest.approx(3.05 + 0.5 * (4 + 15))
    # through time(): 4 ranks on a 2-core node
    t = costs.time("gather", "linear", 4, N, q, Setting(ranks_per_node=4, cores=2))
    assert t == pytest.approx(3 * 11 + 0.5 * (3 * 2 + 3000 * 0.1))
    # rhd on 4 ranks of 2 cores: all 4 copy and reduce at once, so β and γ count twice
    s4 = costs.terms("allreduce", "rhd", 4, N)
    t = costs.time("allreduce", "rhd", 4, N, q, Setting(ranks_per_node=4, cores=2))
    assert t == pytest.approx(4 * 1 + 2 * (1500 * 0.01 + 750 * 0.001)
                              + 0.5 * (4 * 2 + 2250 * 0.1))
    assert q.time(s4, Load(over=0.5, share=2.0)) == pytest.approx(t)
    # rhd on 3 ranks: only the power-of-two core (2 ranks) is busy: no sharing
    assert costs.share("allreduce", "rhd", 3, 3, 2) == 1.0
    assert costs.share("allreduce", "ring", 3, 3, 2) == 1.5
    assert costs.share("gather", "linear", 64, 64, 2) == 1.0
    assert costs.share("allreduce", "ring", 64, 64, None) == 1.0
    # default placement: one node's cores per node, so nothing is oversubscribed
    assert costs.time("gather", "linear", 4, N, q, Setting(cores=2)) == pytest.approx(33.0)


def test_oversubscription_by_how_the_library_waits():
    assert node.oversubscription(3, 2, "yield") == 1.0 == node.oversubscription(6, 2, "yield")
    assert node.oversubscription(2, 2, "yield") == 0.0
    assert node.oversubscription(6, 2, "sleep") == pytest.approx(2 / 3)
    assert library.waiting("Open MPI 5.0.11") == "yield"
    assert library.waiting("MPICH") == library.waiting("gloo") == library.waiting(None) == "sleep"
    q = Params(1.0, 0.01, alpha_over=2.0)
    # Open MPI's linear gather at 4 ranks on 2 cores: over = 1, not 0.5
    t = costs.time("gather", "linear", 4, N, q, Setting(library="Open MPI", ranks_per_node=4, cores=2))
    assert t == pytest.approx(3 * 11 + 1.0 * 3 * 2)


def test_a_lone_copy_of_open_mpi_does_not_wait_per_byte():
    """Open MPI's lone copies run at full speed: in its chain (one rank copying at a
    time) an oversubscribed node costs waits per message, not per byte; MPICH's
    copies and algorithms with several busy ranks still wait per byte."""
    assert library.copies_alone("Open MPI 5.0.11") and not library.copies_alone("MPICH")
    assert not library.copies_alone(None)
    assert not costs.waits_per_byte("broadcast", "chain", 4, "Open MPI")
    assert costs.waits_per_byte("broadcast", "chain", 4, "MPICH")
    assert costs.waits_per_byte("allreduce", "ring", 4, "Open MPI")
    assert costs.waits_per_byte("broadcast", "binomial", 4, "Open MPI")      # 2 pairs at once
    q = Params(1.0, 0.01, alpha_over=2.0, beta_over=0.1)
    chain = costs.terms("broadcast", "chain", 4, N)
    assert chain == Schedule(3, 3 * N)              # one chain: 3 hops of the whole buffer
    setting = Setting(library="Open MPI", ranks_per_node=4, cores=2)
    t = costs.time("broadcast", "chain", 4, N, q, setting)
    assert t == pytest.approx(3 * 1 + 3 * N * 0.01 + 1.0 * 3 * 2)
    mpich = costs.time("broadcast", "chain", 4, N, q, Setting(library="MPICH", ranks_per_node=4, cores=2))
    # (MPICH's point-to-point bytes on one node count twice: library.P2P_COPIES)
    assert mpich == pytest.approx(3 * 1 + 6 * N * 0.01 + 0.5 * (3 * 2 + 6 * N * 0.1))
    # the columns a fit multiplies the parameters by are the prediction's
    load = costs.node_load("broadcast", "chain", 4, N, 4, setting)
    assert sum(f * v for f, v in zip(node.features(chain, load), q.to_dict().values())) == \
        pytest.approx(t)


def test_open_mpi_runs_its_chain_broadcast_with_fan_out_1():
    """The fixed decision passes fan-out 0, which build_chain forces to 1 (the chain
    and the pipeline are one chain of p-1 hops), from 1 MiB up at 4-7 ranks."""
    assert library.open_mpi("broadcast", 6, 4 << 20) == ("chain", {})
    assert costs.terms("broadcast", "chain", 6, N) == costs.terms("broadcast", "chain", 6, N, fanout=1)
    assert costs.terms("broadcast", "chain", 6, N) == Schedule(5, 5 * N)


def test_cache_spill():
    # working set: all-reduce 2 buffers x 4 ranks x n; gather 2; broadcast 1
    # (all of it streams from memory once it outgrows the cache, none while it fits)
    assert node.spill("allreduce", 4, 1 << 20, 32 << 20) == 0.0           # 8 MiB fits
    assert node.spill("allreduce", 4, 4 << 20, 32 << 20) == 0.0           # 32 MiB: just fits
    assert node.spill("allreduce", 4, 8 << 20, 32 << 20) == 1.0           # 64 MiB
    assert node.spill("broadcast", 4, 8 << 20, 32 << 20) == 0.0
    assert node.spill("broadcast", 4, 16 << 20, 32 << 20) == 1.0
    assert node.spill("allreduce", 4, 8 << 20, None) == 0.0
    q = Params(1.0, 0.01, 0.001, beta_spill=0.02)
    s = Schedule(2, 100.0, 50.0)
    assert q.time(s, Load(spill=0.5)) == pytest.approx(2 + 1 + 0.05 + 0.5 * 150 * 0.02)
    assert q.time(s, Load(share=2.0, spill=0.5)) == pytest.approx(2 + 2 * (1 + 0.05 + 0.5 * 150 * 0.02))
    # through time(): a 2-rank ring of 32 MiB (a working set of 128 MiB) spills all of it
    # beyond a 64 MiB cache, nothing within a 128 MiB one
    n = 32 << 20
    plain = costs.time("allreduce", "ring", 2, n, q)
    spilt = costs.time("allreduce", "ring", 2, n, q, Setting(cache=64 << 20))
    moved = n + n / 2
    assert spilt - plain == pytest.approx(moved * 0.02)
    assert costs.time("allreduce", "ring", 2, n, q, Setting(cache=128 << 20)) == plain


def test_hierarchical_by_hand():
    inter = Params(10.0, 0.1, 0.001)
    s = Setting(ranks_per_node=4, inter=inter, leaders_algorithm="ring")
    auto = Setting(ranks_per_node=4, inter=inter)       # rhd below 1 MiB: 2 nodes = ring's terms
    assert costs.time("allreduce", "hierarchical", 8, N, P, auto) == \
        costs.time("allreduce", "hierarchical", 8, N, P, s)
    # 8 ranks, 4 per node: intra copy-in+reduce (4 α, n β, .75 n γ) and fan-out (2 α, n β);
    # leaders' ring on 2 nodes: 2 α', n β', n/2 γ'
    expected = (4 + 10 + 0.75) + (2 + 10) + (20 + 100 + 0.5)
    assert costs.time("allreduce", "hierarchical", 8, N, P, s) == pytest.approx(expected)
    # one node: no inter-node part
    one = costs.time("allreduce", "hierarchical", 4, N, P, s)
    assert one == pytest.approx((4 + 10 + 0.75) + (2 + 10))


def test_ps_step_is_broadcast_plus_gather():
    s = Setting(library="Open MPI")
    # Open MPI at 3 ranks, 1 MiB: binary broadcast (2 posts; its sends in turn, the second
    # child's a hop after the first's with no cache to hide it), linear_sync gather (its
    # root's own n copied in turn with the messages)
    n = 1 << 20
    expected = P.time(Schedule(2, 2 * n)) + P.time(Schedule(4, 3 * n))
    assert costs.time("ps", "library", 3, n, P, s) == pytest.approx(expected)
    assert costs.time("ps", "binomial+linear", 3, n, P) == pytest.approx(
        P.time(Schedule(2, 2 * n)) + P.time(Schedule(2, 2 * n)))
    with pytest.raises(UsageError):
        costs.time("ps", "binomial", 3, n, P)
    with pytest.raises(UsageError, match="a PS step needs a server and a worker"):   # it was 0 s
        costs.time("ps", "library", 1, n, P, s)


@pytest.mark.parametrize("lib, coll, p, n, alg", [
    ("Open MPI", "allreduce", 2, 4, "ring"),
    ("Open MPI", "allreduce", 2, 100, "recursive_doubling"),
    ("Open MPI", "allreduce", 3, 100_000, "ring"),               # segmented_ring
    ("Open MPI", "allreduce", 3, 1 << 20, "rhd"),
    ("Open MPI", "allreduce", 4, 4096, "recursive_doubling"),
    ("Open MPI", "allreduce", 4, 1 << 20, "rhd"),
    ("Open MPI", "allreduce", 200, 1000, "nonoverlapping"),
    ("Open MPI 5.0.11", "broadcast", 3, 1 << 20, "binary"),
    ("Open MPI", "broadcast", 4, 1 << 20, "chain"),
    ("Open MPI", "broadcast", 4, 65536, "linear"),
    ("Open MPI", "broadcast", 2, 16, "chain"),                   # pipeline, unsegmented
    ("Open MPI", "broadcast", 100, 1 << 20, "knomial"),
    ("Open MPI", "gather", 3, 65536, "binomial"),
    ("Open MPI", "gather", 4, 1 << 20, "linear_sync"),
    ("Open MPI", "gather", 4, 4096, "linear"),
    ("MPICH", "allreduce", 4, 8, "recursive_doubling"),
    ("MPICH", "allreduce", 4, 1 << 20, "rhd"),
    ("MPICH", "allreduce", 8, 16, "recursive_doubling"),          # count 4 < pof2 8
    ("mpich", "broadcast", 4, 1 << 20, "binomial"),
    ("MPICH", "broadcast", 8, 100_000, "scatter_rd_allgather"),
    ("MPICH", "broadcast", 9, 100_000, "scatter_ring_allgather"),
    ("MPICH", "broadcast", 8, 1 << 20, "scatter_ring_allgather"),
    ("MPICH", "gather", 64, 1 << 20, "binomial"),
    ("gloo", "allreduce", 4, 1 << 20, "ring"),
    ("gloo", "broadcast", 4, 1 << 20, "binomial"),
    ("gloo", "gather", 4, 1 << 20, "linear"),
])
def test_library_defaults(lib, coll, p, n, alg):
    assert library.choose(lib, coll, p, n)[0] == alg
    assert (alg, None) != (None, costs.COSTS.get((coll, alg)))   # every choice has a cost


@pytest.mark.parametrize("lib, coll, p, n, alg", [
    ("MPICH", "allreduce", 16, 8, "release_gather"),
    ("MPICH", "allreduce", 16, 1 << 28, "release_gather"),
    ("MPICH", "broadcast", 4, 1 << 28, "release_gather"),
    ("MPICH", "broadcast", 12, 8192, "release_gather"),
    ("MPICH", "broadcast", 12, 100_000, "scatter_ring_allgather"),
    ("MPICH", "broadcast", 16, 100_000, "release_gather"),
    ("MPICH", "broadcast", 16, 1 << 20, "scatter_ring_allgather"),
    ("MPICH", "gather", 16, 1 << 20, "binomial"),
    ("MPICH", "allreduce", 1, 1 << 20, "rhd"),
    ("Open MPI", "allreduce", 4, 1 << 20, "rhd"),            # Open MPI's rules: the same
])
def test_one_node_defaults(lib, coll, p, n, alg):
    """On one node MPICH's ch4 runs its shared-memory release_gather where it takes the
    call (maint/tuning/coll/ch4/generic.json); elsewhere its point-to-point rules hold."""
    assert library.choose(lib, coll, p, n, one_node=True)[0] == alg
    assert costs.COSTS.get((coll, alg)) is not None


def test_one_node_comes_from_the_setting():
    """MPICH's one-node choice where the setting puts every rank on one node (ranks per
    node, else cores); where it says nothing, its point-to-point rules."""
    one = costs.resolve("allreduce", "library", 8, 1 << 20, Setting(library="MPICH", cores=16))
    two = costs.resolve("allreduce", "library", 32, 1 << 20, Setting(library="MPICH", cores=16))
    unknown = costs.resolve("allreduce", "library", 8, 1 << 20, Setting(library="MPICH"))
    packed = costs.resolve("allreduce", "library", 4, 1 << 20,
                           Setting(library="MPICH", ranks_per_node=4, cores=2))
    assert (one[0], two[0], unknown[0], packed[0]) == ("release_gather", "rhd", "rhd",
                                                       "release_gather")


def test_release_gather_terms():
    """Pipelined in 8 KiB cells: the trees' depths, then a wait per further cell; the root
    reduces min(p-1, k) inputs (k = 4 up to 2 KiB, else 2) and copies twice per byte."""
    assert costs.allreduce_release_gather(1, 1000) == Schedule(0, 1000.0, 0.0)
    assert costs.allreduce_release_gather(2, 1024) == Schedule(1 + 1, 2048.0, 1024.0)
    # 16 ranks: a binary tree of depth 4 up, one level of the radix-64 release down
    assert costs.allreduce_release_gather(16, 1 << 20) == Schedule(4 + 1 + 127, 2.0 * (1 << 20),
                                                                   2.0 * (1 << 20))
    assert costs.allreduce_release_gather(16, 2048).rounds == 2 + 1        # radix 4: depth 2
    assert costs.bcast_release_gather(16, 1 << 20) == Schedule(1 + 127, float(1 << 20), 0.0)
    assert costs.bcast_release_gather(1, 1 << 20) == Schedule(0, 0.0, 0.0)
    assert [costs._kary_depth(p, 2) for p in (1, 2, 3, 4, 7, 8, 15, 16)] == [0, 1, 1, 2, 2, 3, 3, 4]


def test_release_gather_waits_as_a_poller():
    """MPICH's release_gather spins on its flags: oversubscribed, a cell waits a turn of the
    scheduler however many share a core ("spin"), its point-to-point algorithms "sleep"."""
    assert library.waiting("MPICH 5.0.2", "release_gather") == "spin"
    assert library.waiting("MPICH", "rhd") == library.waiting("MPICH") == "sleep"
    assert library.waiting("Open MPI", "release_gather") == "yield"
    assert node.oversubscription(3, 2, "spin") == node.oversubscription(4, 2, "spin") == 1.0


def test_spinning_waiters_share_the_busiest_core():
    """Spinning ranks keep their turn on the core, working or not: 3 ranks on 2 cores run as
    4 do (the core with two sets the pace); an even share would be 1.5 ranks a core."""
    mpich = "MPICH 5.0.2"
    for p in (3, 4):
        assert costs.share("allreduce", "release_gather", p, p, 2, mpich) == 2.0
    assert costs.share("allreduce", "release_gather", 5, 5, 2, mpich) == 3.0
    assert costs.share("allreduce", "release_gather", 2, 2, 2, mpich) == 1.0
    assert costs.share("allreduce", "ring", 3, 3, 2, "gloo") == 1.5       # sleepers: even


def test_library_errors():
    with pytest.raises(UsageError, match="library"):
        library.choose(None, "allreduce", 4, 8)
    with pytest.raises(UsageError, match="no default-algorithm rules"):
        library.choose("Intel MPI", "allreduce", 4, 8)
    with pytest.raises(UsageError, match="alltoall"):
        library.choose("Open MPI", "alltoall", 4, 8)


def test_errors():
    with pytest.raises(UsageError, match="choose from"):
        costs.terms("allreduce", "nosuch", 4, 8)
    with pytest.raises(UsageError, match="collective"):
        costs.terms("alltoall", "ring", 4, 8)
    with pytest.raises(UsageError):
        costs.terms("allreduce", "ring", 0, 8)
    with pytest.raises(UsageError):
        costs.terms("allreduce", "ring", 4, -1)
    with pytest.raises(UsageError, match="alpha"):
        Params(-1.0, 0.0)
    with pytest.raises(UsageError, match="beta"):
        Params(1.0, float("nan"))


def test_allreduce_time_partial_and_params_round_trip():
    comm = functools.partial(costs.allreduce_time, P, "ring", 4)
    assert comm(N) == pytest.approx(21.75)
    assert Params.from_dict(P.to_dict()) == P


def test_million_ranks_fast():
    start = time.perf_counter()
    for coll, alg in [("allreduce", "ring"), ("allreduce", "rhd"), ("allreduce", "library"),
                      ("broadcast", "binary"), ("broadcast", "library"), ("gather", "library"),
                      ("allreduce", "hierarchical"), ("ps", "library")]:
        for lib in ("Open MPI", "MPICH", "gloo"):
            t = costs.time(coll, alg, 1_000_000, 1 << 30, P,
                           Setting(library=lib, ranks_per_node=8))
            assert t > 0
    assert time.perf_counter() - start < 1.0


def test_contention_from_the_copy_bandwidth_by_copies():
    bw = ((1, 10.0), (2, 20.0), (4, 24.0), (8, 24.0))
    assert node.contention(None, 8) == 1.0 and node.contention(bw, 1) == 1.0
    assert node.contention(bw, 2) == pytest.approx(1.0)           # two copies: twice the bandwidth
    assert node.contention(bw, 4) == pytest.approx(4 * 10 / 24)
    assert node.contention(bw, 3) == pytest.approx(3 * 10 / 22)   # between 2 and 4: linear
    assert node.contention(bw, 16) == pytest.approx(16 * 10 / 24)  # past the last: flat
    assert node.contention(((1, 10.0), (2, 25.0)), 2) == 1.0      # never below 1
    assert node.contention(((2, 20.0),), 2) == 1.0                # no single-copy figure
    # a probe's noise: 2 copies measured slower each than 4; each copy's share is taken as
    # never more with more copies, so 2 cost what 4 did (the 16-core node: 13.0, 30.6 GB/s)
    noisy = ((1, 7.85), (2, 13.0), (4, 30.6), (16, 55.8))
    assert node.contention(noisy, 2) == pytest.approx(7.85 / 7.65)
    assert node.contention(noisy, 4) == pytest.approx(7.85 / 7.65)
    assert node.contention(noisy, 16) == pytest.approx(16 * 7.85 / 55.8)
    assert node.bandwidth_of({"by_copiers": {"2": 20, "1": 10}}) == ((1, 10.0), (2, 20.0))
    assert node.bandwidth_of(None) is None and node.bandwidth_of({"error": "x"}) is None


def test_contention_slows_every_byte_of_the_copies_at_once():
    q = Params(1.0, 0.01, 0.001, beta_spill=0.02)
    s = Schedule(2, 100.0, 50.0)
    assert q.time(s, Load(spill=0.5, contention=1.0)) == q.time(s, Load(spill=0.5))
    # at 3x: the cache half at 3β, the memory half at 3(β + β_spill)
    want = 2 + (0.5 * 3 * 100 * 0.01 + 0.5 * 3 * 100 * (0.01 + 0.02)) \
        + (0.5 * 3 * 50 * 0.001 + 0.5 * 3 * 50 * (0.001 + 0.02))
    assert q.time(s, Load(spill=0.5, contention=3.0)) == pytest.approx(want)
    # all in the cache: still 3x (on the 16-core node in-cache all-reduces slowed with the ranks)
    assert q.time(s, Load(spill=0.0, contention=3.0)) == pytest.approx(2 + 3 * (100 * 0.01 + 50 * 0.001))
    # through node_load: a ring's 8 ranks all copy (8 copies at once); a linear gather's root alone
    bw = ((1, 10.0), (8, 40.0))
    setting = Setting(cores=16, cache=1 << 20, bandwidth=bw)
    assert costs.node_load("allreduce", "ring", 8, 64 << 20, 8, setting).contention == pytest.approx(2.0)
    assert costs.node_load("gather", "linear", 8, 64 << 20, 8, setting).contention == 1.0
    # copies beyond the cores: as many at once as there are cores
    assert costs.node_load("allreduce", "ring", 8, 64 << 20, 8,
                           Setting(cores=2, cache=1 << 20, bandwidth=bw)).contention == \
        pytest.approx(node.contention(bw, 2))


def test_the_leaders_of_a_hierarchical_all_reduce_are_not_one_node():
    """The leaders' all-reduce crosses nodes: MPICH's point-to-point choice, not its
    one-node release_gather, whatever the ranks per node."""
    q = Params(1e-6, 1e-10, 1e-10)
    setting = Setting(library="MPICH", ranks_per_node=16, cores=16, leaders_algorithm="library")
    inside = costs.hierarchical_time(16, 1 << 20, q, setting)            # one node: no leaders
    two = costs.hierarchical_time(32, 1 << 20, q, setting)
    leaders = q.time(costs.terms("allreduce", "rhd", 2, 1 << 20), Load())
    assert two == pytest.approx(inside + leaders)


@pytest.mark.parametrize("collective, algorithm", sorted(costs.ONE_NODE))
def test_one_node_algorithms_are_not_priced_across_nodes(collective, algorithm):
    """shm at 64 ranks of 2 per node was priced (with a note that they were several nodes):
    its ranks map each other's memory, so it runs on one node only."""
    q = Params(1e-6, 1e-10, 1e-10)
    one = costs.time(collective, algorithm, 8, 1 << 20, q, Setting(ranks_per_node=8, cores=8))
    assert one > 0
    with pytest.raises(UsageError, match=f"{algorithm} runs on one node"):
        costs.time(collective, algorithm, 8, 1 << 20, q, Setting(ranks_per_node=2, cores=2))
    with pytest.raises(UsageError, match="span several"):
        costs.time(collective, algorithm, 8, 1 << 20, q, Setting(cores=2))


def test_the_trees_children_in_the_order_of_their_sends():
    assert costs.star_children(4) == [[1, 2, 3], [], [], []]
    assert costs.binary_children(5) == [[1, 2], [3, 4], [], [], []]
    assert costs.binomial_children(8) == [[1, 2, 4], [3, 5], [6], [7], [], [], [], []]
    assert costs.knomial_children(6) == [[4, 3, 2, 1], [], [], [], [5], []]    # radix 4: 5 = "11"
    # every rank but the root has one parent
    for tree in costs.TREE_CHILDREN.values():
        for p in (1, 2, 5, 16, 33):
            kids = sorted(c for cs in tree(p) for c in cs)
            assert kids == list(range(1, p)), (tree, p)


def test_sends_in_turn_cost_a_hop_each_unless_the_buffer_is_in_memory():
    """Open MPI's parent sends to its children one after another (16-core node): its
    linear broadcast of a buffer in the cache takes p-1 hops, of one in memory one."""
    n = 1 << 20
    assert costs.hops_in_turn(costs.star_children(8), 1.0) == 7
    assert costs.hops_in_turn(costs.star_children(8), 0.0) == 1
    assert costs.hops_in_turn(costs.binomial_children(8), 1.0) == 3   # 0->1->3->7, 0->2->6, 0->4: 1+2
    assert costs.sends_in_turn("broadcast", "linear", 8, 0.0) == 7
    assert costs.sends_in_turn("broadcast", "linear", 8, 1.0) == 1
    assert costs.sends_in_turn("broadcast", "chain", 8, 0.0) is None         # one child each
    assert costs.sends_in_turn("gather", "linear", 8, 0.0) is None
    one_node = Setting(library="Open MPI", ranks_per_node=8, cores=16)
    terms, _ = costs.priced("broadcast", "linear", 8, n, {}, 8, one_node)
    assert terms == Schedule(7, 7 * n)
    # across nodes, and in other libraries, the tree's own terms
    assert costs.priced("broadcast", "linear", 8, n, {}, 4, one_node)[0] == costs.terms("broadcast", "linear", 8, n)
    assert costs.priced("broadcast", "linear", 8, n, {}, 8, Setting(library="gloo"))[0] == \
        costs.terms("broadcast", "linear", 8, n)


def test_mpich_point_to_point_bytes_count_twice_beside_its_shared_memory_collectives():
    n = 1 << 24
    s = Setting(library="MPICH")
    p2p = costs.terms("broadcast", "scatter_ring_allgather", 8, n)
    assert costs.priced("broadcast", "scatter_ring_allgather", 8, n, {}, 8, s)[0] == \
        Schedule(p2p.rounds, 2 * p2p.bytes, p2p.reduced_bytes)
    shm = costs.terms("broadcast", "release_gather", 8, n)
    assert costs.priced("broadcast", "release_gather", 8, n, {}, 8, s)[0] == shm
    assert library.p2p_copies("MPICH 5.0.2") == 2.0 and library.p2p_copies("Open MPI") == 1.0


def test_a_binomial_gathers_contention_is_that_along_its_critical_path():
    """Its root takes n, 2n, 4n, 8n while 8, 4, 2, 1 pairs copy at once (16 ranks)."""
    assert costs.ROUNDS_OF_COPIES["gather", "binomial"](16) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert costs.ROUNDS_OF_COPIES["gather", "binomial"](12) == [(1, 6), (2, 3), (4, 1), (4, 1)]
    assert costs.ROUNDS_OF_COPIES["gather", "binomial"](2) == [(1, 1)]
    bw = ((1, 10.0), (2, 20.0), (4, 20.0), (8, 20.0))
    setting = Setting(cores=16, bandwidth=bw)
    c = node.contention
    want = (1 * c(bw, 8) + 2 * c(bw, 4) + 4 * c(bw, 2) + 8 * 1.0) / 15
    assert costs.path_contention("gather", "binomial", 16, 16, setting) == pytest.approx(want)
    assert costs.node_load("gather", "binomial", 16, 1 << 20, 16, setting).contention == pytest.approx(want)
    # the other algorithms: their busy ranks throughout
    assert costs.path_contention("allreduce", "ring", 8, 8, setting) == pytest.approx(c(bw, 8))


def test_a_librarys_temporaries_of_32_mib_and_more_fault_in_at_every_call():
    mib = 1 << 20
    # Open MPI's binomial gather: p·n at each inner rank, the root's largest child fills s·n
    assert library.fresh_bytes("Open MPI 5.0.11", "gather", "binomial", 8, 4 * mib) == 4 * 4 * mib
    assert library.fresh_bytes("Open MPI", "gather", "binomial", 8, 2 * mib) == 0.0   # 16 MiB: reused
    assert library.fresh_bytes("Open MPI", "gather", "binomial", 12, 4 * mib) == 4 * 4 * mib
    # its rabenseifner all-reduce: a temporary of n, half of it received into
    assert library.fresh_bytes("Open MPI", "allreduce", "rhd", 4, 64 * mib) == 32 * mib
    assert library.fresh_bytes("Open MPI", "allreduce", "rhd", 4, 16 * mib) == 0.0
    # MPICH's binomial gather: (s-1)·n at a rank of subtree s
    assert library.fresh_bytes("MPICH", "gather", "binomial", 16, 4 * mib) == 0.0       # 28 MiB
    assert library.fresh_bytes("MPICH", "gather", "binomial", 16, 16 * mib) == 7 * 16 * mib
    # Gloo's gather through torch: the root's flat temporary of p·n
    assert library.fresh_bytes("gloo", "gather", "linear", 16, 64 * mib) == 16 * 64 * mib
    assert library.fresh_bytes("gloo", "broadcast", "binomial", 16, 64 * mib) == 0.0
    # only the library's own call: ddlcomm's rhd over Open MPI allocates no such temporary
    s = Setting(library="Open MPI", cores=16)
    own = costs.node_load("allreduce", "rhd", 4, 64 * mib, 4, s)
    lib = costs.node_load("allreduce", "rhd", 4, 64 * mib, 4, s, library_call=True)
    assert own.fresh == 0.0 and lib.fresh == 32 * mib
    q = Params(0.0, 0.0, beta_fault=1e-9)
    assert q.time(Schedule(0, 0.0), lib) == pytest.approx(32 * mib * 1e-9)
    assert costs.time("allreduce", "library", 4, 64 * mib, q, s) == pytest.approx(32 * mib * 1e-9)


def test_open_mpi_sends_in_turn_and_mpich_does_not():
    # per library, whatever the machine's single copy (CMA): the 16-core node's Open MPI
    # selected it and its broadcasts still fit as sends in turn
    n = 1 << 20
    assert library.sends_in_turn("Open MPI") and library.sends_in_turn("open mpi")
    assert not library.sends_in_turn("MPICH") and not library.sends_in_turn("Gloo")
    assert not library.sends_in_turn(None)
    tree = costs.terms("broadcast", "linear", 8, n)
    assert tree == Schedule(7, n)                                   # all children at once
    ompi = Setting(library="Open MPI", ranks_per_node=8, cores=16)
    assert costs.priced("broadcast", "linear", 8, n, {}, 8, ompi)[0] == Schedule(7, 7 * n)
    mpich = Setting(library="MPICH", ranks_per_node=8, cores=16)    # at once, each byte twice
    assert costs.priced("broadcast", "linear", 8, n, {}, 8, mpich)[0] == Schedule(7, 2 * n)


def test_open_mpis_messages_of_its_eager_limit_and_more_go_by_rendezvous():
    """One handshake per message on the critical path: a chain's hops and a linear gather's
    messages one after another, a tree's posts to one level's children overlapping (one a
    level), a ring's blocks of n/p; none below the limit, in MPICH or Gloo, in the one-node
    shared-memory algorithms, or across nodes."""
    eager = library.eager_limit("Open MPI 5.0.11")
    assert eager == 4096 and library.eager_limit("MPICH") == library.eager_limit(None) == float("inf")

    def rndv(coll, alg, p, n, lib="Open MPI"):
        return costs.rendezvous_rounds(coll, alg, p, n, costs.terms(coll, alg, p, n), lib)
    assert rndv("gather", "linear", 8, eager) == 7 and rndv("gather", "linear", 8, eager - 1) == 0
    assert rndv("broadcast", "chain", 8, 1 << 20) == 7
    assert rndv("broadcast", "linear", 8, 1 << 20) == 1             # 7 posts, one level
    assert rndv("broadcast", "binary", 8, 1 << 20) == 3
    assert rndv("gather", "binomial", 8, 1 << 20) == 3              # n, 2n, 4n into the root
    assert rndv("allreduce", "recursive_doubling", 8, 8192) == 3
    assert rndv("allreduce", "ring", 8, 16 << 10) == 0              # blocks of 2 KiB
    assert rndv("allreduce", "ring", 8, 32 << 10) == 14             # of 4 KiB: 2(p-1) steps
    assert rndv("allreduce", "rhd", 8, 16 << 10) == 4               # 8, 4 KiB (2 KiB not), twice
    assert rndv("allreduce", "rhd", 6, 16 << 10) == 2 + 4           # the fold of 16 KiB, 8 and 4 KiB twice
    assert rndv("broadcast", "scatter_ring_allgather", 8, 32 << 10) == 3 + 7   # 16, 8, 4 KiB; 7 of 4
    assert rndv("gather", "linear", 8, 1 << 20, "MPICH") == rndv("gather", "linear", 8, 1 << 20, "gloo") == 0
    assert rndv("allreduce", "release_gather", 8, 1 << 20) == 0
    q = Params(0.0, 0.0, alpha_rndv=2e-6)
    one = Setting(library="Open MPI", ranks_per_node=8, cores=16)
    assert costs.time("gather", "linear", 8, 1 << 20, q, one) == pytest.approx(7 * 2e-6)
    spread = Setting(library="Open MPI", ranks_per_node=4, cores=16)
    assert costs.time("gather", "linear", 8, 1 << 20, q, spread) == 0.0


def test_gloos_gather_through_torch_copies_its_flat_temporary_out():
    """torch's ProcessGroupGloo gathers into a flat temporary of p·n at the root, then copies
    it into the per-rank outputs: p·n more bytes on the library's call, and the temporary's
    pages fault in afresh from 32 MiB; not in ddlcomm's own gathers.  Open MPI's linear
    gathers copy the root's own n in turn with the messages; its binomial one and MPICH's
    copy it while others move bytes."""
    mib = 1 << 20
    assert library.local_copies("gloo", "gather", "linear", 4) == 4.0
    assert library.local_copies("Open MPI", "gather", "linear", 4) == 1.0
    assert library.local_copies("Open MPI", "gather", "linear_sync", 4) == 1.0
    assert library.local_copies("Open MPI", "gather", "binomial", 4) == 0.0
    assert library.local_copies("MPICH", "gather", "binomial", 4) == 0.0
    assert library.local_copies("gloo", "allreduce", "ring", 4) == 0.0
    s = Setting(library="gloo", cores=16)
    lib = costs.priced("gather", "linear", 4, 8 * mib, {}, 4, s, library_call=True)
    own = costs.priced("gather", "linear", 4, 8 * mib, {}, 4, s)
    assert lib[0].bytes == own[0].bytes + 4 * 8 * mib == 7 * 8 * mib
    assert lib[1].fresh == 32 * mib and own[1].fresh == 0.0
    assert costs.priced("gather", "linear", 4, 4 * mib, {}, 4, s, library_call=True)[1].fresh == 0.0
    across = costs.priced("gather", "linear", 4, 8 * mib, {}, 2, s, library_call=True)
    assert across[0].bytes == 7 * 8 * mib                          # the root's copy on any node


def test_both_ranks_of_an_mpich_pair_need_a_core():
    """MPICH's sender copies into its cells while the receiver copies out: a binomial
    gather's two pairs at 4 ranks keep all 4 busy on 2 cores; Open MPI's receiver copies
    alone; MPICH's one-node release_gather is not point-to-point."""
    assert costs.share("gather", "binomial", 4, 4, 2, "MPICH") == 2.0
    assert costs.share("gather", "binomial", 4, 4, 2, "Open MPI") == costs.share("gather", "binomial", 4, 4, 2) == 1.0
    assert costs.share("gather", "binomial", 3, 3, 2, "MPICH") == 1.0        # one pair
    assert costs.share("allreduce", "ring", 4, 4, 2, "MPICH") == 2.0         # at most p busy
    assert costs.share("broadcast", "release_gather", 4, 4, 2, "MPICH") == 2.0
    assert costs.copies_per_byte("broadcast", "release_gather", "MPICH") == 1.0


def test_the_small_pages_of_a_buffer_by_the_nodes_thp_mode_and_its_allocator():
    """NumPy's arrays have huge pages from 4 MiB where THP is madvise or always, all but a
    huge page's worth where glibc maps them afresh (32 MiB); the C library's temporaries only
    under always; ddlcomm's hugepage kind none small, pageable and shared all; nothing is
    priced where the mode is not known, unless the memory kind fixes the pages."""
    mib = 1 << 20
    part = node.small_page_part
    assert part(mib, None) == part(64 * mib, None) == 0.0
    assert part(64 * mib, None, "pageable") == 1.0 and part(mib, None, "hugepage") == 0.0   # the kind says
    assert part(mib, "madvise") == part(4 * mib - 1, "madvise", "numpy") == 1.0
    assert part(4 * mib, "madvise") == part(16 * mib, "madvise") == 0.0
    assert part(64 * mib, "madvise") == pytest.approx(2 / 64)
    assert part(16 * mib, "madvise", temporary=True) == part(16 * mib, "never") == 1.0
    assert part(2 * mib, "always") == part(2 * mib, "always", temporary=True) == 0.0
    assert part(mib, "always") == 1.0
    assert part(mib, "madvise", "hugepage") == 0.0
    assert part(64 * mib, "madvise", "pageable") == part(64 * mib, "always", "shared") == 1.0
    assert part(16 * mib, "madvise", "numa:0") == 1.0               # an mmap NumPy did not advise
    # what a point measured decides for the benchmark's buffers, not for the library's own
    assert part(4 * mib, "madvise", huge_share=0.5) == part(mib, None, huge_share=0.5) == 0.5
    assert part(4 * mib, "madvise", temporary=True, huge_share=1.0) == 1.0


def test_a_single_copy_pins_the_senders_small_pages():
    """Open MPI's rendezvous messages and MPICH's point-to-point ones from 8 KiB are read in
    one copy, which pins the sender's small pages: a chain's hops, a ring's blocks, a
    binomial gather's subtrees from the library's malloc'd temporary; none in the one-node
    shared-memory algorithms, in Gloo, below the threshold, across nodes, or where the THP
    mode is not known."""
    mib = 1 << 20
    assert library.single_copy_from("Open MPI 5.0.11") == library.eager_limit("Open MPI") == 4096
    assert library.single_copy_from("MPICH") == 8192 and library.single_copy_from("gloo") == float("inf")
    ompi = Setting(library="Open MPI", thp="madvise")

    def pages(coll, alg, p, n, setting=ompi, library_call=True):
        return costs.pinned_pages(coll, alg, p, n, costs.terms(coll, alg, p, n), setting, library_call)
    assert pages("broadcast", "chain", 8, mib) == 7 * 256
    assert pages("broadcast", "chain", 8, 8 * mib) == 0.0            # NumPy's huge pages
    assert pages("broadcast", "chain", 8, 64 * mib) == pytest.approx(7 * 64 * mib * (2 / 64) / 4096)
    assert pages("allreduce", "ring", 8, 32 << 10) == 14              # blocks of one page
    assert pages("allreduce", "ring", 8, 16 << 10) == 0.0             # of 2 KiB: eager
    assert pages("broadcast", "chain", 8, 2048) == 0.0
    mpich = Setting(library="MPICH", thp="madvise")
    assert pages("gather", "binomial", 2, mib, mpich) == 256
    big = costs.terms("gather", "binomial", 8, 8 * mib).bytes         # from the inner ranks' temporaries
    assert pages("gather", "binomial", 8, 8 * mib, mpich) == big / 4096
    assert pages("gather", "binomial", 8, 8 * mib, mpich, library_call=False) == 0.0   # ddlcomm's own: NumPy's
    assert pages("broadcast", "release_gather", 8, mib, mpich) == 0.0
    assert pages("gather", "linear", 4, mib, Setting(library="gloo", thp="madvise")) == 0.0
    assert pages("broadcast", "chain", 8, mib, Setting(library="Open MPI")) == 0.0
    q = Params(0.0, 0.0, alpha_page=1e-7)
    one = Setting(library="Open MPI", ranks_per_node=8, cores=16, thp="madvise")
    assert costs.time("broadcast", "chain", 8, mib, q, one) == pytest.approx(7 * 256 * 1e-7)
    spread = Setting(library="Open MPI", ranks_per_node=4, cores=16, thp="madvise")
    assert costs.time("broadcast", "chain", 8, mib, q, spread) == 0.0


@pytest.mark.parametrize("name", ["Open MPI 5.0.11", "openmpi", "open-mpi", "OpenMPI"])
def test_a_library_is_found_in_every_table_by_any_spelling_canonical_takes(name):
    # choose() found Open MPI's algorithm by canonical(), the per-library tables missed it
    # without the space: a broadcast priced 112 µs where "Open MPI" gave 741 µs
    assert library.canonical(name) == "open mpi"
    assert library.waiting(name) == library.waiting("Open MPI")
    assert library._key(library.EAGER_LIMIT, name) == "open mpi"
