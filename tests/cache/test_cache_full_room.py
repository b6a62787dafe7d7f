"""A cache as large as the dataset, read by several workers in the global order, over real
loopback servers (HTTP with Range, moto's S3): no reader waits for room that only the node's
own pins hold. Every object's bytes as the limit once left the budget a few kB short of the
whole data (the mirrored index and the lookahead plans beside it); the range policy took the
data for fitting, admitted every shard whole, and the workers pinned all of it while one of
them waited for room for the last sidecar, holding that shard's fetch lock: a silent hang."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cache_servers import RangeServer, s3_options, upload_folder
from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset

SAMPLES, PER_SHARD, PAYLOAD = 640, 32, 8192


def _sample(i: int) -> dict:
    return {"__key__": f"{i:08d}", "cls": i % 100,
            "bin": np.random.default_rng(i).integers(0, 256, PAYLOAD, dtype=np.uint8).tobytes()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("full") / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(SAMPLES):
            w.write(_sample(i))
    return root


def _object_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def _three_epochs(ds) -> None:
    with Loader(ds, 64, num_workers=2) as loader:
        for epoch in range(3):
            ds.set_epoch(epoch)
            keys = [k for b in loader for k in b["__key__"]]
            assert sorted(keys) == [f"{i:08d}" for i in range(SAMPLES)], f"epoch {epoch}"  # every sample once


@pytest.mark.timeout(40)
def test_cache_of_the_dataset_bytes_two_workers_global_over_http(tmp_path, dataset):
    with RangeServer(dataset) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=0, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=_object_bytes(dataset))
        _three_epochs(ds)


@pytest.mark.timeout(40)
def test_cache_of_the_dataset_bytes_two_workers_global_over_s3(tmp_path, dataset, moto_endpoint):
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="full")
    upload_folder(moto_endpoint, "full", dataset, "ds")
    ds = ShardDataset("s3://full/ds", shuffle="global", seed=0, cache_dir=str(tmp_path / "c"),
                      cache_limit_bytes=_object_bytes(dataset), storage_options=s3_options(moto_endpoint))
    _three_epochs(ds)
