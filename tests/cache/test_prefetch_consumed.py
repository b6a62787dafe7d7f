"""A prefetch for the readers' next step never fetches again what a reader read at that step.

The prefetcher (cache/planning/loader_prefetch.py) and the readers race for the samples of
the readers' next step. A prefetch that took a partial copy's lock after a
reader had read a sample and punched it out found it missing and fetched it
once more, for nothing: on a loaded machine that took a 75% cache's epoch
past 1.1 x what it cannot hold (test_cache_ranges). The reader notes what it
read before punching (cache/consumed.py); bytes counted by a loopback server."""

from __future__ import annotations

import numpy as np
import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache import ShardCache, ShardRef
from shardfeed.cache.sample_ranges.consumed import KEEP_STEPS
from shardfeed.cache.sample_ranges.cost_model import CostModel
from shardfeed.cache.sample_ranges.ranges import RangeFetcher
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.caching import step_key

N, PAYLOAD, PER_SHARD, BATCH = 64, 16384, 8, 8


@pytest.fixture(autouse=True)
def _default_ranges(monkeypatch):
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", None)  # 16 KiB samples: ranges by default


@pytest.fixture
def dataset(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, PAYLOAD))
    return root


def test_a_prefetch_leaves_what_the_readers_read_at_its_step(tmp_path, dataset):
    ix = open_index(dataset)
    # no gap read through: on a loaded machine the measured latency grows, and the cost model would
    # rightly read across the consumed samples 1-2 to reach 3 in one request; the bytes then say nothing
    fetcher = RangeFetcher(ShardCache(str(tmp_path / "c"), 1 << 22), CostModel(max_gap_bytes=0))
    with RangeServer(dataset) as srv:
        ref = ShardRef(f"{srv.url}/{ix.names[0]}", ix.hashes[0], int(ix.sizes[0]))
        assert fetcher.ensure(ref, [1, 2], PER_SHARD) == (0, 2)  # the reader's own fetch, at step 7
        fetcher.consumed.note(7, ref.url, [1, 2])
        assert fetcher.punch_consumed(ref, [1, 2])
        assert not fetcher.present(ref, [1]) and not fetcher.present(ref, [2])  # given back
        sent = srv.bytes_sent(".tar")
        assert fetcher.ensure(ref, [1, 2, 3], PER_SHARD, for_step=7) == (0, 1)  # only sample 3 is wanted
        assert srv.bytes_sent(".tar") - sent < 2 * PAYLOAD
        assert not fetcher.present(ref, [1]) and fetcher.present(ref, [3])
        # the same samples planned at another step (the next epoch's read) are fetched
        assert fetcher.ensure(ref, [1, 2], PER_SHARD, for_step=7 + 10**9) == (0, 2)
        assert fetcher.present(ref, [1, 2])
        # and a reader's own fetch never skips anything
        fetcher.punch_consumed(ref, [1, 2])
        assert fetcher.ensure(ref, [1, 2], PER_SHARD) == (0, 2)


def test_only_the_last_steps_are_kept():
    from shardfeed.cache.sample_ranges.consumed import Consumed

    c = Consumed()
    for step in range(100):
        c.note(step, "u", [step % 8])
    assert c.at(99, "u", np.array([3, 4])).tolist() == [True, False]
    assert c.at(99 - KEEP_STEPS + 1, "u", np.array([(99 - KEEP_STEPS + 1) % 8])).tolist() == [True]
    assert not c.at(99 - KEEP_STEPS, "u", np.arange(8)).any()  # forgotten: the readers passed it
    assert len(c._by_step) == KEEP_STEPS


def test_a_loader_without_workers_notes_each_batch_at_its_step(tmp_path, dataset):
    data = int(open_index(dataset).sizes.sum())
    with RangeServer(dataset) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=3, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=data // 2)
        with Loader(ds, BATCH) as loader:
            it = iter(loader)
            for step in range(3):
                b = next(it)
                keys = np.array([int(k) for k in b["__key__"]])
                shard, local = ds.index.locate(keys)
                consumed = loader._cache.policy.fetcher.consumed
                cache, ranged = loader._cache.spec.open(), 0
                for s in np.unique(shard).tolist():
                    ref = loader._cache.shards.ref(s)
                    url, mine = ref.url, local[shard == s]
                    if cache.contains(ref.url, ref.hash, ref.version):
                        continue  # admitted whole: read from its whole copy, nothing punched
                    ranged += 1
                    assert consumed.at(step_key(0, step), url, mine).all(), (step, s)
                    assert not consumed.at(step_key(0, step + 1), url, mine).any()
                assert ranged
            it.close()
