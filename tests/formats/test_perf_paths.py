"""Fast paths return exactly what the slow paths do.

Parquet under ``global`` order keeps decoded row groups (formats/engine/columns.py)
instead of decoding one per sample; the batches must equal those of the same
samples stored as tar, whatever the budget for decoded bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import labelled_sample
from loader_helpers import rows_until
from shardfeed.formats.engine import decoded_budget
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.columns import DECODED
from shardfeed.formats.open_dataset import open_index
from shardfeed.loader import Loader, ShardDataset


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
    monkeypatch.setattr(decoded_budget, "LIMIT", 1)
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
        loader = Loader(ShardDataset(root, shuffle="global", seed=5), batch_size=16, num_workers=workers,
                        bytes_as="tensor")
        return rows_until(loader, lambda b: (list(b["__key__"]), _as_bytes(b)), state, stop)

    full, _ = run()
    head, state = run(stop=4)
    rest, _ = run(state)
    assert head + rest == full
    assert [x for _, bs in full for x in bs] == [labelled_sample(int(k))["bin"] for ks, _ in full for k in ks]


def test_bytes_as_unknown_value_names_the_choices(make_dataset):
    root = make_dataset(10, shard_samples=10)
    with pytest.raises(ValueError, match="bytes_as='view'.*'tensor'"):
        Loader(ShardDataset(root), batch_size=4, bytes_as="view")


# -- fixed-shape numeric fields gathered straight into the batch -------------

def _tokens(i, n=1024, dtype=np.uint16):
    return (np.arange(n, dtype=np.int64) * 7 + i * 131).astype(dtype)


def _token_dataset(tmp_path, n=96, ragged=False, dtype=np.uint16, shape=None):
    from shardfeed.formats import ShardWriter

    root = str(tmp_path / f"tok-{ragged}-{np.dtype(dtype).str}-{shape}")
    with ShardWriter(root, max_shard_samples=32) as w:
        for i in range(n):
            t = _tokens(i, 1024 + (i % 3 if ragged else 0), dtype)
            w.write({"__key__": f"{i:06d}", "npy": t.reshape(shape) if shape else t, "cls": i})
    return root


def _identity(sample):
    return sample  # a transform: forces the per-sample (slow) path


def _token_row(b):
    v = b["npy"]
    return list(b["__key__"]), v.numpy().copy() if isinstance(v, torch.Tensor) else [np.asarray(x).copy() for x in v]


def _token_batches(root, workers, transform=None, state=None, stop=None):
    loader = Loader(ShardDataset(root, shuffle="global", seed=1, transform=transform), batch_size=16,
                    num_workers=workers)
    return rows_until(loader, _token_row, state, stop)


def _same(a, b):
    assert len(a) == len(b)
    for (ka, va), (kb, vb) in zip(a, b):
        assert ka == kb
        assert type(va) is type(vb)
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and va.shape == vb.shape and np.array_equal(va, vb)
        else:
            assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(va, vb))


@pytest.mark.parametrize("workers", [0, 2])
def test_fixed_shape_npy_tokens_equal_the_slow_path(tmp_path, workers):
    root = _token_dataset(tmp_path)
    fast, _ = _token_batches(root, workers)
    slow, _ = _token_batches(root, workers, transform=_identity)
    _same(fast, slow)
    assert fast[0][1].dtype == np.uint16 and fast[0][1].shape == (16, 1024)
    for keys, arr in fast:
        for k, row in zip(keys, arr):
            assert np.array_equal(row, _tokens(int(k)))


@pytest.mark.parametrize("dtype,shape", [(np.float32, (32, 32)), (np.int64, None), (np.dtype(">u2"), None)])
def test_npy_other_dtypes_and_shapes_equal_the_slow_path(tmp_path, dtype, shape):
    """2-D, 8-byte and big-endian values (the last left to the slow path) come out alike."""
    root = _token_dataset(tmp_path, n=40, dtype=dtype, shape=shape)
    _same(_token_batches(root, 0)[0], _token_batches(root, 0, transform=_identity)[0])


def test_ragged_npy_falls_back_to_per_sample_arrays(tmp_path):
    root = _token_dataset(tmp_path, n=40, ragged=True)
    fast, _ = _token_batches(root, 0)
    _same(fast, _token_batches(root, 0, transform=_identity)[0])
    assert isinstance(fast[0][1], list)


@pytest.mark.parametrize("workers", [0, 2])
def test_fixed_shape_npy_across_a_resume(tmp_path, workers):
    root = _token_dataset(tmp_path)
    full, _ = _token_batches(root, workers)
    head, state = _token_batches(root, workers, stop=3)
    rest, _ = _token_batches(root, workers, state=state)
    _same(head + rest, full)


def test_npy_column_gathers_equal_shapes_and_declines_others(tmp_path):
    """The fast path is taken for equal shapes (not only equal in the end), and declined for ragged ones."""
    from shardfeed.loader.collate import npy_column

    for ragged, want in ((False, np.ndarray), (True, type(None))):
        index = open_index(_token_dataset(tmp_path, n=40, ragged=ragged))
        reader = BatchReader(index)
        try:
            raw = reader.read(np.arange(40)[::-1])
            _, starts, sizes = raw.fields["npy"]
            got = npy_column(raw.buf, starts, sizes)
        finally:
            reader.close()
        assert isinstance(got, want)
        if got is not None:
            assert np.array_equal(got, np.stack([_tokens(i) for i in range(40)[::-1]]))


# -- shardfeed bench compare -------------------------------------------------

def test_bench_compare_runs_checks_content_and_reports_a_missing_peer(tmp_path):
    """Tiny run: shardfeed over tar and Parquet, content-checked, and Streaming
    (not installable beside the CPU torch here) reported as skipped, never as a number."""
    import argparse
    import json
    import sys

    from shardfeed.tools.bench import compare

    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    # --peers-python: run Streaming with this interpreter, not the peers' venv, so it is missing here
    args = parser.parse_args(["--out", str(tmp_path), "--libraries", "shardfeed,shardfeed-parquet,streaming",
                              "--sizes", "2KiB", "--samples-2k", "1024", "--workers", "0", "--shuffle", "on",
                              "--no-plot", "--no-quality", "--train-steps", "0", "--peers-python", sys.executable])
    assert compare.main(args) == 0
    report = json.loads((tmp_path / "bench_compare.json").read_text())
    rows = {r["library"]: r for r in report["rows"]}
    assert rows["shardfeed"]["status"] == rows["shardfeed-parquet"]["status"] == "ok"
    assert rows["shardfeed"]["whole"] > 0 and rows["shardfeed-parquet"]["whole"] > 0
    try:
        import streaming  # noqa: F401
    except Exception:
        assert rows["streaming"]["status"].startswith("skipped") and "whole" not in rows["streaming"]
    assert "Parquet global within 2x" in (tmp_path / "bench_compare.md").read_text()


def test_bench_payloads_runs_every_variant(tmp_path):
    """Tiny run of the payload-forms benchmark: every variant reports a positive rate."""
    import json

    from shardfeed.tools.bench import payloads

    out = tmp_path / "payloads.json"
    assert payloads.main(["--samples-2k", "512", "--samples-100k", "8", "--repeats", "1", "--workers", "0",
                          "--json", str(out), "--dir", str(tmp_path / "data")]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} == {"raw uint16 (tokens.uint16)", "npy uint16 (npy)", "plain bytes (bin)",
                                            "bytes_as=bytes", "bytes_as=tensor", "bytes_as=jagged"}
    assert all(r["median"] > 0 for r in rows)


def test_parquet_stored_order_every_other_batch_keeps_few_groups(tmp_path):
    """A loader worker of two reads every other stored-order batch, so it never
    reads the last rows of a row group itself: groups it has passed are given
    back all the same (not every decoded group of the shard kept), and each
    batch is still the samples written."""
    from shardfeed.formats import ShardWriter
    from shardfeed.formats.writer import _ColumnarShard

    root = str(tmp_path / "pq")
    group = _ColumnarShard.ROWS_PER_GROUP
    n = group * 4
    with ShardWriter(root, format="parquet") as w:
        for i in range(n):
            w.write(labelled_sample(i, payload_bytes=16))
    reader = BatchReader(open_index(root))
    step = group // 4
    try:
        for start in range(0, n, 2 * step):  # batches 0, 2, 4...: rows [0, q), [2q, 3q), [4q, 5q)...
            ids = np.arange(start, start + step)
            raw = reader.read(ids)
            assert raw.keys == [f"{i:08d}" for i in ids.tolist()]
            _, starts, sizes = raw.fields["bin"]
            assert raw.buf[starts[-1]:starts[-1] + sizes[-1]].tobytes() == labelled_sample(int(ids[-1]), 16)["bin"]
            assert len(DECODED._groups) <= 1
    finally:
        reader.close()
    assert DECODED.nbytes() == 0
