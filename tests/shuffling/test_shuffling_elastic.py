"""Elastic re-plan: consumed prefixes + the new plan cover the epoch exactly."""

import collections

import numpy as np
import pytest

from shardfeed.shuffling import Topology, make_plan, replan

ORDERS = ["none", "shard", "block", "global"]
OPTS = dict(block_shards=3, buffer_size=4)


def consumed_ids(plan, consumed):
    return np.concatenate([p.positions(0, c) for p, c in zip(plan.all_ranks(), consumed)])


def check(plan, consumed, new_topology, drop_last=None, **kw):
    n = plan.total_samples
    done = consumed_ids(plan, consumed)
    new = plan.replan(consumed, new_topology, drop_last=drop_last, **kw)
    rest = np.concatenate([p.positions(0, p.num_samples) for p in new.all_ranks()])
    # The new plan covers exactly what was not consumed (before its own padding).
    assert new.total_samples == n - len(set(done.tolist()))
    seen = collections.Counter(np.concatenate([done, rest]).tolist())
    s_new = sum(new_topology.unit_weights)
    if new.drop_last:
        assert n - len(seen) == new.dropped <= s_new - 1
    else:
        assert len(seen) == n
    # Repeats: the old plan's padding already consumed, plus the new padding.
    repeats = len(done) + len(rest) - len(seen)
    assert repeats <= (sum(plan.topology.unit_weights) - 1) + (s_new - 1)
    return new


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("counts", [[5, 0, 3, 9, 1] * 7, [13] * 11, [2]])
@pytest.mark.parametrize("worlds", [(1, 3), (4, 2), (3, 5), (8, 1)])
@pytest.mark.parametrize("drops", [(False, False), (True, False), (False, True)])
def test_replan_after_steps(order, counts, worlds, drops):
    old = Topology(0, worlds[0])
    plan = make_plan(np.array(counts), order, 5, 2, old, drop_last=drops[0], **OPTS)
    for steps in (0, 1, 2, 5, 10_000):
        consumed = [min(steps * 3, plan.num_samples)] * worlds[0]
        check(plan, consumed, Topology(0, worlds[1]), drop_last=drops[1])


@pytest.mark.parametrize("order", ORDERS)
def test_replan_weighted_and_uneven(order):
    counts = np.array([13] * 11)
    plan = make_plan(counts, order, 1, 0, Topology(0, 3, (2, 1, 1)), **OPTS)
    check(plan, [4, 2, 2], Topology(0, 2, (3, 5)))
    # Ranks that did not step together (a crash mid-step) are still exact.
    plan = make_plan(counts, order, 1, 0, Topology(0, 4), **OPTS)
    check(plan, [7, 3, 0, 11], Topology(0, 3))
    check(plan, [p.num_samples for p in plan.all_ranks()], Topology(0, 2))


@pytest.mark.parametrize("order", ORDERS)
def test_replan_twice_and_from_plain_inputs(order):
    counts = np.array([5, 0, 3, 9, 1] * 9)
    p0 = make_plan(counts, order, 3, 1, Topology(0, 4), **OPTS)
    p1 = check(p0, [6] * 4, Topology(0, 3))
    p2 = p1.replan([4] * 3, Topology(1, 5))
    done = np.concatenate([consumed_ids(p0, [6] * 4), consumed_ids(p1, [4] * 3)])
    rest = np.concatenate([p.positions(0, p.num_samples) for p in p2.all_ranks()])
    assert set(done.tolist()) | set(rest.tolist()) == set(range(int(counts.sum())))
    again = replan(counts, order, 3, 1, 3, [4] * 3, Topology(1, 5), history=[(4, [6] * 4)], **OPTS)
    assert np.array_equal(again.positions(0, again.num_samples), p2.positions(0, p2.num_samples))
    assert p2.generation == 2 and [h[0].world_size for h in p2.history] == [4, 3]


def test_replan_with_locality():
    counts = np.array([13] * 11)
    plan = make_plan(counts, "global", 1, 0, Topology(0, 8, None, 2), locality=True, batch_size=4)
    for consumed in ([4] * 8, [8] * 4 + [4] * 4, [3, 5, 0, 17, 4, 4, 4, 4], [p.num_samples for p in plan.all_ranks()]):
        check(plan, consumed, Topology(0, 6, None, 3), batch_size=4)


def test_replan_rejects_bad_counts():
    plan = make_plan(np.array([10, 10]), "global", 0, 0, Topology(0, 2))
    with pytest.raises(ValueError, match="consumed has 3 counts but the old plan has world_size=2"):
        plan.replan([1, 1, 1], Topology(0, 1))
    with pytest.raises(ValueError, match=r"consumed\[1\]=11 out of range: old rank 1 had 0..10"):
        plan.replan([0, 11], Topology(0, 1))


@pytest.mark.parametrize("order", ORDERS)
def test_builder_round_trip(order):
    """A loader stores the job and its resizes as JSON and the one plan builder
    (shuffling.spec) rebuilds the same plan after a restart."""
    import json

    from shardfeed.shuffling.spec import Job, PlanSpec

    counts = np.array([5, 0, 3, 9, 1] * 9)
    loc = order == "global"
    kw = dict(locality=True, batch_size=2) if loc else {}
    opts = {k: v for k, v in OPTS.items() if k != "drop_last"}
    p0 = make_plan(counts, order, 3, 1, Topology(0, 4, None, 2), **kw, **opts)
    p1 = p0.replan([6] * 4, Topology(0, 3), batch_size=2 if loc else None)
    p2 = p1.replan([2] * 3, Topology(2, 5, (1, 2, 1, 1, 3)), batch_size=2 if loc else None)
    spec = PlanSpec(counts, order, 3, locality=loc, **opts)
    jobs = [Job(4, (2,) * 4, 2), Job(3, (2,) * 3), Job(5, (2, 4, 2, 2, 6))]
    saved = json.loads(json.dumps([[j.world_size, list(j.batch_sizes), j.ranks_per_node] for j in jobs]))
    jobs = [Job(w, tuple(b), rpn) for w, b, rpn in saved]
    for plan, job, history in ((p0, jobs[0], ()), (p2, jobs[2], ((jobs[0], [6] * 4), (jobs[1], [2] * 3)))):
        for rank in range(plan.topology.world_size):
            again = spec.plan(1, job, rank, history)
            ref = plan.for_rank(rank)
            assert np.array_equal(again.positions(0, again.num_samples), ref.positions(0, ref.num_samples))
