"""cache.simulate against a brute-force reference, and its sequences against the plans."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.cache.planning.simulate import (
    Accesses,
    Policy,
    block_window,
    expected_fetch,
    plan_accesses,
    run_length,
    simulate,
)
from shardfeed.shuffling import Topology, make_plan
from shardfeed.shuffling.spec import Job, PlanSpec


def reference(sizes, seq, limit, policy):
    """The obvious O(n^2) cache: a dict of cached shards, victims chosen by scanning."""
    cached, last, fetched = set(), {}, 0
    for i, x in enumerate(seq):
        if x not in cached:
            fetched += sizes[x]
            if sizes[x] > limit:
                last[x] = i
                continue
            while sum(sizes[c] for c in cached) + sizes[x] > limit:
                if policy == "lru":
                    victim = min(cached, key=lambda c: last[c])
                else:
                    def next_use(c, i=i):
                        later = [j for j in range(i + 1, len(seq)) if seq[j] == c]
                        return later[0] if later else len(seq)
                    victim = max(cached, key=lambda c: (next_use(c), -last[c]))
                cached.discard(victim)
            cached.add(x)
        last[x] = i
    return fetched


@pytest.mark.parametrize("trial", range(40))
def test_simulator_matches_brute_force_on_random_sequences(trial):
    rng = np.random.default_rng(trial)
    n_shards = int(rng.integers(1, 9))
    sizes = rng.integers(1, 6, n_shards) * (1 if trial % 2 else 100)  # equal-ish and uneven sizes
    seq = rng.integers(0, n_shards, int(rng.integers(1, 60)))
    seq = run_length(seq)[0]  # the simulator's unit is a run; the reference sees the same runs
    total = int(sizes.sum())
    for limit in (0, int(sizes.max()), total // 2, total - 1, total, total * 2):
        got = {p: int(simulate(sizes, seq, limit, p)[0]) for p in ("belady", "lru")}
        assert got["lru"] == reference(sizes, seq.tolist(), limit, "lru")
        if len(set(sizes.tolist())) == 1:
            # equal sizes: farthest-next-use is Belady's optimum, ties do not change the count
            assert got["belady"] == reference(sizes, seq.tolist(), limit, "belady")
            assert got["belady"] <= got["lru"]
        distinct = int(sizes[np.unique(seq)].sum())
        if limit >= distinct:
            assert got["belady"] == got["lru"] == distinct  # every shard fetched exactly once
        assert got["belady"] >= distinct  # compulsory misses are a floor for any policy


def test_belady_never_worse_than_lru_with_equal_sizes_over_plans():
    counts = np.full(24, 10, np.int64)
    sizes = np.full(24, 1000, np.int64)
    for order in ("shard", "block", "global"):
        acc = plan_accesses(PlanSpec(counts, order, seed=3), Job(2, (8, 8), 1), 0, (0, 1))
        for limit in (3000, 6000, 12000, 24000):
            b, lru = simulate(sizes, acc, limit, Policy.BELADY), simulate(sizes, acc, limit, Policy.LRU)
            assert b.sum() <= lru.sum(), (order, limit)


def test_full_budget_fetches_each_shard_once_then_nothing():
    counts = np.arange(1, 13, dtype=np.int64) * 5
    sizes = counts * 300
    acc = plan_accesses(PlanSpec(counts, "global", seed=1), Job(1, (7,)), 0, (0, 1, 2))
    per_epoch = simulate(sizes, acc, int(sizes.sum()), "lru")
    assert per_epoch.tolist() == [int(sizes.sum()), 0, 0]


def test_sequence_is_the_node_ranks_reads_step_by_step():
    counts = np.full(10, 6, np.int64)
    spec, job = PlanSpec(counts, "global", seed=5), Job(4, (3, 3, 3, 3), 2)
    acc = plan_accesses(spec, job, node=1, epochs=(2,))
    plans = [spec.plan(2, job, r) for r in (2, 3)]
    expect = []
    for step in range(plans[0].steps(3)):
        for p in plans:
            ids = p.positions(step * 3, min(p.num_samples, step * 3 + 3))
            expect.extend((np.searchsorted(p.offsets, ids, side="right") - 1).tolist())
    shards, runs = run_length(np.array(expect))
    assert acc.shards.tolist() == shards.tolist() and acc.samples.tolist() == runs.tolist()
    assert int(acc.samples.sum()) == sum(p.num_samples for p in plans)


def test_expected_fetch_takes_plans_or_sequences_alike():
    counts = np.full(16, 4, np.int64)
    sizes = np.full(16, 100, np.int64)
    plan = make_plan(counts, "global", seed=2, topology=Topology(0, 1))
    ids = plan.positions(0, plan.num_samples)
    shards = np.searchsorted(plan.offsets, ids, side="right") - 1
    for limit in (400, 800):
        a = expected_fetch(counts, sizes, plan, limit, "belady")
        assert a == expected_fetch(counts, sizes, shards, limit, "belady")
        assert a == expected_fetch(counts, sizes, Accesses.of(shards), limit, "belady")
    # a whole-shard cache of half the dataset under a global order fetches more than the dataset
    assert expected_fetch(counts, sizes, plan, 800, "lru") > int(sizes.sum())
    with pytest.raises(ValueError, match="counts"):
        expected_fetch(counts[:-1], sizes, plan, 800)
    with pytest.raises(ValueError, match="policy"):
        expected_fetch(counts, sizes, plan, 800, "fifo")


def test_block_window_fits_the_budget():
    sizes = np.array([100] * 10 + [300], np.int64)
    assert block_window(sizes, 1000) == 5  # margin 300 leaves 700: the largest five, 300 + 4 x 100
    assert block_window(sizes, 1000, ranks_per_node=2, margin_bytes=0) == 3  # 2 x (300+100+100)
    with pytest.raises(ValueError, match="raise the limit"):
        block_window(sizes, 500)


def test_warm_epoch_counts_only_what_the_warm_cache_lacks():
    """The thrash estimate (cache/planning/thrash.py): an epoch replayed behind the one before it
    fetches nothing when the room holds every shard, everything when it holds none, and a share
    simulated is scaled up to the epoch."""
    from shardfeed.cache.planning.thrash import warm_epoch

    sizes = np.full(8, 100, np.int64)
    reads = after = np.arange(8, dtype=np.int64)
    assert warm_epoch(reads, after, 1.0, sizes, sizes, 800) == {"node_bytes": 800, "fetched_bytes": 0,
                                                                 "fraction_simulated": 1.0}
    assert warm_epoch(reads, after, 1.0, sizes, sizes, 99)["fetched_bytes"] == 800
    half = warm_epoch(reads, after, 1.0, sizes, sizes, 400)["fetched_bytes"]
    assert 0 < half < 800
    scaled = warm_epoch(reads, after, 0.5, sizes, sizes, 400)
    assert scaled["fetched_bytes"] == 2 * half and scaled["node_bytes"] == 800  # never past the dataset
