"""Fetching by URL scheme: http, s3 (moto) and file; retries; refusals."""

from __future__ import annotations

import os

import pytest
import xxhash

from cache_servers import Fault, RangeServer, s3_options, upload_folder
from shardfeed.cache import FetchOptions, ShardCache, open_source
from shardfeed.formats import ShardError

FAST = FetchOptions(range_bytes=64 << 10, threads=4, attempts=3, backoff_s=0.01, stall_s=1.0)


def _blob(folder, name="blob.bin", size=300_000, seed=1) -> tuple[str, bytes, str]:
    data = os.urandom(0) or bytes((i * 7 + seed) % 251 for i in range(size))
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path, data, xxhash.xxh3_128_hexdigest(data)


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    with RangeServer(str(root)) as srv:
        yield srv, str(root)


def _cache(tmp_path, limit=10 << 20, **kw):
    return ShardCache(str(tmp_path / "cache"), limit, fetch=kw.pop("fetch", FAST), **kw)


def test_get_over_http_in_ranges(tmp_path, served):
    srv, root = served
    _, data, h = _blob(root)
    cache = _cache(tmp_path)
    path = cache.get(f"{srv.url}/blob.bin", h)
    assert open(path, "rb").read() == data
    assert srv.gets("blob.bin") == 5  # 300,000 bytes in 64 KiB ranges
    assert cache.get(f"{srv.url}/blob.bin", h) == path and srv.gets("blob.bin") == 5
    st = cache.stats()
    assert (st["hits"], st["misses"], st["bytes_fetched"]) == (1, 1, len(data))


def test_get_over_s3(tmp_path, moto_endpoint):
    import boto3

    _, data, h = _blob(str(tmp_path))
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    s3.create_bucket(Bucket="blobs")
    upload_folder(moto_endpoint, "blobs", str(tmp_path), "p")
    cache = _cache(tmp_path, storage_options=s3_options(moto_endpoint))
    path = cache.get("s3://blobs/p/blob.bin", h)
    assert open(path, "rb").read() == data
    with pytest.raises(ShardError, match="s3://blobs/p/missing.bin"):
        cache.get("s3://blobs/p/missing.bin")


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_get_local_path_and_file_url(tmp_path, prefix):
    src, data, h = _blob(str(tmp_path))
    path = _cache(tmp_path).get(prefix + src, h)
    assert path != src and open(path, "rb").read() == data


@pytest.mark.parametrize("kind", ["reset", "500", "stall"])
def test_one_fault_is_retried(tmp_path, served, kind):
    srv, root = served
    _, data, h = _blob(root)
    srv.faults.append(Fault("blob.bin", kind, times=1, stall_s=3.0))
    path = _cache(tmp_path).get(f"{srv.url}/blob.bin", h)
    assert open(path, "rb").read() == data
    assert srv.gets("blob.bin") == 6  # five ranges, one of them twice


def test_persistent_failure_names_url_and_reason(tmp_path, served):
    srv, root = served
    _blob(root)
    srv.faults.append(Fault("blob.bin", "500", times=1000))
    cache = _cache(tmp_path)
    url = f"{srv.url}/blob.bin"
    with pytest.raises(ShardError, match="after 3 attempts") as err:
        cache.get(url, size=300_000)
    assert err.value.shard == url and "500" in err.value.reason
    assert os.listdir(cache.data_dir) == []  # no temporary left behind


def test_missing_object_is_not_retried(tmp_path, served):
    srv, _ = served
    with pytest.raises(ShardError, match="not found"):
        _cache(tmp_path).get(f"{srv.url}/nope.bin", size=10)
    assert srv.gets("nope.bin") == 1


def test_hash_mismatch_raises_and_leaves_nothing(tmp_path, served):
    srv, root = served
    _blob(root)
    cache = _cache(tmp_path)
    with pytest.raises(ShardError, match="does not match") as err:
        cache.get(f"{srv.url}/blob.bin", "0" * 32)
    assert err.value.shard == f"{srv.url}/blob.bin"
    assert os.listdir(cache.data_dir) == [] and cache.used_bytes() == cache.budget.fixed_bytes()  # its folders


@pytest.mark.parametrize("url,why", [("pipe:curl http://x/a.tar", "shell"), ("ftp2://host/a.tar", "unknown URL scheme")])
def test_refused_schemes_name_the_url(url, why):
    with pytest.raises(ShardError, match=why) as err:
        open_source(url)
    assert err.value.shard == url


def test_cache_stands_on_formats_only():
    import subprocess
    import sys

    code = ("import sys, shardfeed.cache; bad = [m for m in ('torch', 'shardfeed.loader', 'shardfeed.tools') "
            "if m in sys.modules]; sys.exit(str(bad) if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_damaged_local_shard_through_the_cache_is_refused_and_not_cached(tmp_path):
    """A local dataset read with a cache_dir: a shard damaged after indexing is
    hashed like a remote one, never cached under its expected hash nor delivered."""
    from conftest import labelled_sample
    from shardfeed.formats import ShardWriter, open_index
    from shardfeed.loader import ShardDataset

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(24):
            w.write(labelled_sample(i, 512))
    p = open_index(root).path(1)
    data = bytearray(open(p, "rb").read())
    data[1000] ^= 0xFF  # inside a payload: same size, other bytes
    open(p, "wb").write(bytes(data))
    cdir = str(tmp_path / "c")
    ds = ShardDataset(root, shuffle="none", cache_dir=cdir, cache_limit_bytes=1 << 20)
    with pytest.raises(ShardError, match="does not match the expected"):
        list(ds)
    expected = ShardCache.key_for(p, open_index(root).hashes[1])
    assert not os.path.exists(os.path.join(cdir, "data", expected))
