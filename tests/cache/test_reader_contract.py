"""One checker run on every implementation of the reader-side contracts the loader
calls without probing: cache/shard_access.py ``ShardAccess`` (CachedShards,
RangedShards, FollowedShards), loader/makers.py ``Maker`` (BatchMaker,
RegrowMaker) and its ``Reader``, and the feeds' declared ``near``. Each
implementation subclasses its base with nothing abstract left, and the batch
maker reads real shards through each shard access from a loopback HTTP server,
every sample the one written; the bases' defaults behave as declared."""

from __future__ import annotations

import numpy as np
import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache.readers.reads import CachedShards, CacheSpec
from shardfeed.cache.readers.shard_access import ShardAccess
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import BatchSchedule, Mixture, ShardDataset
from shardfeed.loader.batch_seeds import in_worker, set_batch
from shardfeed.loader.batcher import BatchMaker
from shardfeed.loader.feeds.base import Feed
from shardfeed.loader.feeds.stream_log import RegrowMaker
from shardfeed.loader.makers import Maker, Reader

PER, SHARDS, PAYLOAD = 8, 4, 4096


@pytest.fixture
def root(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER) as w:
        for i in range(PER * SHARDS):
            w.write(labelled_sample(i, PAYLOAD))
    return root


@pytest.fixture(autouse=True)
def _ranges(monkeypatch):
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", True)


def _access(kind: str, ix, spec, url: str) -> ShardAccess:
    from shardfeed.cache.readers.ranged_reads import RangedShards
    from shardfeed.loader.remote_follow import FollowedShards

    of = lambda i: f"{url}/{ix.names[i]}"  # noqa: E731
    if kind == "cached":
        return CachedShards(ix, spec, of)
    if kind == "ranged":
        return RangedShards(ix, spec, of)
    if kind == "whole":  # RangedShards of an order that reads a shard's samples together
        return RangedShards(ix, spec, of, ranges=False)
    ix.root = url  # a followed index names its source (remote_follow._index)
    return FollowedShards(ix, spec)


# kind -> (keep_open, ranged): what each declares
KINDS = {"cached": (True, False), "ranged": (True, True), "whole": (True, False), "followed": (False, False)}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_shard_access_keeps_the_contract(root, tmp_path, kind):
    """A BatchMaker over each: the declared members answer, the maker sets the two it
    owns (forget_view, batch_step), and a batch read through the cache is the written one."""
    from shardfeed.loader.caching import step_key

    ix = open_index(root)
    # a third of the data: the ranged kind fetches its misses as sample ranges
    spec = CacheSpec(str(tmp_path / f"c-{kind}"), int(ix.sizes.sum()) // 3 if kind == "ranged" else 1 << 30)
    with RangeServer(root) as srv:
        access = _access(kind, ix, spec, srv.url)
        assert isinstance(access, ShardAccess) and not type(access).__abstractmethods__
        keep_open, ranged = KINDS[kind]
        assert access.keep_open is keep_open
        assert access.ranged is ranged
        assert access.forget_view is None and access.batch_step is None
        maker = BatchMaker(ix, cached=access)
        try:
            assert access.forget_view == maker.reader.shards.forget
            if not keep_open:
                assert maker.reader.max_open == 0, "a shard access that keeps nothing open: its reader neither"
            ids = np.array([3, 3 + PER, 5 + 2 * PER, 1], np.int64)
            set_batch(maker, (7, 1, 2, 0))
            cols, info = maker.make(ids)
            assert access.batch_step == step_key(1, 2)
            assert cols["__key__"].to_list() == [f"{i:08d}" for i in ids]
            assert [bytes(b) for b in cols["bin"].to_list()] == [labelled_sample(int(i), PAYLOAD)["bin"] for i in ids]
            got = info["cache"]
            if ranged:
                assert got["late_samples"] == len(ids), "the ranged access fetched the samples as ranges"
            else:
                assert got["misses"] == 3 and got["late_samples"] == 0, "three whole shards fetched"
            if kind == "followed":
                grown = open_index(root)
                access.update_index(grown)
                assert access.index is grown
            else:
                with pytest.raises(TypeError, match="fixed index"):
                    access.update_index(ix)
        finally:
            maker.close()


def test_the_shard_access_defaults_and_its_abstract_members():
    """A base with only its abstract members implemented gets the whole-shard defaults;
    one that leaves any out cannot be made, the TypeError naming what is missing."""

    class Minimal(ShardAccess):
        def path_of(self, i): return f"/s{i}"  # noqa: E704
        def release(self, i): return None  # noqa: E704
        def refetch(self, i): return False  # noqa: E704
        def shard_of_path(self, path): return None  # noqa: E704
        def take(self): return {}  # noqa: E704
        def close(self): return None  # noqa: E704

    m = Minimal()
    assert m.keep_open is True and m.ranged is False and m.forget_view is None and m.batch_step is None
    assert m.prepare(np.arange(3)) == [] and m.finish([]) is None
    with pytest.raises(TypeError, match="Minimal reads a fixed index"):
        m.update_index(None)

    class Missing(ShardAccess):
        def path_of(self, i): return ""  # noqa: E704

    with pytest.raises(TypeError, match="release"):
        Missing()


def test_every_maker_keeps_the_contract(root):
    """BatchMaker and RegrowMaker: Makers with nothing abstract left and a Reader; the
    seed key and RNG flag reach the maker that reads; a wrapper's defaults hold."""
    ix = open_index(root)
    plain = BatchMaker(ix)
    grow = RegrowMaker(BatchMaker(ix), lambda: ix, root, "{id} {n}")
    try:
        for maker in (plain, grow):
            assert isinstance(maker, Maker) and not type(maker).__abstractmethods__
            assert isinstance(maker.reader, Reader)
            inner = maker.inner()
            assert type(inner) is BatchMaker and inner.cached is None and maker.cached is None
            set_batch(maker, (1, 2, 3, 0))
            in_worker(maker)
            assert inner.batch_key == (1, 2, 3, 0) and inner.restore_rng is False
            plan = ShardDataset(root).unbatched_plan()
            assert maker.hint(plan, 0, 4) is None
            cols, _ = maker.make(np.array([0, 9], np.int64))
            assert cols["__key__"].to_list() == ["00000000", "00000009"]
        assert grow.inner() is grow.maker
        assert grow.gather_into_bytes() is False  # the wrapper's default; the Loader asks its inner()
        assert grow.stride == 1 and grow.batch_key is None  # declared defaults (set on the inner maker)
    finally:
        plain.close()
        grow.close()


def test_every_feed_declares_near(root, tmp_path):
    """The epoch feed knows the samples of its next steps; the others declare that they do not."""
    stream = str(tmp_path / "live")
    with ShardWriter(stream, max_shard_samples=6, append=True) as w:
        for i in range(20):
            w.write({"__key__": f"s-{i:04d}", "cls": i})
        w.end_stream()
    schedule = BatchSchedule.of(4)
    epoch = ShardDataset(root, seed=3).feed(schedule)
    others = [ShardDataset(stream, follow=True, poll_s=0.01, idle_timeout_s=5).feed(schedule),
              Mixture([root, root], weights=[1, 1], epoch_samples=16, seed=1).feed(schedule),
              Mixture([root, ShardDataset(stream, follow=True, poll_s=0.01, idle_timeout_s=5)],
                      weights=[1, 1], seed=1).feed(schedule)]
    assert isinstance(epoch, Feed) and epoch.knows_near
    near = epoch.near(2, skip=1)
    assert [(e, s, b) for e, s, b, _ in near] == [(0, 1, 4)]
    assert near[0][3].tolist() == epoch.plan(0).positions(4, 12).tolist()
    assert len({type(f) for f in others}) == 3
    for f in others:
        assert isinstance(f, Feed) and not f.knows_near and f.near(2) == []


def test_every_dataset_answers_what_the_loader_asks(root, tmp_path):
    """ShardDataset and Mixture both declare ``cache`` and ``follow`` (the Loader, its workers and the
    read-ahead ask them without probing); a Loader over a mixture with a stream, read by a worker,
    delivers every sample once."""
    from shardfeed.loader import Loader

    stream = str(tmp_path / "live")
    with ShardWriter(stream, max_shard_samples=5, append=True) as w:
        for i in range(12):
            w.write({"__key__": f"s-{i:04d}", "cls": i})
        w.end_stream()
    follow = ShardDataset(stream, follow=True, poll_s=0.01, idle_timeout_s=5)
    fixed = Mixture([root, root], weights=[1, 1], epoch_samples=16)
    live = Mixture([root, follow], weights=[1, 1])
    got = [(d.cache, d.follow) for d in (ShardDataset(root), follow, fixed, live)]
    assert got == [(None, False), (None, True), (None, False), (None, True)]
    keys = []
    for batch in Loader(live, batch_size=4, num_workers=1):
        keys += batch["__key__"]
    assert sorted(k for k in keys if k.startswith("s-")) == [f"s-{i:04d}" for i in range(12)]
    assert len(keys) == 24  # as many of the fixed source as of the stream (weights 1:1)
