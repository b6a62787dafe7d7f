"""One save/restore checker run on every feed (loader/feeds/base.py's contract):
at every step, ``get_state()`` -> a fresh feed ``reset(state)`` -> the rest of
the sequence of ``next()`` items and ``lookahead(k)`` answers equals the
original's. Feeds: epoch (1 rank, each of 3 ranks, and after an elastic
resize: a history in the state), follow, mixture, mixture with a stream."""

from __future__ import annotations

import json

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.loader import BatchSchedule, Mixture, ShardDataset, Stage
from shardfeed.shuffling.plan_protocol import Plan


def _write(root, prefix, n, per, append=False):
    with ShardWriter(root, max_shard_samples=per, append=append) as w:
        for i in range(n):
            w.write({"__key__": f"{prefix}-{i:04d}", "cls": i})
        if append:
            w.end_stream()
    return str(root)


def trace(feed, epochs: int, k: int = 3) -> list:
    """Everything a consumer sees from the feed's position on: before each step the
    lookahead, then the item (epoch, step, range, ids, stage, state after it)."""
    out = []
    for _ in range(epochs):
        while True:
            ahead = [tuple(u) for u in feed.lookahead(k)]
            try:
                item = feed.next()
            except StopIteration:
                break
            assert isinstance(item.plan, Plan)  # every feed's plans have the one declared shape
            out.append((ahead, item.epoch, item.step, item.start, item.stop, item.ids().tolist(),
                        item.stage, item.state))
        out.append(("end", feed.get_state()))
        feed.next_epoch()
    return out


def check_contract(make, epochs: int = 2) -> int:
    ref = trace(make(), epochs)
    steps = sum(1 for t in ref if t[0] != "end" and t[1] == ref[0][1])  # steps of the first epoch
    assert steps > 2
    for k in range(steps + 1):
        f = make()
        for _ in range(k):
            f.next()
        state = json.loads(json.dumps(f.get_state()))  # plain JSON, as a checkpoint holds it
        g = make()
        g.reset(state)
        assert g.get_state() == state
        rest = trace(g, epochs)
        assert rest == trace(f, epochs), f"a feed reset to step {k} diverges from the one that took the steps"
        assert rest == ref[k:], f"a feed reset to step {k} diverges from the uninterrupted run"
    # and the state after the end was seen (a stream's ``done``): nothing more of that epoch
    g = make()
    g.reset(json.loads(json.dumps(ref[steps][1])))
    assert trace(g, epochs) == ref[steps:], "a feed reset to the end of its epoch (or stream) goes on"
    return steps


@pytest.fixture
def root(tmp_path):
    return _write(tmp_path / "ds", "d", 61, 8)


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("order", ["global", "shard"])
def test_epoch_feed_keeps_the_contract_on_every_rank(root, world, order):
    schedule = BatchSchedule([Stage(4, image_size=8), Stage(5)])  # the stage changes at the epoch boundary
    for r in range(world):
        ds = ShardDataset(root, shuffle=order, seed=3, rank=r, world_size=world)
        check_contract(lambda ds=ds: ds.feed(schedule))


def test_epoch_feed_after_an_elastic_resize_keeps_the_contract(root):
    """2 ranks took 3 steps; 3 ranks (other batch sizes) continue the epoch: their states
    carry the history, and every position of that rest resumes exactly."""
    old = ShardDataset(root, seed=5, rank=0, world_size=2).feed(BatchSchedule.of(4))
    for _ in range(3):
        old.next()
    saved = json.loads(json.dumps(old.get_state()))
    for r in range(3):
        def make(r=r):
            f = ShardDataset(root, seed=5, rank=r, world_size=3).feed(BatchSchedule.of([3, 2, 2]))
            f.reset(saved)
            return f
        assert make().get_state()["history"]
        check_contract(make)


def test_follow_feed_keeps_the_contract(tmp_path):
    stream = _write(tmp_path / "live", "s", 47, 6, append=True)
    for r in range(2):
        ds = ShardDataset(stream, follow=True, seed=2, rank=r, world_size=2, poll_s=0.01, idle_timeout_s=5)
        check_contract(lambda ds=ds: ds.feed(BatchSchedule.of([3, 2])), epochs=1)


def test_follow_feed_with_replay_keeps_the_contract(tmp_path):
    stream = _write(tmp_path / "live", "s", 60, 6, append=True)
    ds = ShardDataset(stream, follow=True, seed=2, replay=0.25, window=3, poll_s=0.01, idle_timeout_s=5)
    check_contract(lambda: ds.feed(BatchSchedule.of(8)), epochs=1)


def _resumed(make_old, make_new, steps):
    """A feed of a new job, reset from the state an old job's feed saved after ``steps``."""
    old = make_old()
    for _ in range(steps):
        old.next()
    saved = json.loads(json.dumps(old.get_state()))

    def make():
        f = make_new()
        f.reset(saved)
        return f
    return make


def test_stream_feeds_after_a_resize_keep_the_contract(root, tmp_path):
    """Follow and mixture-stream feeds of a job started mid-stream by another job's state
    (base, base_step and the fixed sources' positions are then not zero)."""
    stream = _write(tmp_path / "live", "s", 47, 6, append=True)

    def follow(r, w):
        return ShardDataset(stream, follow=True, seed=2, rank=r, world_size=w, poll_s=0.01, idle_timeout_s=5)

    def mix(r, w):
        return Mixture([root, follow(0, 1)], weights=[1, 2], seed=4, rank=r, world_size=w)

    for r in range(3):
        make = _resumed(lambda: follow(0, 2).feed(BatchSchedule.of(4)),
                        lambda r=r: follow(r, 3).feed(BatchSchedule.of(2)), 2)
        assert make().get_state()["base"] == 16
        check_contract(make, epochs=1)
        make = _resumed(lambda: mix(1, 2).feed(BatchSchedule.of(3)),
                        lambda r=r: mix(r, 3).feed(BatchSchedule.of(3)), 3)
        assert make().get_state()["fixed"][0] == 6
        check_contract(make, epochs=1)


def test_mixture_feed_keeps_the_contract(root, tmp_path):
    other = _write(tmp_path / "other", "o", 23, 5)
    for r in range(2):
        mx = Mixture([root, other], weights=[2, 1], epoch_samples=50, seed=4, rank=r, world_size=2)
        check_contract(lambda mx=mx: mx.feed(BatchSchedule.of(3)))


def test_mixture_stream_feed_keeps_the_contract(root, tmp_path):
    stream = _write(tmp_path / "live", "s", 41, 6, append=True)
    for r in range(2):
        src = ShardDataset(stream, follow=True, poll_s=0.01, idle_timeout_s=5)
        mx = Mixture([root, src], weights=[1, 2], seed=4, rank=r, world_size=2)
        steps = check_contract(lambda mx=mx: mx.feed(BatchSchedule.of(3)), epochs=1)
        assert steps == -(-41 // 4)  # 4 stream samples per global batch of 6, the last step a tail


def test_the_checker_catches_a_feed_that_forgets_part_of_its_position(root):
    """The checker itself: a feed whose reset lands one step early is caught."""
    from shardfeed.loader.feeds.epoch import EpochFeed

    class Forgetful(EpochFeed):
        def _restore(self, s):
            super()._restore(s)
            self.step = max(0, self.step - 1)

    ds = ShardDataset(root, seed=1)
    with pytest.raises(AssertionError):
        check_contract(lambda: Forgetful(ds.spec, BatchSchedule.of(4), 0, 1, None, ds.fingerprint(),
                                         identity=ds.identity()))
