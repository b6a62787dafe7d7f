"""ShardDataset and Loader read through the node-local cache: remote datasets
over HTTP and S3 (real servers on loopback), local ones copied into a cache,
caches smaller than the dataset, the budget check at start, the thrash
warning, stats, and a damaged cached copy refetched, never delivered."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from cache_servers import RangeServer, s3_options, upload_folder
from conftest import labelled_sample
from shardfeed.cache import CacheLimitError
from shardfeed.cache.planning.simulate import belady_bytes
from shardfeed.formats import ShardError, open_index
from shardfeed.loader import Loader, ShardDataset


def _batches(ds, batch_size, num_workers, context=None):
    with Loader(ds, batch_size, num_workers=num_workers, multiprocessing_context=context) as loader:
        out = [(list(b["__key__"]), b["cls"].tolist(), [bytes(x) for x in b["bin"]]) for b in loader]
        return out, loader.stats()


def _check_content(batches, n):
    keys = [k for ks, _, _ in batches for k in ks]
    assert sorted(keys) == [f"{i:08d}" for i in range(n)]  # every sample once
    for ks, cls, bins in batches:
        for k, c, b in zip(ks, cls, bins):
            want = labelled_sample(int(k), 512)
            assert (c, b) == (want["cls"], want["bin"])


@pytest.fixture
def dataset(tmp_path):
    from shardfeed.formats import ShardWriter

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(96):
            w.write(labelled_sample(i, 512))
    return root


@pytest.mark.parametrize("num_workers", [0, 2])
def test_http_dataset_with_small_cache_equals_local(tmp_path, dataset, num_workers):
    size = open_index(dataset).num_bytes
    local, _ = _batches(ShardDataset(dataset, shuffle="none", seed=3), 8, num_workers)
    with RangeServer(dataset) as srv:
        ds = ShardDataset(srv.url, shuffle="none", seed=3, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=size // 2)
        got, stats = _batches(ds, 8, num_workers)
    assert got == local
    _check_content(got, 96)
    assert stats["bytes_fetched"] >= size  # every shard came over HTTP
    assert stats["evictions"] > 0  # the cache is half the dataset
    assert stats["cache_hits"] + stats["cache_misses"] >= 12
    assert "cache" in str(stats)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_s3_dataset_with_small_cache_equals_local(tmp_path, dataset, moto_endpoint, num_workers):
    import boto3

    bucket = f"data{num_workers}"
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    upload_folder(moto_endpoint, bucket, dataset, "ds")
    size = open_index(dataset).num_bytes
    # a step of "block" or "shard" reads 8 of these 12 tiny shards: only "none" works in half the dataset
    local, _ = _batches(ShardDataset(dataset, shuffle="none", seed=5), 8, num_workers)
    ds = ShardDataset(f"s3://{bucket}/ds", shuffle="none", seed=5, cache_dir=str(tmp_path / "c"),
                      cache_limit_bytes=size // 2, storage_options=s3_options(moto_endpoint))
    got, stats = _batches(ds, 8, num_workers)
    assert got == local
    _check_content(got, 96)
    assert stats["bytes_fetched"] >= size


def test_local_dataset_through_cache_dir_is_copied_and_equal(tmp_path, dataset):
    local, _ = _batches(ShardDataset(dataset, shuffle="global", seed=1), 4, 0)
    cache_dir = tmp_path / "c"
    got, stats = _batches(ShardDataset(dataset, shuffle="global", seed=1, cache_dir=str(cache_dir)), 4, 0)
    assert got == local
    assert len([n for n in os.listdir(cache_dir / "data") if "." not in n]) == 12  # every shard copied once
    assert stats["bytes_fetched"] >= open_index(dataset).num_bytes
    again, stats2 = _batches(ShardDataset(dataset, shuffle="global", seed=1, cache_dir=str(cache_dir)), 4, 0)
    assert again == local and stats2["bytes_fetched"] == 0 and stats2["cache_misses"] == 0  # a warm cache


def test_budget_below_working_set_fails_at_start_with_bytes_needed(tmp_path, dataset):
    biggest = int(open_index(dataset).sizes.max())
    ds = ShardDataset(dataset, shuffle="global", seed=0, cache_dir=str(tmp_path / "c"), cache_limit_bytes=3 * biggest)
    with Loader(ds, 16) as loader, pytest.raises(CacheLimitError) as e:
        next(iter(loader))  # a global batch of 16 touches far more than 3 shards
    assert e.value.needed_bytes > 3 * biggest and f"{e.value.needed_bytes:,}" in str(e.value)
    with pytest.raises(CacheLimitError, match="cannot hold one shard"):  # a shard larger than the whole budget
        ShardDataset(dataset, cache_dir=str(tmp_path / "c2"), cache_limit_bytes=biggest // 2)


def test_thrashing_plan_warns_once_with_bytes_and_fixes(tmp_path, monkeypatch):
    from shardfeed.cache.readers import ranged_reads
    from shardfeed.formats import ShardWriter

    monkeypatch.setattr(ranged_reads, "ENABLED", False)  # whole shards: with sample ranges this plan does not thrash

    root = str(tmp_path / "many")
    with ShardWriter(root, max_shard_samples=4) as w:
        for i in range(240):
            w.write(labelled_sample(i, 256))
    size = open_index(root).num_bytes
    ds = ShardDataset(root, shuffle="global", seed=0, cache_dir=str(tmp_path / "c"), cache_limit_bytes=size // 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Loader(ds, 2) as loader:
            n = sum(len(b["__key__"]) for b in loader)
            est = loader._cache.estimate
    assert n == 240, est
    thrash = [w for w in caught if "refetches" in str(w.message)]
    assert len(thrash) == 1, est
    msg = str(thrash[0].message)
    assert "locality=True" in msg and "shuffle='block'" in msg and "cache_limit_bytes >=" in msg
    assert est["fetched_bytes"] > 2 * size
    # the same budget with the sequential order fetches each shard once: no warning
    ds = ShardDataset(root, shuffle="none", cache_dir=str(tmp_path / "c3"), cache_limit_bytes=size // 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Loader(ds, 2) as loader:
            list(loader)
    assert not [w for w in caught if "refetches" in str(w.message)]


def test_belady_simulation_against_hand_counts():
    sizes = np.array([10, 10, 10])
    assert belady_bytes([0, 1, 0, 1], sizes, 20) == 20  # both fit: fetched once each
    # room for 2: at the read of 2, evict 1 (next read later than 0's)
    assert belady_bytes([0, 1, 2, 0, 1], sizes, 20) == 40
    assert belady_bytes([0, 0, 0], np.array([50]), 20) == 150  # larger than the cache: every read


def test_damaged_cached_copy_is_refetched_never_delivered(tmp_path, dataset):
    cache_dir = tmp_path / "c"
    ref, _ = _batches(ShardDataset(dataset, shuffle="none", cache_dir=str(cache_dir)), 8, 0)
    entry = next(os.path.join(cache_dir, "data", n) for n in sorted(os.listdir(cache_dir / "data")) if "." not in n)
    mid = os.path.getsize(entry) // 2
    with open(entry, "r+b") as f:  # flip 1,500 bytes mid-shard: some sample payload is hit
        f.seek(mid)
        b = f.read(1500)
        f.seek(mid)
        f.write(bytes(x ^ 0xFF for x in b))
    got, stats = _batches(ShardDataset(dataset, shuffle="none", cache_dir=str(cache_dir)), 8, 0)
    assert got == ref
    _check_content(got, 96)
    assert stats["bytes_fetched"] > 0  # the damaged copy was fetched again


def test_damage_at_the_source_is_an_error_naming_the_shard(tmp_path, dataset):
    """A shard whose bytes no longer match its index hash is refused at fetch."""
    idx = open_index(dataset)
    path = idx.path(3)
    with open(path, "r+b") as f:
        f.seek(1024)
        f.write(b"\xff" * 8)
    with RangeServer(dataset) as srv:
        ds = ShardDataset(srv.url, shuffle="none", cache_dir=str(tmp_path / "c"))
        with Loader(ds, 8) as loader, pytest.raises(ShardError) as e:
            list(loader)
    assert idx.names[3] in str(e.value) and "hash" in str(e.value)


def test_url_without_cache_dir_uses_the_documented_default(tmp_path, dataset, monkeypatch):
    monkeypatch.setenv("SHARDFEED_CACHE_DIR", str(tmp_path / "default"))
    with RangeServer(dataset) as srv, pytest.warns(RuntimeWarning, match="no cache_dir"):
        ds = ShardDataset(srv.url, shuffle="none")
        assert len(ds) == 96
    assert os.path.isdir(tmp_path / "default" / "datasets")


def test_bad_urls_name_the_url(tmp_path):
    with pytest.raises(ShardError, match="pipe"):
        ShardDataset("pipe:cat x.tar", cache_dir=str(tmp_path / "c"))
    with RangeServer(str(tmp_path)) as srv, pytest.raises(ShardError, match=srv.url):
        ShardDataset(srv.url + "/nothing", cache_dir=str(tmp_path / "c"))
