"""Never stale: a dataset rewritten at the same URL is read as its new
version through a cache that holds the old one (index, commit log, shards,
sidecars), and the mirror is revalidated with conditional requests (304),
not fetched again."""

from __future__ import annotations

import os
import shutil

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache import FetchOptions, ShardCache
from shardfeed.formats import ShardWriter
from shardfeed.loader import ShardDataset

FAST = FetchOptions(range_bytes=4096, threads=2, attempts=2, backoff_s=0.01, stall_s=5.0)


def _write(root: str, n: int, tag: int, append: bool = False) -> None:
    shutil.rmtree(root, ignore_errors=True)
    with ShardWriter(root, max_shard_samples=8, append=append) as w:
        for i in range(n):
            s = labelled_sample(i, 256)
            s["cls"] = tag * 1000 + i  # v1 and v2 differ in every sample, keys alike
            w.write(s)


def _read(url: str, cache_dir: str) -> list[int]:
    ds = ShardDataset(url, shuffle="none", cache_dir=cache_dir, cache_limit_bytes=8 << 20)
    return sorted(int(s["cls"]) for s in ds)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("append", [False, True], ids=["index", "live-log"])
@pytest.mark.parametrize("n2", [40, 56], ids=["same-count", "more-samples"])
def test_dataset_rewritten_at_the_same_url_is_read_new(tmp_path, append, n2):
    root, cdir = str(tmp_path / "ds"), str(tmp_path / "c")
    _write(root, 40, 1, append)
    with RangeServer(root) as srv:
        assert _read(srv.url, cdir) == [1000 + i for i in range(40)]
        _write(root, n2, 2, append)
        assert _read(srv.url, cdir) == [2000 + i for i in range(n2)]


@pytest.mark.timeout(120)
def test_live_log_shrunk_at_the_same_url_drops_the_old_entries(tmp_path):
    root, cdir = str(tmp_path / "ds"), str(tmp_path / "c")
    _write(root, 40, 1, append=True)
    with RangeServer(root) as srv:
        assert len(_read(srv.url, cdir)) == 40
        _write(root, 16, 2, append=True)
        assert _read(srv.url, cdir) == [2000 + i for i in range(16)]


@pytest.mark.timeout(120)
def test_unchanged_mirror_is_revalidated_not_refetched(tmp_path):
    root, cdir = str(tmp_path / "ds"), str(tmp_path / "c")
    _write(root, 40, 1, append=True)
    with RangeServer(root) as srv:
        _read(srv.url, cdir)
        bodies = srv.gets(".json")
        _read(srv.url, cdir)
        assert srv.gets(".json") == 2 * bodies  # one GET per entry, as a conditional one would be
    from shardfeed.cache.remote.remote_index import mirror_folder

    folder = mirror_folder(srv.url, ShardCache(cdir, 8 << 20))
    entry = os.path.join(folder, "_log", sorted(os.listdir(os.path.join(folder, "_log")))[0])
    # an entry (immutable, a few hundred bytes) keeps no version: its attribute would take a disk block of its
    # own where inodes are small, doubling each commit's disk
    assert "user.shardfeed.source" not in os.listxattr(entry)


@pytest.mark.timeout(120)
def test_get_without_a_hash_serves_the_new_version(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    (root / "blob.bin").write_bytes(b"a" * 10_000)
    with RangeServer(str(root)) as srv:
        cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
        url = f"{srv.url}/blob.bin"
        assert open(cache.get(url), "rb").read() == b"a" * 10_000
        assert open(cache.get(url), "rb").read() == b"a" * 10_000
        os.unlink(root / "blob.bin")
        (root / "blob.bin").write_bytes(b"b" * 10_000)  # same size, same URL
        assert open(cache.get(url), "rb").read() == b"b" * 10_000
        assert cache.used_bytes() - cache.budget.fixed_bytes() == os.stat(cache.path_for(url)).st_blocks * 512
        assert len(os.listdir(cache.data_dir)) == 1  # the old copy is gone


@pytest.mark.timeout(300)
@pytest.mark.parametrize("append", [False, True], ids=["index", "live-log"])
def test_s3_dataset_rewritten_at_the_same_prefix_is_read_new(tmp_path, moto_endpoint, append):
    import boto3

    from cache_servers import s3_options, upload_folder

    s3 = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    bucket = f"stale-{int(append)}"
    s3.create_bucket(Bucket=bucket)
    root, cdir, url = str(tmp_path / "ds"), str(tmp_path / "c"), f"s3://{bucket}/ds"

    def publish(n, tag):
        _write(root, n, tag, append)
        for obj in s3.list_objects_v2(Bucket=bucket, Prefix="ds/").get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])  # a rewrite: what v2 lacks is gone
        upload_folder(moto_endpoint, bucket, root, "ds")

    def read():
        ds = ShardDataset(url, shuffle="none", cache_dir=cdir, cache_limit_bytes=8 << 20,
                          storage_options=s3_options(moto_endpoint))
        return sorted(int(s["cls"]) for s in ds)

    publish(40, 1)
    assert read() == [1000 + i for i in range(40)]
    publish(40, 2)
    assert read() == [2000 + i for i in range(40)]
    publish(24, 3)
    assert read() == [3000 + i for i in range(24)]
