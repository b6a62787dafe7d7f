"""Request economy through the cache: no HEAD where the index gives the size,
each shard and sidecar fetched once, the mirror revalidated with conditional
GETs, and the requests counted per epoch in the Loader's stats."""

from __future__ import annotations

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset


@pytest.mark.timeout(300)
def test_requests_per_epoch_are_counted_and_minimal(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(48):
            w.write(labelled_sample(i, 256))
    shards = len(open_index(root))
    with RangeServer(root) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=1, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=16 << 20)
        mirror = sum(srv.requests.values())  # the index (and a log listing) when the dataset opened
        with Loader(ds, 8) as loader:
            for _b in loader:
                pass
            first = loader.stats()["epoch"]["requests"]
            loader.set_epoch(1)
            for _b in loader:
                pass
            second = loader.stats()["epoch"]["requests"]
        assert srv.head_count() == 0  # sizes come from the index: never a HEAD
        assert srv.gets(".tar") == shards and srv.gets(".tar.idx") == shards  # each once
        # the mirror (index, log listing) at open, one GET per shard and per sidecar, then all hits
        assert first == mirror + 2 * shards and second == 0
        assert sum(srv.requests.values()) == mirror + 2 * shards



@pytest.mark.timeout(120)
def test_range_and_sidecar_requests_are_counted_as_the_server_sees_them(tmp_path):
    """A shard read as sample ranges: its sidecar GET and each range GET, retries
    included, are in the cache's ``requests`` (what the Loader's stats() report)."""
    from cache_servers import Fault
    from shardfeed.cache import ShardCache, ShardRef
    from shardfeed.cache.sample_ranges.cost_model import CostModel
    from shardfeed.cache.sample_ranges.ranges import RangeFetcher

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=16) as w:
        for i in range(16):
            w.write(labelled_sample(i, 8192))
    ix = open_index(root)
    cache = ShardCache(str(tmp_path / "c"), 4 << 20)
    fetcher = RangeFetcher(cache, CostModel())
    with RangeServer(root) as srv:
        srv.faults.append(Fault(".tar", "503", times=1, skip=1))  # the second range GET fails once, then retried
        ref = ShardRef(f"{srv.url}/{ix.names[0]}", ix.hashes[0], int(ix.sizes[0]))
        assert fetcher.ensure(ref, [1, 5, 9], 16) == (0, 3)  # three ranges (samples 8 KiB apart)
        assert fetcher.ensure(ref, [1, 12], 16) == (1, 1)
        asked = sum(srv.requests.values()) + srv.head_count()
        assert not srv.faults[0].times  # the 503 was met
    assert srv.gets(".tar.idx") == 1 and srv.gets(".tar") == 5  # 4 ranges and the retry
    assert cache.stats()["requests"] == asked == 6
