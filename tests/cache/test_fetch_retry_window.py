"""A fault is retried for a time window, not only a number of tries (cache/fetch.py
``retry_s``): a 503 storm on a real loopback server (tests/cache_servers.py) that is
shorter than the window is ridden out, one longer fails naming how long it was tried,
and a remote follower's fetches get a window of a minute (loader/remote_follow.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import xxhash

from cache_servers import Fault, RangeServer
from shardfeed.cache import FetchOptions, ShardCache
from shardfeed.formats import ShardError, ShardWriter
from shardfeed.formats.commit_log import LOG_DIR
from shardfeed.loader import Loader, ShardDataset

QUICK = dict(range_bytes=64 << 10, threads=2, attempts=3, backoff_s=0.02, max_backoff_s=0.2, stall_s=2.0,
             deadline_s=60.0)


def _storm(srv: RangeServer, suffix: str, seconds: float) -> threading.Timer:
    """Every request of paths ending in ``suffix`` answered 503 for the next ``seconds``."""
    fault = Fault(suffix, "503", times=10 ** 9, methods=("GET", "HEAD"))
    srv.faults.append(fault)
    timer = threading.Timer(seconds, lambda: setattr(fault, "times", 0))
    timer.start()
    return timer


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    data = os.urandom(200_000)
    (root / "blob.bin").write_bytes(data)
    with RangeServer(str(root)) as srv:
        yield srv, data, xxhash.xxh3_128_hexdigest(data)


@pytest.mark.timeout(60)
def test_a_storm_shorter_than_the_window_is_ridden_out(tmp_path, served):
    srv, data, digest = served
    cache = ShardCache(str(tmp_path / "c"), 10 << 20, fetch=FetchOptions(**QUICK, retry_s=5.0))
    timer = _storm(srv, ".bin", 1.5)
    t0 = time.monotonic()
    path = cache.get(f"{srv.url}/blob.bin", digest, len(data))
    waited = time.monotonic() - t0
    timer.join()
    with open(path, "rb") as f:
        assert f.read() == data
    assert 1.2 < waited < 5.0  # through the storm, not past the window
    assert srv.gets(".bin") > QUICK["attempts"]  # more tries than attempts alone allow


@pytest.mark.timeout(60)
def test_without_the_window_or_past_it_the_fetch_fails_naming_why(tmp_path, served):
    srv, data, digest = served
    url = f"{srv.url}/blob.bin"
    timer = _storm(srv, ".bin", 4.0)
    t0 = time.monotonic()
    with pytest.raises(ShardError, match=r"failed after 3 attempts; last: .*503"):
        ShardCache(str(tmp_path / "a"), 10 << 20, fetch=FetchOptions(**QUICK)).get(url, digest, len(data))
    assert time.monotonic() - t0 < 1.5  # three quick tries: the storm is still on
    with pytest.raises(ShardError, match=r"failed after \d+ attempts over 1 s; last: .*503"):
        ShardCache(str(tmp_path / "b"), 10 << 20, fetch=FetchOptions(**QUICK, retry_s=1.0)).get(url, digest,
                                                                                              len(data))
    assert time.monotonic() - t0 < 3.5
    timer.join()
    with pytest.raises(ValueError, match="retry_s"):
        FetchOptions(retry_s=-1)


@pytest.mark.timeout(120)
def test_a_follower_rides_out_a_storm_longer_than_its_tries(tmp_path, monkeypatch):
    """Two tries (SHARDFEED_FETCH_ATTEMPTS=2) span about 0.3 s, and a reader refetches a failed
    shard once; a follower's shard fetches go on through a 3 s storm of 503s and deliver every
    sample once."""
    root = str(tmp_path / "srv" / "ds")
    os.makedirs(os.path.join(root, LOG_DIR))
    with ShardWriter(root, append=True, max_shard_samples=4, prefix="w") as w:
        for i in range(12):
            w.write({"__key__": f"w-{i:05d}", "cls": i})
        w.end_stream()
    monkeypatch.delenv("SHARDFEED_FETCH_RETRY_S", raising=False)
    monkeypatch.setenv("SHARDFEED_FETCH_ATTEMPTS", "2")
    with RangeServer(str(tmp_path / "srv")) as srv:
        ds = ShardDataset(f"{srv.url}/ds", follow=True, cache_dir=str(tmp_path / "c"), poll_s=0.02,
                          idle_timeout_s=60)
        assert ds.cache.fetch.retry_s == 60.0
        timer = _storm(srv, ".tar", 3.0)
        t0 = time.monotonic()
        with Loader(ds, 4) as loader:
            got = [k for b in loader for k in b["__key__"]]
        timer.join()
        assert time.monotonic() - t0 > 2.5  # the first shard came after the storm
    assert sorted(got) == [f"w-{i:05d}" for i in range(12)] and len(got) == 12
    monkeypatch.setenv("SHARDFEED_FETCH_RETRY_S", "7")  # the environment's choice wins
    with RangeServer(str(tmp_path / "srv")) as srv:
        ds = ShardDataset(f"{srv.url}/ds", follow=True, cache_dir=str(tmp_path / "c2"), poll_s=0.02)
        assert ds.cache.fetch.retry_s == 7.0


@pytest.mark.timeout(40)
def test_a_followers_retries_never_outlast_its_idle_timeout(tmp_path, monkeypatch):
    """A 503 storm that outlasts a follower's idle_timeout_s ends it after about that wait
    (the idle timeout's error, naming the 503), not after the minute its fetch retries allow."""
    root = str(tmp_path / "srv" / "ds")
    os.makedirs(os.path.join(root, LOG_DIR))
    with ShardWriter(root, append=True, max_shard_samples=4, prefix="w") as w:
        for i in range(8):
            w.write({"__key__": f"w-{i:05d}", "cls": i})  # no end_stream: the follower waits for more
    monkeypatch.delenv("SHARDFEED_FETCH_RETRY_S", raising=False)
    monkeypatch.setenv("SHARDFEED_FETCH_ATTEMPTS", "2")  # tries end before the window: the window decides
    idle = 1.5
    with RangeServer(str(tmp_path / "srv")) as srv:
        ds = ShardDataset(f"{srv.url}/ds", follow=True, cache_dir=str(tmp_path / "c"), poll_s=0.05,
                          idle_timeout_s=idle)
        assert ds.cache.fetch.retry_s == idle
        with Loader(ds, 4) as loader:
            it = iter(loader)
            assert sum(len(next(it)["__key__"]) for _ in range(2)) == 8
            timer = _storm(srv, "", 60.0)  # every request, from now on
            t0 = time.monotonic()
            with pytest.raises(ShardError, match=r"no commit arrived .*503"):
                next(it)
            took = time.monotonic() - t0
            timer.cancel()
    assert took < idle + 4.0, f"raised {took:.1f} s into the storm, idle_timeout_s={idle:g}"
