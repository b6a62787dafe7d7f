"""The cache against hostile or broken HTTP servers (real loopback server,
tests/cache_servers.py Fault): every failure is bounded in time and memory,
named for what it is, and leaves nothing wrong cached."""

from __future__ import annotations

import os
import resource
import socket
import time

import pytest
import xxhash

from cache_servers import Fault, RangeServer
from conftest import labelled_sample
from shardfeed.cache import FetchOptions, ShardCache, mirror_index
from shardfeed.formats import ShardError, ShardWriter

pytestmark = pytest.mark.hostile  # bounded time and memory (conftest.py)

FAST = FetchOptions(range_bytes=64 << 10, threads=2, attempts=3, backoff_s=0.01, stall_s=1.0, min_rate=1000,
                    deadline_s=20.0)
SIZE = 300_000


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    data = os.urandom(SIZE)
    (root / "blob.bin").write_bytes(data)
    with RangeServer(str(root)) as srv:
        yield srv, data, xxhash.xxh3_128_hexdigest(data)


def _cache(tmp_path, **kw):
    return ShardCache(str(tmp_path / "c"), 10 << 20, fetch=FetchOptions(**{**FAST.__dict__, **kw}))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _nothing_cached(cache) -> bool:
    return cache.used_bytes() == cache.budget.fixed_bytes() and not os.listdir(cache.data_dir)  # its folders


@pytest.mark.timeout(60)
def test_endless_body_fails_bounded(tmp_path, served):
    srv, _, h = served
    srv.faults.append(Fault("blob.bin", "endless", times=99))
    cache, rss, t0 = _cache(tmp_path), _peak_rss_mb(), time.monotonic()
    with pytest.raises(ShardError, match="ignored the Range request and sent an unknown size") as e:
        cache.get(f"{srv.url}/blob.bin", h, SIZE)
    assert e.value.shard == f"{srv.url}/blob.bin"
    assert time.monotonic() - t0 < 15 and _peak_rss_mb() - rss < 50 and _nothing_cached(cache)


@pytest.mark.timeout(60)
def test_a_server_answering_200_to_range_is_read_once(tmp_path, served):
    srv, data, h = served
    srv.faults.append(Fault("blob.bin", "ignore_range", times=99))
    cache = _cache(tmp_path)
    with pytest.warns(RuntimeWarning, match="ignores HTTP Range requests"):  # named once, with its cost
        assert open(cache.get(f"{srv.url}/blob.bin", h, SIZE), "rb").read() == data
    assert srv.gets("blob.bin") == 1  # the whole body once, not once per 64 KiB range


@pytest.mark.timeout(60)
def test_trickle_fails_within_the_deadline_naming_the_url(tmp_path, served):
    srv, _, h = served
    srv.faults.append(Fault("blob.bin", "trickle", times=99, stall_s=0.4))
    cache, t0 = _cache(tmp_path), time.monotonic()
    with pytest.raises(ShardError, match="too slow") as e:
        cache.get(f"{srv.url}/blob.bin", h, SIZE)
    assert e.value.shard == f"{srv.url}/blob.bin" and "minimum rate" in e.value.reason
    assert time.monotonic() - t0 < 12 and _nothing_cached(cache)  # 3 tries of ~1 s grace each


@pytest.mark.timeout(60)
def test_deadline_bounds_a_fetch_of_many_slow_retries(tmp_path, served):
    srv, _, h = served
    srv.faults.append(Fault("blob.bin", "trickle", times=99, stall_s=0.4))
    cache, t0 = _cache(tmp_path, attempts=50, deadline_s=3.0, backoff_s=0.5), time.monotonic()
    with pytest.raises(ShardError) as e:
        cache.get(f"{srv.url}/blob.bin", h, SIZE)
    assert "deadline" in e.value.reason and time.monotonic() - t0 < 8


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_5xx_is_retried_then_named(tmp_path, served, method):
    srv, data, h = served
    srv.faults.append(Fault("blob.bin", "503", times=2, methods=(method,)))
    cache = _cache(tmp_path)
    assert open(cache.get(f"{srv.url}/blob.bin", h), "rb").read() == data  # size unknown: HEAD, then GETs
    srv.faults.append(Fault("blob.bin", "503", times=99, methods=(method,)))
    with pytest.raises(ShardError, match=r"server error \(HTTP 503") as e:
        _cache(tmp_path / "2").get(f"{srv.url}/blob.bin", h)
    assert "after 3 attempts" in e.value.reason and "not found" not in e.value.reason


@pytest.mark.timeout(60)
def test_changed_etag_mid_file_is_never_stitched(tmp_path, served):
    srv, _, _ = served
    srv.faults.append(Fault("blob.bin", "etag", times=1, skip=1))  # the second range sees another version
    cache = _cache(tmp_path, threads=1)
    with pytest.raises(ShardError, match="changed at the source while being fetched"):
        cache.get(f"{srv.url}/blob.bin")  # no hash to catch it afterwards: the ETag must
    assert _nothing_cached(cache)


@pytest.mark.timeout(60)
def test_wrong_content_range_is_refused(tmp_path, served):
    srv, _, _ = served
    srv.faults.append(Fault("blob.bin", "wrong_range", times=99, skip=1))
    cache = _cache(tmp_path, threads=1)
    with pytest.raises(ShardError, match="with Content-Range 'bytes 0-0/300000'"):
        cache.get(f"{srv.url}/blob.bin")
    assert _nothing_cached(cache)


@pytest.mark.timeout(60)
def test_huge_log_entry_is_refused_unread(tmp_path):
    root = str(tmp_path / "live")
    with ShardWriter(root, max_shard_samples=4, append=True) as w:
        for i in range(8):
            w.write(labelled_sample(i))
    with RangeServer(root) as srv:
        srv.faults.append(Fault("000000000002.json", "huge", times=99))
        cache, rss = _cache(tmp_path), _peak_rss_mb()
        with pytest.raises(ShardError, match="claims 629,145,600 bytes, more than the 65,536 allowed") as e:
            mirror_index(srv.url, cache)
        assert e.value.shard.endswith("_log/000000000002.json") and _peak_rss_mb() - rss < 50


@pytest.mark.timeout(60)
def test_5xx_on_the_index_is_not_reported_as_no_dataset(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=4) as w:
        for i in range(8):
            w.write(labelled_sample(i))
    with RangeServer(root) as srv:
        srv.faults.append(Fault("index.arrow", "503", times=99))
        with pytest.raises(ShardError, match=r"server error \(HTTP 503") as e:
            mirror_index(srv.url, _cache(tmp_path))
        assert "no index.arrow" not in e.value.reason


@pytest.mark.timeout(60)
def test_5xx_on_a_sidecar_is_not_a_missing_sidecar(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=4) as w:
        for i in range(8):
            w.write(labelled_sample(i))
    from shardfeed.cache import RemoteDataset

    with RangeServer(root) as srv:
        ds = RemoteDataset(srv.url, _cache(tmp_path))
        srv.faults.append(Fault(".idx", "503", times=99, methods=("HEAD", "GET")))
        with pytest.raises(ShardError, match=r"server error \(HTTP 503"):
            ds.get(0)
        assert not [n for n in os.listdir(ds.cache.data_dir) if n.endswith(".noidx")]


@pytest.mark.timeout(60)
def test_connection_refused_and_dns_failure_are_named(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nobody listens there
    cache = _cache(tmp_path, attempts=2)
    with pytest.raises(ShardError, match="connection refused"):
        cache.get(f"http://127.0.0.1:{port}/x.bin")
    with pytest.raises(ShardError, match="not found \\(DNS"):
        cache.get("http://no-such-host.invalid/x.bin")
