"""Fast paths return exactly what the slow paths do.

Parquet under ``global`` order keeps decoded row groups (formats/columns.py)
instead of decoding one per sample; the batches must equal those of the same
samples stored as tar, whatever the budget for decoded bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.formats import decompressed
from shardfeed.formats.batch import BatchReader
from shardfeed.formats.columns import DECODED
from shardfeed.formats.index import open_index
from shardfeed.loader import Loader, ShardDataset

from conftest import labelled_sample


def _batches(root, workers=0, shuffle="global", **kw):
    with Loader(ShardDataset(root, shuffle=shuffle, seed=3), batch_size=16, num_workers=workers, **kw) as ld:
        return [{k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in b.items()} for b in ld]


@pytest.mark.parametrize("workers", [0, 2])
def test_parquet_global_equals_tar_global(make_dataset, workers):
    tar = make_dataset(300, shard_samples=60)
    parquet = make_dataset(300, shard_samples=60, format="parquet")
    got, want = _batches(parquet, workers), _batches(tar, workers)
    assert got == want
    assert sorted(k for b in got for k in b["__key__"]) == [f"{i:08d}" for i in range(300)]


def test_parquet_rows_across_row_groups_match_samples(tmp_path):
    """Rows of several row groups of one shard in one batch, in random order
    with repeats: each row is the sample written, the whole shard decoded once."""
    from shardfeed.formats import ShardWriter
    from shardfeed.formats.writer import _ColumnarShard

    root = str(tmp_path / "pq")
    groups = _ColumnarShard.ROWS_PER_GROUP
    n = groups * 2 + 100  # three row groups in one shard
    with ShardWriter(root, format="parquet") as w:
        for i in range(n):
            w.write(labelled_sample(i, payload_bytes=16))
    index = open_index(root)
    reader = BatchReader(index)
    try:
        ids = np.random.default_rng(0).integers(0, n, 500)
        for _ in range(2):  # the second read comes from the kept decoded shard
            raw = reader.read(ids)
            assert raw.keys == [f"{i:08d}" for i in ids.tolist()]
            _, starts, sizes = raw.fields["bin"]
            for r, i in enumerate(ids.tolist()):
                assert raw.buf[starts[r]:starts[r] + sizes[r]].tobytes() == labelled_sample(i, 16)["bin"]
            assert raw.fields["cls"][1].tolist() == [i % 10 for i in ids.tolist()]
        assert DECODED.nbytes() > 0
    finally:
        reader.close()
    assert DECODED.nbytes() == 0  # closing the shard gives its decoded bytes back


def test_parquet_global_under_a_tiny_budget(make_dataset, monkeypatch):
    """A budget too small for one row group: nothing is kept, every group is
    decoded when needed, and the batches are still right."""
    monkeypatch.setattr(decompressed, "LIMIT", 1)
    tar = make_dataset(200, shard_samples=50)
    parquet = make_dataset(200, shard_samples=50, format="parquet")
    assert _batches(parquet) == _batches(tar)
    assert DECODED.nbytes() == 0
