"""Remote datasets: index mirrored into the cache, shards read through it,
over HTTP and S3 (moto), with samples checked by shardfeed.formats."""

from __future__ import annotations

import os

import pytest

from cache_servers import RangeServer, s3_options, upload_folder
from conftest import labelled_sample
from shardfeed.cache import FetchOptions, Prefetcher, RemoteDataset, ShardCache, mirror_index
from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard

FAST = FetchOptions(range_bytes=4096, threads=4, attempts=2, backoff_s=0.01, stall_s=5.0)


def _check_shard(ds: RemoteDataset, i: int) -> None:
    with ds.hold(i) as path:
        assert os.path.exists(path + ".idx")  # the sidecar sits beside the cached shard
        first = int(ds.index.offsets[i])
        with open_shard(ds.index, i, path) as reader:
            got = [reader.read(j) for j in range(len(reader))]
    want = [labelled_sample(k) for k in range(first, first + ds.index.shard(i).samples)]
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want]
    assert [bytes(s["bin"]) for s in got] == [s["bin"] for s in want]
    assert [int(s["cls"]) for s in got] == [s["cls"] for s in want]  # readers hand out undecoded bytes


def test_dataset_over_http(tmp_path, make_dataset):
    root = make_dataset(100, shard_samples=25)
    with RangeServer(root) as srv:
        cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
        folder = mirror_index(srv.url, cache)
        assert open_index(folder).num_samples == 100
        ds = RemoteDataset(srv.url, cache)
        assert len(ds.index) == 4
        _check_shard(ds, 2)
        assert cache.stats()["misses"] == 1
        _check_shard(ds, 2)
        assert cache.stats()["hits"] == 1


def test_dataset_over_s3(tmp_path, make_dataset, moto_endpoint):
    import boto3

    root = make_dataset(60, shard_samples=20, format="tar")
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="data")
    upload_folder(moto_endpoint, "data", root, "ds")
    cache = ShardCache(str(tmp_path / "c"), 1 << 20, storage_options=s3_options(moto_endpoint), fetch=FAST)
    ds = RemoteDataset("s3://data/ds", cache)
    assert ds.index.num_samples == 60
    _check_shard(ds, 1)
    with Prefetcher(cache, ds.refs(range(len(ds.index))), max_ahead_bytes=1 << 19, sidecar=True) as pf:
        for i in range(len(ds.index)):
            with pf.hold(i) as path, open_shard(ds.index, i, path) as reader:
                assert len(reader) == 20


def test_growing_dataset_log_is_mirrored_and_followed(tmp_path):
    """A live dataset (commit log, no index.arrow) served over HTTP with folder
    listings: new commits appear after refresh()."""
    root = str(tmp_path / "live")
    with ShardWriter(root, max_shard_samples=10, append=True) as w:
        for i in range(20):
            w.write(labelled_sample(i))
    with RangeServer(root) as srv:
        cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
        ds = RemoteDataset(srv.url, cache)
        assert ds.index.num_samples == 20
        with ShardWriter(root, max_shard_samples=10, append=True) as w:
            for i in range(20, 30):
                w.write(labelled_sample(i))
        assert ds.refresh().num_samples == 30
        _check_shard(ds, 2)


def test_not_a_dataset_names_the_url(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with RangeServer(str(empty)) as srv:
        cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
        with pytest.raises(ShardError, match="no index.arrow") as err:
            mirror_index(srv.url + "/nothing", cache)
        assert err.value.shard == srv.url + "/nothing"


def test_corrupt_remote_shard_is_refused(tmp_path, make_dataset):
    root = make_dataset(50, shard_samples=25)
    idx = open_index(root)
    with open(idx.path(0), "r+b") as f:  # damage the shard after the index recorded its hash
        f.seek(700)
        f.write(b"\xff")
    with RangeServer(root) as srv:
        cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
        ds = RemoteDataset(srv.url, cache)
        with pytest.raises(ShardError, match="does not match"):
            ds.get(0)
        assert os.listdir(cache.data_dir) == []  # nothing cached (the budget also counts the mirrored index)
        _check_shard(ds, 1)
