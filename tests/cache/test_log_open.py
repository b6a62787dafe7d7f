"""A remote dataset with a long commit log opens fast: the log's entries are asked LOG_FETCHES
at once (each is a round trip of a few hundred bytes), and only those after the checkpoint
index.arrow holds (`shardfeed compact`) are read at all. Real loopback servers add the latency
per request themselves (HTTP: the test server; S3: moto behind the benchmark's shaped proxy).
One entry at a time, a 10,000-commit log took more than 150 s to open at 20 ms a request."""

from __future__ import annotations

import json
import os
import time

import pytest

from cache_servers import RangeServer, s3_options
from shardfeed.formats import ShardWriter, compact, open_index
from shardfeed.formats.commit_log import LOG_DIR
from shardfeed.loader import Loader, ShardDataset

LATENCY_S = 0.02


def _long_log(root: str, commits: int) -> None:
    """A growing dataset of ``commits`` commits, each a shard of 4 samples: one shard written,
    linked under every name (same bytes, same hash), and a log entry naming each."""
    os.makedirs(os.path.join(root, LOG_DIR))
    with ShardWriter(os.path.join(root, "one"), max_shard_samples=4) as w:
        for i in range(4):
            w.write({"__key__": f"{i:08d}", "cls": i})
    one = open_index(os.path.join(root, "one"))
    src = os.path.join(root, "one", one.names[0])
    for seq in range(1, commits + 1):
        name = f"s-{seq:06d}.tar"
        os.link(src, os.path.join(root, name))
        os.link(src + ".idx", os.path.join(root, name + ".idx"))
        with open(os.path.join(root, LOG_DIR, f"{seq:012d}.json"), "w") as f:
            json.dump({"name": name, "format": "tar", "samples": 4, "bytes": int(one.sizes[0]),
                       "hash": one.hashes[0], "fields": ["cls"]}, f)


def _open_s(ds_kwargs: dict) -> tuple[float, int]:
    t0 = time.monotonic()
    ds = ShardDataset(**ds_kwargs)
    took = time.monotonic() - t0
    with Loader(ds, 4) as loader:
        first = next(iter(loader))
    assert len(first["__key__"]) == 4
    return took, len(ds.index)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("follow", [False, True])
def test_a_log_is_read_many_entries_at_once_over_http(tmp_path, follow):
    commits = 80
    _long_log(str(tmp_path / "warm"), 2)
    _long_log(str(tmp_path / "ds"), commits)
    with RangeServer(str(tmp_path)) as srv:
        srv.latency_s = LATENCY_S
        kw = dict(cache_dir=str(tmp_path / "c"), seed=0)
        if follow:
            kw.update(follow=True, poll_s=0.02, idle_timeout_s=1)
        ShardDataset(**dict(kw, source=f"{srv.url}/warm"))  # the first open in a process imports what it uses
        srv.max_in_flight = 0
        took, n = _open_s(dict(kw, source=f"{srv.url}/ds"))
        assert srv.max_in_flight >= 4, srv.max_in_flight  # one at a time: 1
    assert n == commits


@pytest.mark.timeout(120)
def test_a_log_is_read_many_entries_at_once_over_s3(tmp_path):
    from shardfeed.tools.bench.s3_link import ShapedS3

    commits = 60
    _long_log(str(tmp_path / "warm"), 2)
    _long_log(str(tmp_path / "ds"), commits)
    with ShapedS3(1e9, LATENCY_S) as s3:
        kw = dict(cache_dir=str(tmp_path / "c"), seed=0, storage_options=s3_options(s3.endpoint))
        ShardDataset(**dict(kw, source=s3.upload(str(tmp_path / "warm"), "warm")))  # imports, the S3 client's start
        url = s3.upload(str(tmp_path / "ds"), "long")
        s3.link.max_in_flight = 0
        took, n = _open_s(dict(kw, source=url))
        # requests side by side, counted by the server: a wall-clock bound here failed on a loaded machine
        # (2.0-2.7 s against 1.2) with the fetches as concurrent as on a quiet one
        assert s3.link.max_in_flight >= 4, s3.link.max_in_flight  # one at a time: 1
    assert n == commits


@pytest.mark.slow  # 10,000 commits written, compacted and put on moto: ~1 minute here; each open ~1 s
@pytest.mark.timeout(600)
def test_a_compacted_10000_commit_log_opens_in_seconds_over_http_and_s3(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from shardfeed.tools.bench.s3_link import BUCKET, ShapedS3

    root = str(tmp_path / "ds")
    _long_log(root, 10_000)
    compact(root)  # the checkpoint: index.arrow folds the 10,000 commits (their entries stay)
    _long_log(str(tmp_path / "warm"), 2)
    with RangeServer(str(tmp_path)) as srv:
        srv.latency_s = LATENCY_S
        ShardDataset(f"{srv.url}/warm", cache_dir=str(tmp_path / "c"), seed=0)
        took, n = _open_s(dict(source=f"{srv.url}/ds", cache_dir=str(tmp_path / "c"), seed=0))
    assert n == 10_000 and took < 10, took
    with ShapedS3(1e9, LATENCY_S) as s3:
        files = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
        with ThreadPoolExecutor(16) as pool:  # the index, every log entry and the shards read first
            list(pool.map(lambda rel: s3._client.upload_file(os.path.join(root, rel), BUCKET, f"long/{rel}"),
                          [f for f in files if not f.startswith("s-") or f < "s-000100"]))
        kw = dict(cache_dir=str(tmp_path / "c3"), seed=0, shuffle="none", storage_options=s3_options(s3.endpoint))
        ShardDataset(**dict(kw, source=s3.upload(str(tmp_path / "warm"), "warm")))
        took, n = _open_s(dict(kw, source=f"s3://{BUCKET}/long"))
    assert n == 10_000 and took < 10, took
