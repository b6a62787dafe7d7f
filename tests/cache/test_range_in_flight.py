"""Sample ranges over a link with a round trip per request (cache/ranges.py, cache/planning/loader_prefetch.py):
the plan is known, so the requests go out side by side and the link's latency, paid once per
request one after another, no longer sets the pace. A loopback server waits LATENCY_S before
answering each GET (requests waiting side by side) and counts the most it answers at once.

Also the cache as large as the dataset: the first epoch fetches the dataset (and its sidecars)
once, the later ones nothing, at 0 and 2 workers."""

from __future__ import annotations

import os
import time

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache.storage.disk_blocks import block_size, empty_cache_bytes, rounded
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset

N, PAYLOAD, PER_SHARD, BATCH, LATENCY_S = 192, 8192, 8, 16, 0.05


@pytest.fixture(autouse=True)
def _default_ranges(monkeypatch):
    """Samples of 8 KiB: sample ranges by default (no SHARDFEED_CACHE_RANGES override)."""
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", None)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("in-flight") / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, PAYLOAD))
    return root


def _objects(root) -> tuple[int, int]:
    """(bytes of the shards, bytes of every object of the dataset: shards, sidecars, index)."""
    data = int(open_index(root).sizes.sum())
    return data, sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def _epochs(srv, tmp_path, limit, workers, epochs):
    """[(tar bytes, GETs, seconds, most GETs at once, keys)] per epoch, read by a Loader."""
    ds = ShardDataset(srv.url, shuffle="global", seed=3, cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit)
    out = []
    with Loader(ds, BATCH, num_workers=workers) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            b0, r0, t0 = srv.bytes_sent(".tar"), srv.gets(""), time.monotonic()
            srv.max_in_flight = 0
            keys = [k for b in loader for k in b["__key__"]]
            out.append((srv.bytes_sent(".tar") - b0, srv.gets("") - r0, time.monotonic() - t0, srv.max_in_flight,
                        keys))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_range_requests_go_out_side_by_side(tmp_path, dataset, workers):
    """A warm epoch at half the dataset: ~100 range requests. One at a time (4 prefetch threads
    each fetching a shard's ranges in turn, the readers 4 more: at most 8 were ever in flight)
    they took the round trips' sum; now far more are in flight and the epoch takes a fraction
    of requests x latency."""
    data, every = _objects(dataset)
    with RangeServer(dataset) as srv:
        srv.latency_s = LATENCY_S
        epochs = _epochs(srv, tmp_path, every // 2, workers, 2)
    for _, _, _, _, keys in epochs:
        assert sorted(keys) == [f"{i:08d}" for i in range(N)]  # every sample once, each epoch
    tar, gets, took, most, _ = epochs[1]
    assert tar > 0.2 * data and gets > 40, (tar / data, gets)  # the warm epoch reads ranges over the link
    assert most > 12, f"at most {most} requests in flight at once"
    assert took < gets * LATENCY_S / 5, f"{gets} requests took {took:.2f} s ({LATENCY_S} s each)"


@pytest.mark.parametrize("workers", [0, 2])
def test_cache_as_large_as_the_dataset_fetches_it_once(tmp_path, dataset, workers):
    """Limit: every object of the dataset in the disk's blocks (the budget's unit) plus the cache's
    own files (its folders, the mirrored index, the plans: 48 KiB in blocks here, 64 KiB given)."""
    data, _ = _objects(dataset)
    block = block_size(str(tmp_path))
    every = sum(rounded(os.path.getsize(os.path.join(d, f)), block) for d, _, fs in os.walk(dataset) for f in fs)
    with RangeServer(dataset) as srv:
        srv.latency_s = 0.005
        epochs = _epochs(srv, tmp_path, every + empty_cache_bytes(block) + (64 << 10), workers, 3)
    assert epochs[0][0] <= 1.02 * data, epochs[0][0] / data
    assert [e[0] for e in epochs[1:]] == [0, 0]
    for *_, keys in epochs:
        assert sorted(keys) == [f"{i:08d}" for i in range(N)]
