"""Payloads without copies (bytes_as="tensor" / "jagged") and raw numeric
fields (``tokens.uint16``): the same bytes and values as the slow paths,
through 0 and 2 workers, both orders and across a resume; the lifetime rule
of views (loader/views.py); bad numeric lengths as ShardError."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest
import torch

from conftest import labelled_sample
from loader_helpers import rows_until
from shardfeed.formats import ShardError, ShardWriter
from shardfeed.loader import Loader, ShardDataset


def _values(col) -> list:
    """A byte field in any form as a list of bytes (None where absent)."""
    if isinstance(col, torch.Tensor) and col.is_nested:
        return [bytes(t.numpy()) for t in col.unbind()]
    return [None if v is None else bytes(v) if isinstance(v, bytes) else bytes(v.numpy()) for v in col]


def _run(root, workers=0, shuffle="global", bytes_as="bytes", state=None, stop=None, prefetch=2, **ds):
    """[(keys, bin values as bytes, cls)] of an epoch, or its first ``stop`` batches and the state after them."""
    loader = Loader(ShardDataset(root, shuffle=shuffle, seed=7, **ds), batch_size=16, num_workers=workers,
                    prefetch=prefetch, bytes_as=bytes_as)
    return rows_until(loader, lambda b: (list(b["__key__"]), _values(b["bin"]), b["cls"].tolist()), state, stop)


def _sized_dataset(root, n=150, format="tar", shard_samples=40):
    """Payloads of varying size (0 to ~3 KiB), so views and offsets are not all alike."""
    with ShardWriter(root, format=format, max_shard_samples=shard_samples) as w:
        for i in range(n):
            w.write(labelled_sample(i, payload_bytes=(i * 97) % 3000))
    return root


# -- views: the same bytes as the copying path ----------------------------------

@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", ["none", "global"])
@pytest.mark.parametrize("form", ["tensor", "jagged"])
def test_views_equal_the_bytes_path(tmp_path, form, shuffle, workers):
    root = _sized_dataset(str(tmp_path / "ds"))
    want, _ = _run(root, workers, shuffle)
    got, _ = _run(root, workers, shuffle, bytes_as=form)
    assert got == want
    assert [v for _, vs, _ in want for v in vs] == [labelled_sample(int(k), (int(k) * 97) % 3000)["bin"]
                                                   for ks, _, _ in want for k in ks]


@pytest.mark.parametrize("format", ["tar", "parquet"])
def test_jagged_is_one_nested_tensor_over_the_batch_buffer(tmp_path, format):
    root = _sized_dataset(str(tmp_path / "ds"), n=48, format=format)
    with Loader(ShardDataset(root, shuffle="global", seed=1), batch_size=16, bytes_as="jagged") as ld:
        b = next(iter(ld))
        nt = b["bin"]
        assert nt.is_nested and nt.layout == torch.jagged and nt.dtype == torch.uint8 and nt.size(0) == 16
        # one storage, and every sample's bytes where offsets and lengths say
        values, offsets, lengths = nt.values(), nt.offsets(), nt.lengths()
        assert all(t.untyped_storage().data_ptr() == values.untyped_storage().data_ptr() for t in nt.unbind())
        for k, a, z in zip(b["__key__"], offsets.tolist(), lengths.tolist()):
            assert bytes(values[a:a + z].numpy()) == labelled_sample(int(k), (int(k) * 97) % 3000)["bin"]
        assert [bytes(t.numpy()) for t in nt.contiguous().unbind()] == _values(nt)


@pytest.mark.parametrize("form", ["tensor", "jagged"])
def test_views_of_a_field_some_samples_lack(tmp_path, form):
    """Regression: an absent value's start (-1) was taken as the span's start,
    so every view of such a batch was shifted (empty). A jagged tensor cannot
    say "absent": that batch's field comes as the tensor list with None."""
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=20) as w:
        for i in range(20):
            s = labelled_sample(i)
            if i % 5 == 0:
                del s["bin"]
            w.write(s)
    with Loader(ShardDataset(root, shuffle="none"), batch_size=10, bytes_as=form) as ld:
        b = next(iter(ld))
    assert isinstance(b["bin"], list)
    assert _values(b["bin"]) == [None if i % 5 == 0 else labelled_sample(i)["bin"] for i in range(10)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("form", ["tensor", "jagged"])
def test_views_across_a_resume(tmp_path, form, workers):
    root = _sized_dataset(str(tmp_path / "ds"), n=120)
    full, _ = _run(root, workers, bytes_as=form)
    head, state = _run(root, workers, bytes_as=form, stop=3)
    rest, _ = _run(root, workers, bytes_as=form, state=state)
    assert head + rest == full == _run(root, workers)[0]


# -- the lifetime rule -----------------------------------------------------------

def _wait_for_workers(ld) -> None:
    """Until every batch in flight is made (so a worker that reused the held
    batch's slot too early would already have overwritten it)."""
    pool = ld._pool
    if pool is None:
        return
    for w, conn in enumerate(pool.results):
        if pool.outstanding[w]:
            assert conn.poll(30), f"worker {w} made nothing in 30 s"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("form", ["tensor", "jagged"])
def test_a_view_stays_unchanged_until_the_next_batch_is_asked_for(tmp_path, form, workers):
    """prefetch=1 leaves one slot per worker: the batch that reuses the held
    batch's slot is two steps on, and must not be started before the consumer
    asks for the next batch."""
    root = _sized_dataset(str(tmp_path / "ds"), n=160, shard_samples=160)
    with Loader(ShardDataset(root, shuffle="global", seed=7), batch_size=16, num_workers=workers, prefetch=1,
                bytes_as=form) as ld:
        it = iter(ld)
        seen = []
        for _ in range(len(ld)):
            held = next(it)["bin"]
            at_delivery = _values(held)
            _wait_for_workers(ld)
            assert _values(held) == at_delivery, "a view changed before the next batch was asked for"
            seen.append(at_delivery)
    assert seen == [vs for _, vs, _ in _run(root, workers)[0]]


def test_bytes_as_names_all_three_forms(make_dataset):
    root = make_dataset(10, shard_samples=10)
    with pytest.raises(ValueError, match="bytes_as='views'.*'bytes'.*'tensor'.*'jagged'"):
        Loader(ShardDataset(root), batch_size=4, bytes_as="views")


# -- raw little-endian numeric fields --------------------------------------------

def _tokens(i: int, n: int = 1024, dtype=np.uint16) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + i * 131) % 60000).astype(dtype)


def _token_dataset(root, n=96, ragged=False, format="tar", field="tokens.uint16", dtype=np.uint16):
    with ShardWriter(root, format=format, max_shard_samples=32) as w:
        for i in range(n):
            t = _tokens(i, 1024 + (i % 3 if ragged else 0), dtype)
            w.write({"__key__": f"{i:06d}", field: t, "npy": t, "cls": i})
    return root


def _identity(sample):
    return sample  # a transform: forces the per-sample (slow) path


def _token_run(root, workers=0, shuffle="global", transform=None, state=None, stop=None, field="tokens.uint16"):
    """[(keys, field values as numpy: one array, or a list of arrays)] of an epoch or its first ``stop`` batches."""
    def row(b):
        v = b[field]
        if isinstance(v, torch.Tensor):
            return list(b["__key__"]), v.numpy().copy()
        assert all(isinstance(x, torch.Tensor) and x.dim() == 1 for x in v)
        return list(b["__key__"]), [x.numpy().copy() for x in v]

    loader = Loader(ShardDataset(root, shuffle=shuffle, seed=1, transform=transform), batch_size=16,
                    num_workers=workers)
    return rows_until(loader, row, state, stop)


def _same(a, b):
    assert len(a) == len(b)
    for (ka, va), (kb, vb) in zip(a, b):
        assert ka == kb and type(va) is type(vb)
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and va.shape == vb.shape and np.array_equal(va, vb)
        else:
            assert len(va) == len(vb)
            assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(va, vb))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_uint16_tokens_are_one_batch_tensor_equal_to_the_slow_path(tmp_path, shuffle, workers):
    root = _token_dataset(str(tmp_path / "tok"))
    fast, _ = _token_run(root, workers, shuffle)
    slow, _ = _token_run(root, workers, shuffle, transform=_identity)
    _same(fast, slow)
    assert fast[0][1].dtype == np.uint16 and fast[0][1].shape == (16, 1024)
    for keys, arr in fast:
        for k, row in zip(keys, arr):
            assert np.array_equal(row, _tokens(int(k)))
    # the same values as the .npy copy of each sample
    _same(fast, _token_run(root, workers, shuffle, field="npy")[0])


@pytest.mark.parametrize("workers", [0, 2])
def test_uint16_tokens_across_a_resume(tmp_path, workers):
    root = _token_dataset(str(tmp_path / "tok"))
    full, _ = _token_run(root, workers)
    head, state = _token_run(root, workers, stop=2)
    rest, _ = _token_run(root, workers, state=state)
    _same(head + rest, full)


@pytest.mark.parametrize("format", ["tar", "parquet"])
def test_unequal_lengths_are_a_list_of_1d_tensors(tmp_path, format):
    root = _token_dataset(str(tmp_path / "tok"), n=48, ragged=True, format=format)
    fast, _ = _token_run(root)
    _same(fast, _token_run(root, transform=_identity)[0])
    assert isinstance(fast[0][1], list)
    assert [len(x) for x in fast[0][1]] == [1024 + int(k) % 3 for k in fast[0][0]]


@pytest.mark.parametrize("name", ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                                  "float16", "float32", "float64"])
def test_every_numeric_type_round_trips(tmp_path, name):
    dtype = np.dtype(name)
    root = str(tmp_path / name)
    rng = np.random.default_rng(0)
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    want = {}
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(16):
            a = rng.uniform(-100, 100, 33).astype(dtype) if dtype.kind == "f" else rng.integers(
                info.min, info.max, 33, dtype=dtype, endpoint=True)
            want[f"{i:04d}"] = a
            w.write({"__key__": f"{i:04d}", f"x.{name}": a})
    with Loader(ShardDataset(root, shuffle="global"), batch_size=16) as ld:
        (b,) = list(ld)
    assert b[f"x.{name}"].numpy().dtype == dtype and b[f"x.{name}"].shape == (16, 33)
    for k, row in zip(b["__key__"], b[f"x.{name}"].numpy()):
        assert np.array_equal(row, want[k])


def test_the_writer_converts_only_what_fits_and_keeps_1d(tmp_path):
    with ShardWriter(str(tmp_path / "w")) as w:
        w.write({"__key__": "a", "t.uint16": np.array([1, 65535], np.int64)})  # fits: converted
        w.write({"__key__": "b", "t.uint16": np.array([7, 8], ">u2")})  # big-endian: stored little-endian
        for bad, match in ((np.array([1, 65536]), "do not fit uint16"),
                           (np.zeros((2, 2), np.uint16), "1-D arrays, got shape"),
                           (b"\x01\x02\x03", "3 bytes, not a whole number of uint16")):
            with pytest.raises(ValueError, match=match):
                w.write({"__key__": "c", "t.uint16": bad})
    with Loader(ShardDataset(str(tmp_path / "w"), shuffle="none"), batch_size=2) as ld:
        (b,) = list(ld)
    assert b["t.uint16"].tolist() == [[1, 65535], [7, 8]]


def _foreign_tar(folder, payloads: dict) -> str:
    """A tar from Python's tarfile (ShardWriter refuses bad lengths): samples ``{key: tokens bytes}``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "part-000.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for key, data in payloads.items():
            for ext, blob in (("tokens.uint16", data), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(blob)
                tf.addfile(info, io.BytesIO(blob))
    return path


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("all_bad", [False, True])
def test_a_length_not_a_multiple_of_the_type_is_a_shard_error(tmp_path, all_bad, workers):
    """Whether every sample of the batch is odd (equal sizes: the gather must
    not take it) or one is: ShardError naming the shard, the key and the field."""
    good = _tokens(0, 8).tobytes()
    payloads = {f"{i:04d}": (good[:-1] if all_bad or i == 5 else good) for i in range(8)}
    path = _foreign_tar(str(tmp_path / "foreign"), payloads)
    with Loader(ShardDataset(path, shuffle="none"), batch_size=8, num_workers=workers) as ld:
        with pytest.raises(ShardError) as err:
            list(ld)
    msg = str(err.value)
    assert "part-000.tar" in msg and ("'0000'" if all_bad else "'0005'") in msg
    assert "tokens.uint16" in msg and "15 bytes, not a whole number of uint16" in msg
