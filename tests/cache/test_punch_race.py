"""Consumed samples punched out of a partial copy (cache/ranges.py) while another
reader of the node still needs them: two Loader workers under the global order
read one shard's sample a step apart (the first at the end of an epoch, the
second early in the next), and the first worker's punch, or its punch retried
later, came between the second's prepare (sample present, checked) and its
read, which then met a hole: "fails its checksum (bytes damaged on disk)", about
1 run in 5 of 3 epochs over 1,000 x 8 KiB samples at a 50% cache. Here the two
readers are ordered explicitly in one process (their locks conflict as across
processes)."""

from __future__ import annotations

import numpy as np
import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache.readers.reads import CacheSpec
from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.readers import open_shard

PER_SHARD, PAYLOAD, SHARDS = 8, 16384, 3


@pytest.fixture(autouse=True)
def _ranges(monkeypatch):
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", True)


def test_a_punch_spares_a_sample_another_reader_prepared(tmp_path):
    from shardfeed.cache.readers.ranged_reads import RangedShards

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(SHARDS * PER_SHARD):
            w.write(labelled_sample(i, PAYLOAD))
    ix = open_index(root)
    spec = CacheSpec(str(tmp_path / "c"), int(ix.sizes.sum()) // 3)  # no room for a whole shard: ranges
    with RangeServer(root) as srv:
        first, second = (RangedShards(ix, spec, lambda i: f"{srv.url}/{ix.names[i]}") for _ in range(2))
        first.finish(first.prepare([3]))  # the cost model and the reserve set up (shard 0 may come whole)
        ids = np.array([PER_SHARD + 3, PER_SHARD + 4], np.int64)  # samples 3 and 4 of shard 1
        fetcher = first.policy().fetcher
        ref = first.ref(1)
        early = second.prepare(ids)  # the second worker's next batch, made present before its read
        try:
            first.finish(first.prepare(ids))  # the first worker reads them and gives their blocks back
            assert fetcher.present(ref, [3, 4]), "punched while another reader had them prepared"
            with open_shard(ix, 1, fetcher.path(ref)) as r:  # the second worker's read
                for j in (3, 4):
                    got = r.read(j)
                    assert got["__key__"] == f"{PER_SHARD + j:08d}"
                    assert bytes(got["bin"]) == labelled_sample(PER_SHARD + j, PAYLOAD)["bin"]
        finally:
            second.finish(early)
        assert not fetcher.present(ref, [3]) and not fetcher.present(ref, [4])  # given back by the last reader
