"""Fast paths return exactly what the slow paths do.

Parquet under ``global`` order keeps decoded row groups (formats/columns.py)
instead of decoding one per sample; the batches must equal those of the same
samples stored as tar, whatever the budget for decoded bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

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


# -- byte fields as views into the batch buffer -----------------------------

def _as_bytes(batch):
    return [None if t is None else bytes(t.numpy()) for t in batch["bin"]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("format", ["tar", "parquet"])
def test_bytes_as_tensor_views_equal_bytes(make_dataset, workers, format):
    """Views, read before the next batch is asked for, hold exactly the bytes the default path copies."""
    root = make_dataset(120, shard_samples=30, format=format)
    want = _batches(root, workers)
    with Loader(ShardDataset(root, shuffle="global", seed=3), batch_size=16, num_workers=workers,
                bytes_as="tensor") as ld:
        got = []
        for b in ld:
            assert all(t.dtype == torch.uint8 and t.dim() == 1 for t in b["bin"])
            got.append((list(b["__key__"]), _as_bytes(b), b["cls"].tolist(), list(b["txt"])))
    assert got == [(w["__key__"], w["bin"], w["cls"], w["txt"]) for w in want]


def test_bytes_as_tensor_views_share_one_buffer(make_dataset):
    """No copy: every view of a batch lies in one storage."""
    root = make_dataset(64, shard_samples=32)
    with Loader(ShardDataset(root, shuffle="none"), batch_size=16, bytes_as="tensor") as ld:
        b = next(iter(ld))
    assert len({t.untyped_storage().data_ptr() for t in b["bin"]}) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_bytes_as_tensor_across_a_resume(make_dataset, workers):
    root = make_dataset(160, shard_samples=40)

    def run(state=None, stop=None):
        with Loader(ShardDataset(root, shuffle="global", seed=5), batch_size=16, num_workers=workers,
                    bytes_as="tensor") as ld:
            if state is not None:
                ld.load_state_dict(state)
            out = []
            for b in ld:
                out.append((list(b["__key__"]), _as_bytes(b)))
                if stop is not None and len(out) == stop:
                    return out, ld.state_dict()
            return out, None

    full, _ = run()
    head, state = run(stop=4)
    rest, _ = run(state)
    assert head + rest == full
    assert [x for _, bs in full for x in bs] == [labelled_sample(int(k))["bin"] for ks, _ in full for k in ks]


def test_bytes_as_unknown_value_names_the_choices(make_dataset):
    root = make_dataset(10, shard_samples=10)
    with pytest.raises(ValueError, match="bytes_as='view'.*'tensor'"):
        Loader(ShardDataset(root), batch_size=4, bytes_as="view")
