"""A reader of sample ranges keeps its shards open between reads (cache/ranged_reads.py
RANGED_MAX_OPEN): a global order touches most shards every few steps, so a reader that
keeps fewer open than the dataset has reopens several a batch (a pin and a sidecar read
each). A loopback HTTP dataset of 96 shards through a cache of half of it."""

from __future__ import annotations

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset

N, PAYLOAD, PER_SHARD, BATCH = 384, 8192, 4, 8


@pytest.fixture(autouse=True)
def _default_ranges(monkeypatch):
    from shardfeed.cache import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", None)  # 8 KiB samples: ranges by default


def test_a_ranged_reader_opens_each_shard_about_once(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, PAYLOAD))
    ix = open_index(root)
    shards = len(ix)
    assert shards == 96
    with RangeServer(root) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=6, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=int(ix.sizes.sum()) // 2)
        opens, batches = [], 0
        with Loader(ds, BATCH) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                for b in loader:
                    batches += 1
                    if batches == 1:  # the reader exists once the first batch is read: count its opens
                        cached, table = loader._maker.cached, loader._maker.reader.shards
                        assert cached.ranged and table.path_of == cached.path_of
                        table.path_of = lambda i, path_of=cached.path_of: (opens.append(i), path_of(i))[1]
                    for k, payload in zip(b["__key__"], b["bin"]):
                        assert bytes(payload) == labelled_sample(int(k), PAYLOAD)["bin"]
    # each shard opened as it is first read (as a partial copy or whole), not again at every few
    # batches: at 64 kept open of 96 this read reopened about a third of the shards it touched
    assert batches == 2 * N // BATCH
    assert len(opens) <= shards + 8, len(opens)
