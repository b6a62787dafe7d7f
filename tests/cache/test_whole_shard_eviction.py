"""Whole shards through a cache of half the data, in the global order (a plan that
refetches): the start-up warning's estimate (a warm epoch, Belady's eviction in the room
the readers' open shards leave, loader/caching.py) is what the cache then fetches. Bytes counted by a real loopback server."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache.planning.simulate import Policy, plan_accesses, simulate
from shardfeed.cache.readers.reads import entry_bytes
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset
from shardfeed.shuffling.spec import Job, PlanSpec

N, PER_SHARD, BATCH = 512, 8, 16


@pytest.mark.timeout(300)
def test_whole_shards_fetch_near_belady_and_the_warning_says_so(tmp_path, monkeypatch):
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", False)
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, 2048))
    ix = open_index(root)
    data = int(ix.sizes.sum())
    limit = data // 2
    per_epoch = []
    with RangeServer(root) as srv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = ShardDataset(srv.url, shuffle="global", seed=0, cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit)
        with Loader(ds, BATCH) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                before = srv.bytes_sent(".tar")
                assert sum(len(b["__key__"]) for b in loader) == N
                per_epoch.append(srv.bytes_sent(".tar") - before)
            est = loader._cache.estimate
    assert len([w for w in caught if "refetches" in str(w.message)]) == 1
    acc = plan_accesses(PlanSpec(np.asarray(ix.counts), "global", 0), Job(1, (BATCH,), 1), 0, range(2))
    charge = entry_bytes(ix)  # what the budget holds of each shard: its blocks and its sidecar's
    ideal = simulate(charge, acc, limit, Policy.BELADY)[1] * data / int(charge.sum())
    warm = np.mean(per_epoch[1:])
    # a plan cut at what the cache holds evicted cached shards it did not name least recently used
    # first: 1.6x Belady's bytes on this plan (128 shards of 156 KB: 5.5x the data against 3.4x)
    # pinned shards cost bytes (measured 1.5x Belady's over the whole budget here: 8 of the 32 shards the
    # cache holds are kept open), and the estimate counts them: measured 2.81x the data, estimated 2.63x
    # (Belady over the whole budget, cold, as the warning said before: about 2.1x)
    assert warm <= 1.7 * ideal, (warm / data, ideal / data)
    assert abs(est["fetched_bytes"] / warm - 1) < 0.15, (est["fetched_bytes"] / data, warm / data)
