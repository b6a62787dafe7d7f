"""The prefetch window crosses epoch boundaries: while the last steps of an epoch are
read, the sample prefetcher (cache/planning/loader_prefetch.py, fed by loader/caching.py from
``EpochFeed.near``) brings the first steps of the next one, whose plan is a pure
function of the seed and the epoch. A loopback HTTP dataset read through a cache of
half of it, so misses come as sample ranges; every delivered sample is checked."""

from __future__ import annotations

import numpy as np
import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from loader_helpers import prefetch_settled
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset

N, PAYLOAD, PER_SHARD, BATCH = 128, 8192, 8, 8


@pytest.fixture(autouse=True)
def _default_ranges(monkeypatch):
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", None)  # 8 KiB samples: ranges by default


def test_next_epochs_first_steps_are_prefetched_before_it_starts(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, PAYLOAD))
    data = int(open_index(root).sizes.sum())
    with RangeServer(root) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=4, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=data // 2)
        with Loader(ds, BATCH) as loader:
            seen = []
            for b in loader:
                seen += [int(k) for k in b["__key__"]]
                for k, payload in zip(b["__key__"], b["bin"]):
                    assert bytes(payload) == labelled_sample(int(k), PAYLOAD)["bin"]
            assert sorted(seen) == list(range(N))
            lc = loader._cache
            assert lc.policy is not None  # misses are fetched as ranges
            prefetch_settled(lc.prefetcher)
            # what epoch 1's first two steps read, from its plan (not from the prefetcher's feed): the
            # prefetcher's last window, planned when the consumer stood at the end of epoch 0
            ids = loader.feed.plan(1).positions(0, 2 * BATCH)
            shard, _ = ds.index.locate(ids)
            assert lc.prefetcher._wanted == {lc.shards.ref(s).url for s in np.unique(shard).tolist()}
            brought = lc.shards.spec.open().stats()
            assert brought["prefetch_samples"] + brought["prefetch_present"] + brought["prefetch_skipped"] > 0
            loader.set_epoch(1)
            it = iter(loader)
            for step in range(2):
                b = next(it)
                assert [int(k) for k in b["__key__"]] == ids[step * BATCH:(step + 1) * BATCH].tolist()
                for k, payload in zip(b["__key__"], b["bin"]):
                    assert bytes(payload) == labelled_sample(int(k), PAYLOAD)["bin"]
            it.close()


def test_near_crosses_into_the_next_epoch(tmp_path):
    """EpochFeed.near: the next steps' samples, the next epoch's first ones after the last."""
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(40):
            w.write(labelled_sample(i, 16))
    from shardfeed.loader.schedule import BatchSchedule

    feed = ShardDataset(root, shuffle="global", seed=2).feed(BatchSchedule.of(BATCH))
    p0, p1 = feed.plan(0).positions(0, 40), feed.plan(1).positions(0, 40)
    assert [(e, s, b, ids.tolist()) for e, s, b, ids in feed.near(2)] == [(0, 0, BATCH, p0[:16].tolist())]
    feed.reset({**feed.get_state(), "step": 4})  # the last step of epoch 0 (5 steps of 8)
    got = [(e, s, b, ids.tolist()) for e, s, b, ids in feed.near(3)]
    assert got == [(0, 4, BATCH, p0[32:].tolist()), (1, 0, BATCH, p1[:16].tolist())]
    feed.reset({**feed.get_state(), "step": 5})  # the epoch is over
    assert [(e, s, ids.tolist()) for e, s, _, ids in feed.near(1)] == [(1, 0, p1[:8].tolist())]
