"""The prefetcher's effect: with a plan that fits its budget, a Loader's worker
reads the next steps' samples from the cache, fetched ahead by the prefetcher,
not over the link. A loopback HTTP dataset behind a link of 20 ms a request,
read through a cache that holds all of it by a Loader with a worker, as the
reference trainer reads it; the consumer takes 30 ms a step (its compute). Counted by the Loader (``stats()``) and checked against
the server's request log; every delivered sample is compared with what was
written."""

from __future__ import annotations

import os
import time

import pytest

from cache_servers import Fault, RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset

N, PAYLOAD, PER_SHARD, BATCH = 384, 16384, 8, 8
LATENCY_S, STEP_S = 0.02, 0.03


@pytest.fixture(autouse=True)
def _default_ranges(monkeypatch):
    """Samples of 16 KiB: sample ranges by default (no SHARDFEED_CACHE_RANGES override)."""
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", None)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("effect") / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, PAYLOAD))
    return root


def _epochs(srv, cache_dir, limit, epochs=2):
    """Per epoch: (Loader's epoch stats, range requests the readers and prefetcher made, wrong samples)."""
    ds = ShardDataset(srv.url, shuffle="global", seed=3, cache_dir=cache_dir, cache_limit_bytes=limit)
    out = []
    with Loader(ds, BATCH, num_workers=1) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            bad, seen = 0, 0
            before = srv.gets(".tar")
            for b in loader:
                for k, c, payload in zip(b["__key__"], b["cls"].tolist(), b["bin"]):
                    want = labelled_sample(int(k), PAYLOAD)
                    bad += (c != want["cls"]) or (bytes(payload) != want["bin"])
                    seen += 1
                time.sleep(STEP_S)  # the training step
            assert seen == N
            out.append((loader.stats()["epoch"], srv.gets(".tar") - before, bad))
    return out


def _limit(root, share):
    """``share`` of the shards and sidecars in the disk's blocks (what the cache's budget charges)."""
    ix = open_index(root)
    files = [int(n) for n in ix.sizes] + [os.path.getsize(os.path.join(root, n + ".idx")) for n in ix.names]
    return int(share * sum(-(-n // 4096) * 4096 for n in files))


def test_readers_hit_what_the_prefetcher_brought_when_the_plan_fits(tmp_path, dataset):
    # the cache holds the whole dataset (with room for its index and plans): the prefetcher brings
    # each shard before the worker's first read of it, and the epochs after the first fetch nothing
    with RangeServer(dataset) as srv:
        srv.faults.append(Fault(".tar", "stall", times=10 ** 9, stall_s=LATENCY_S))  # every shard GET: 20 ms
        epochs = _epochs(srv, str(tmp_path / "c"), _limit(dataset, 1.0) + (256 << 10))
    shards = N // PER_SHARD
    for _, _, bad in epochs:
        assert bad == 0
    first, _, _ = epochs[0]
    assert first["prefetch_skipped"] == 0 and first["prefetch_errors"] == 0, first
    assert first["prefetch_shards"] >= 0.75 * shards, first  # fetched by the prefetcher, not by the worker
    # the worker waited over the link for the shards of its first steps, before the prefetcher was ahead
    # (17 of 48 here; every one of the 48 without a prefetcher)
    assert first["cache_misses"] <= 0.5 * shards, first
    second, gets, _ = epochs[1]
    assert gets == 0 and second["bytes_fetched"] == 0, second  # all of it stayed
    assert second["cache_misses"] == 0 and second["late_samples"] == 0, second
