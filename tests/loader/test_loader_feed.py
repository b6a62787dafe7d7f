"""The epoch feed on its own (no Loader, no workers, no data files): reset,
next, get_state round trips, lookahead, and elastic history."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardfeed.loader.feeds.base import Upcoming
from shardfeed.loader.feeds.epoch import EpochFeed
from shardfeed.loader.schedule import BatchSchedule, Stage
from shardfeed.shuffling import offsets_of
from shardfeed.shuffling.spec import PlanSpec

COUNTS = np.array([7, 0, 13, 5, 9, 11, 4, 8], dtype=np.int64)
FP = {"samples": int(COUNTS.sum()), "shards": len(COUNTS), "order": "global", "seed": 3, "drop_last": False}


def feed(rank=0, world=1, batch=4, order="global", epoch=0):
    spec = PlanSpec(COUNTS, order, 3)
    return EpochFeed(spec, BatchSchedule.of(batch), rank, world, None, dict(FP, order=order), epoch=epoch)


def drain(f) -> list[np.ndarray]:
    return [item.ids() for item in f]


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("order", ["none", "shard", "block", "global"])
def test_reset_from_any_state_continues_exactly(world, order):
    for rank in range(world):
        ref = drain(feed(rank, world, order=order))
        assert len(ref) == len(feed(rank, world, order=order))
        for k in range(len(ref) + 1):
            f = feed(rank, world, order=order)
            for _ in range(k):
                f.next()
            state = json.loads(json.dumps(f.get_state()))  # plain data
            g = feed(rank, world, order=order)
            g.reset(state)
            rest = drain(g)
            assert len(rest) == len(ref) - k
            assert all(np.array_equal(a, b) for a, b in zip(rest, ref[k:]))


def test_items_carry_the_state_after_them_and_the_epoch_ends_with_stopiteration():
    f = feed(batch=10)
    items = list(f)
    assert [i.step for i in items] == list(range(len(items)))
    assert [i.state["step"] for i in items] == list(range(1, len(items) + 1))
    assert items[-1].stop == items[-1].plan.num_samples and items[0].start == 0
    with pytest.raises(StopIteration):
        f.next()
    f.next_epoch()
    assert f.get_state()["epoch"] == 1 and f.get_state()["step"] == 0
    assert not np.array_equal(f.next().ids(), items[0].ids())  # a new epoch, a new permutation


def test_all_ranks_cover_every_sample_each_epoch():
    for epoch in (0, 1):
        ids = np.concatenate([i.ids() for r in range(3) for i in feed(r, 3, epoch=epoch)])
        assert set(ids.tolist()) == set(range(int(COUNTS.sum())))


def test_lookahead_lists_shards_in_order_of_first_use_with_their_step():
    f = feed(batch=5, order="block")
    for _ in range(2):
        f.next()
    ahead = f.lookahead(100)
    offsets = offsets_of(COUNTS)
    first: dict[int, tuple[int, int]] = {}
    g = feed(batch=5, order="block")
    g.reset(f.get_state())
    for epoch in (0, 1):
        for item in g:
            for s in np.searchsorted(offsets, item.ids(), side="right") - 1:
                first.setdefault(int(s), (epoch, item.step))
        g.next_epoch()
    expected = sorted(first.items(), key=lambda kv: (kv[1], kv[0]))
    assert [a.shard for a in ahead][:len(expected)] == [s for s, _ in expected]
    assert all(isinstance(a, Upcoming) for a in ahead)
    assert [(a.epoch, a.step) for a in ahead] == [v for _, v in expected]
    assert 1 not in {a.shard for a in ahead}  # the empty shard is never needed
    assert f.lookahead(2) == ahead[:2]
    assert f.get_state()["step"] == 2  # lookahead does not move the feed


def test_lookahead_crosses_into_the_next_epoch():
    f = feed(batch=10, order="none")
    while True:
        try:
            f.next()
        except StopIteration:
            break
    ahead = f.lookahead(3)
    assert [(a.shard, a.epoch, a.step) for a in ahead] == [(0, 1, 0), (2, 1, 0), (3, 1, 2)]


def test_elastic_history_3_to_2_ranks_round_trips_through_state():
    old = [feed(r, 3, batch=4) for r in range(3)]
    consumed = []
    for f in old:
        for _ in range(3):
            consumed.append(f.next().ids())
    state = old[1].get_state()
    assert all(f.get_state() == state for f in old)  # any rank's state describes the job
    new = [feed(r, 2, batch=6) for r in range(2)]
    rest = []
    for f in new:
        f.reset(state)
        assert f.get_state()["history"] == [[3, [4, 4, 4], [12, 12, 12]]]
        again = feed(f.rank, 2, batch=6)
        again.reset(json.loads(json.dumps(f.get_state())))  # the history survives a save
        mine = drain(f)
        assert all(np.array_equal(a, b) for a, b in zip(mine, drain(again)))
        rest.append(np.concatenate(mine))
    assert len(rest[0]) == len(rest[1])  # equal shares, equal steps
    done = set(np.concatenate(consumed).tolist())
    left = np.concatenate(rest).tolist()
    assert set(left) == set(range(int(COUNTS.sum()))) - done
    assert len(left) - len(set(left)) < 2  # padding: at most world_size - 1


def test_a_schedule_changes_the_batch_size_at_epoch_boundaries():
    spec = PlanSpec(COUNTS, "global", 3)
    f = EpochFeed(spec, BatchSchedule([Stage(4, image_size=8), Stage(16, image_size=16)]), 0, 1, None, FP)
    first = list(f)
    f.next_epoch()
    second = list(f)
    assert {i.stop - i.start for i in first[:-1]} == {4} and first[0].image_size == 8
    assert {i.stop - i.start for i in second[:-1]} == {16} and second[0].image_size == 16


def test_state_of_other_data_is_refused_naming_the_difference():
    f = feed()
    state = f.get_state()
    state["dataset"] = dict(state["dataset"], seed=4)
    with pytest.raises(ValueError, match="seed: saved 4, now 3"):
        feed().reset(state)
    with pytest.raises(ValueError, match="history"):
        feed().reset(dict(f.get_state(), history=[[2, None, [1]]]))
