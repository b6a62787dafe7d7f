"""Epoch plans: coverage over ranks, determinism, resume, worker split."""

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardfeed.shuffling import EpochPlan, Order, Topology, make_plan, offsets_of, shard_of

ORDERS = ["none", "shard", "block", "global"]
OPTS = dict(block_shards=3, buffer_size=5)


def all_ids(plan: EpochPlan) -> list[np.ndarray]:
    return [p.positions(0, p.num_samples) for p in plan.all_ranks()]


def check_coverage(counts, order, world, drop_last, weights=None, **opts):
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    topo = Topology(0, world, weights)
    plan = make_plan(counts, order, 11, 3, topo, drop_last=drop_last, **(opts or OPTS))
    per_rank = all_ids(plan)
    unit = topo.unit_weights
    s = sum(unit)
    sizes = [len(x) for x in per_rank]
    # Every rank the same number of rounds: shares proportional to weights.
    assert len({sz // u for sz, u in zip(sizes, unit)}) == 1 and all(sz % u == 0 for sz, u in zip(sizes, unit))
    flat = np.concatenate(per_rank)
    seen = collections.Counter(flat.tolist())
    assert set(seen) <= set(range(n))
    missing, repeats = n - len(seen), len(flat) - len(seen)
    if drop_last:
        assert repeats == 0 and missing <= s - 1 and missing == plan.dropped
    else:
        assert missing == 0 and repeats <= s - 1 and repeats == plan.padded
    return plan, per_rank


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("counts", [[5, 0, 3, 9, 1, 0, 4], [0], [0, 0], [1], [2], [7] * 13, [0, 0, 3, 0]])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_coverage_grid(order, counts, world, drop_last):
    check_coverage(counts, order, world, drop_last)
    check_coverage(counts, order, world, drop_last, weights=tuple(range(1, world + 1)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    order=st.sampled_from(ORDERS),
    world=st.integers(1, 9),
    drop_last=st.booleans(),
    weighted=st.booleans(),
    block=st.integers(1, 5),
    buf=st.integers(1, 50),
    data=st.data(),
)
def test_coverage_property(counts, order, world, drop_last, weighted, block, buf, data):
    weights = tuple(data.draw(st.lists(st.integers(1, 6), min_size=world, max_size=world))) if weighted else None
    check_coverage(counts, order, world, drop_last, weights, block_shards=block, buffer_size=buf)


def test_fewer_samples_than_ranks():
    plan, per_rank = check_coverage([1, 0, 1], "global", 5, False)
    assert plan.num_samples == 1 and plan.padded == 3
    plan, per_rank = check_coverage([1, 0, 1], "global", 5, True)
    assert plan.num_samples == 0 and plan.dropped == 2 and list(plan.chunks()) == []


def test_weighted_ranks_take_the_same_steps():
    # Dual-batch training: batch sizes 48 and 16 -> unit weights (3, 1).
    topo = Topology(0, 2, weights=(48, 16))
    plan = make_plan(np.full(10, 101), "global", 0, 0, topo)
    r0, r1 = plan.all_ranks()
    assert r0.num_samples == 3 * r1.num_samples
    assert r0.steps(48) == r1.steps(16) == -(-r1.num_samples // 16)
    assert plan.padded <= 3  # less than one round of unit weights (S - 1)


@pytest.mark.parametrize("order", ORDERS)
def test_determinism(order):
    counts = np.array([30, 0, 17, 45, 8, 60], dtype=np.int64)
    topo = Topology(1, 3)
    a = make_plan(counts, order, 5, 2, topo, **OPTS).positions(0, 50)
    assert np.array_equal(a, make_plan(counts, Order(order), 5, 2, topo, **OPTS).positions(0, 50))
    if order != "none":
        assert not np.array_equal(a, make_plan(counts, order, 6, 2, topo, **OPTS).positions(0, 50))
        assert not np.array_equal(a, make_plan(counts, order, 5, 3, topo, **OPTS).positions(0, 50))


@pytest.mark.parametrize("order", ORDERS)
def test_chunks_resume_and_random_access(order):
    counts = np.array([300, 0, 170, 450, 80, 600], dtype=np.int64)
    plan = make_plan(counts, order, 1, 0, Topology(2, 3), **OPTS)
    full = np.concatenate(list(plan.chunks(chunk=64)))
    assert len(full) == plan.num_samples
    for start in (0, 1, 63, 64, 200, plan.num_samples - 1, plan.num_samples):
        fresh = make_plan(counts, order, 1, 0, Topology(2, 3), **OPTS)
        rest = list(fresh.chunks(start_pos=start, chunk=50))
        assert np.array_equal(np.concatenate(rest) if rest else full[:0], full[start:])
    for a, b in [(500, 520), (3, 9), (0, 1)]:
        assert np.array_equal(plan.positions(a, b), full[a:b])
    assert plan[7] == full[7]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_worker_split_independent_of_worker_count(order, batch_size):
    counts = np.array([50, 0, 33, 71, 12], dtype=np.int64)
    plan = make_plan(counts, order, 4, 1, Topology(1, 2), **OPTS)
    reference = [ids for _, ids in plan.batches(batch_size)]
    assert np.array_equal(np.concatenate(reference), plan.positions(0, plan.num_samples))
    for workers in (1, 2, 3, 5):
        merged = {}
        for w in range(workers):
            fresh = make_plan(counts, order, 4, 1, Topology(1, 2), **OPTS)  # a worker has its own copy
            for b, ids in fresh.worker_slice(w, workers, batch_size):
                assert b % workers == w and b not in merged
                merged[b] = ids
        assert sorted(merged) == list(range(len(reference)))
        assert all(np.array_equal(merged[b], reference[b]) for b in merged)
    # Resuming at a batch boundary keeps each worker's batches.
    tail = [b for b, _ in plan.worker_slice(1, 3, batch_size, start_batch=4)]
    assert tail == [b for b in range(4, len(reference)) if b % 3 == 1]


def test_block_residency_is_bounded_by_the_window():
    counts = np.full(64, 100, dtype=np.int64)
    for world in (1, 4):
        plan = make_plan(counts, "block", 0, 0, Topology(0, world), block_shards=4)
        for p in plan.all_ranks():
            shard, _ = p.shard_of(p.positions(0, p.num_samples))
            first = {s: i for i, s in reversed(list(enumerate(shard.tolist())))}
            last = {s: i for i, s in enumerate(shard.tolist())}
            live = np.zeros(len(shard) + 1, int)
            for s in first:
                live[first[s]] += 1
                live[last[s] + 1] -= 1
            assert np.cumsum(live).max() <= 4


def test_start_skips_shards_but_keeps_global_ids():
    counts = np.array([10, 20, 30], dtype=np.int64)
    plan = make_plan(counts, "global", 0, 0, start=1)
    ids = plan.positions(0, plan.num_samples)
    assert sorted(ids.tolist()) == list(range(10, 60))
    assert set(plan.shard_of(ids)[0].tolist()) == {1, 2}


def test_shard_of():
    counts = np.array([3, 0, 2, 0, 0, 4], dtype=np.int64)
    shard, local = shard_of(np.arange(9), counts)
    assert shard.tolist() == [0, 0, 0, 2, 2, 5, 5, 5, 5] and local.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert np.array_equal(shard_of(np.arange(9), offsets=offsets_of(counts))[0], shard)
    with pytest.raises(IndexError, match="sample id 9 out of range"):
        shard_of([9], counts)


def test_order_accepts_strings():
    assert Order("global") is Order.GLOBAL and Order("Block") is Order.BLOCK
    with pytest.raises(ValueError, match="unknown shuffle order 'random'.*'global'"):
        Order("random")


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=3, world_size=3), "rank=3 out of range"),
    (dict(world_size=0), "world_size=0"),
    (dict(world_size=2, weights=(1,)), "weights has 1 entries"),
    (dict(world_size=2, weights=(1, 0)), r"weights\[1\]=0"),
    (dict(world_size=2, ranks_per_node=3), "ranks_per_node=3"),
])
def test_topology_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Topology(**kwargs)


def test_plan_input_errors():
    with pytest.raises(ValueError, match=r"counts\[1\] = -2"):
        make_plan(np.array([3, -2]), "none")
    with pytest.raises(ValueError, match="block_shards=0"):
        make_plan(np.array([3]), "block", block_shards=0)
    with pytest.raises(ValueError, match="needs order='global'"):
        make_plan(np.array([3]), "block", locality=True, batch_size=4)
    with pytest.raises(ValueError, match="needs batch_size"):
        make_plan(np.array([3]), "global", locality=True)
    plan = make_plan(np.array([3, 4]), "global", topology=Topology(0, 2))
    with pytest.raises(IndexError, match=r"positions \[0, 5\) outside this rank's 0..4"):
        plan.positions(0, 5)


@pytest.mark.parametrize("weights", [None, (2, 1, 3)])
def test_global_is_the_permutation_dealt_round_robin(weights):
    """The fused jitted deal must agree with the arithmetic in partition.py."""
    from shardfeed.shuffling import Permutation, epoch_key

    counts = np.array([40, 0, 33, 51], dtype=np.int64)
    n = int(counts.sum())
    perm = Permutation(n, epoch_key(9, 4))
    topo = Topology(0, 3, weights)
    unit, s = topo.unit_weights, sum(topo.unit_weights)
    for plan in make_plan(counts, "global", 9, 4, topo).all_ranks():
        r = plan.topology.rank
        p = np.arange(plan.num_samples)
        v = (p // unit[r]) * s + sum(unit[:r]) + p % unit[r]
        assert np.array_equal(plan.positions(0, plan.num_samples), perm.take(v % n))
        assert np.array_equal(plan.positions(5, 17), perm.take(v[5:17] % n))
