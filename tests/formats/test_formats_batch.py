"""BatchReader's read paths give the per-sample readers' bytes, and every path
refuses damaged bytes: preadv from the file (the default), copies from the
mapping (no preadv), in-memory decompressed shards, and xxh3 from Python
(no native hash)."""

from __future__ import annotations

import numpy as np
import pytest
from test_loader_faults import _damage_payload

from shardfeed.formats import ShardError, open_index, open_shard
from shardfeed.formats.compiler.native import hash_fn
from shardfeed.formats.engine.batch import BatchReader


def _reader(root, path_kind, **kw):
    if path_kind == "mmap":
        return BatchReader(open_index(root), read_mode="mmap", **kw)
    r = BatchReader(open_index(root), **kw)
    if path_kind in ("mapped", "python-hash"):
        r._io_fn = 0
    if path_kind == "python-hash":
        r._hash_fn = 0
    return r


def _expected(root, ids):
    idx = open_index(root)
    shard, local = idx.locate(np.asarray(ids))
    out = []
    for s, i in zip(shard.tolist(), local.tolist()):
        with open_shard(idx, s) as r:
            out.append(r.read(i))
    return out


def _as_samples(raw):
    out = []
    for r in range(len(raw)):
        d = {"__key__": raw.keys[r]}
        for name, (_, starts, sizes) in raw.fields.items():
            if sizes[r] >= 0:
                d[name] = raw.buf[starts[r]:starts[r] + sizes[r]].tobytes()
        out.append(d)
    return out


def test_native_xxh3_is_found_and_agrees():
    assert hash_fn() != 0  # else every batch hashes in Python: a silent 2x slowdown
    import ctypes
    import glob
    import os

    import xxhash
    f = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t)(hash_fn())
    for data in (b"", b"x" * 17, os.urandom(240), os.urandom(1 << 20)):
        assert f(data, len(data)) == xxhash.xxh3_64_intdigest(data)
    # the CPU-dispatched build where the extension exports it (AVX2: ~2x the SSE2 XXH3_64bits on long inputs)
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(os.path.dirname(xxhash.__file__), "_xxhash*.so")))[0])
    if hasattr(lib, "XXH3_64bits_dispatch"):
        assert hash_fn() == ctypes.cast(lib.XXH3_64bits_dispatch, ctypes.c_void_p).value


@pytest.mark.parametrize("path_kind", ["preadv", "mapped", "python-hash", "mmap"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_batches_hold_the_samples_asked_for_in_order_with_repeats(make_dataset, path_kind, compression):
    root = make_dataset(90, shard_samples=20, compression=compression)
    rng = np.random.default_rng(0)
    ids = np.concatenate([np.arange(10, 50), rng.integers(0, 90, 60), [5, 5, 89]])  # runs, random, repeats
    r = _reader(root, path_kind)
    try:
        assert _as_samples(r.read(ids)) == _expected(root, ids)
    finally:
        r.close()


@pytest.mark.parametrize("path_kind", ["preadv", "mapped", "python-hash", "mmap"])
def test_damaged_bytes_are_refused_or_skipped_on_every_path(make_dataset, path_kind):
    root = make_dataset(60, shard_samples=20)
    path, key = _damage_payload(root, shard=1, sample=3)
    ids = np.arange(60)
    r = _reader(root, path_kind)
    with pytest.raises(ShardError) as e:
        r.read(ids)
    assert e.value.shard == path and key in e.value.reason and "checksum" in e.value.reason
    r.close()
    r = _reader(root, path_kind, skip=True)
    raw = r.read(ids)
    r.close()
    assert key not in raw.keys and len(raw) == 59 and len(raw.errors) == 1
    keep = [i for i in range(60) if i != 23]
    assert _as_samples(raw) == _expected(root, keep)


@pytest.mark.parametrize("read_mode", ["pread", "mmap"])
def test_a_shard_cut_after_it_was_opened_is_an_error_not_short_data(make_dataset, read_mode):
    """In mmap mode a copy past the file's end would be SIGBUS, killing the test process."""
    root = make_dataset(40, shard_samples=20)
    r = BatchReader(open_index(root), read_mode=read_mode)
    r.read([0, 25])  # both shards open
    path = open_index(root).path(1)
    with open(path, "r+b") as f:
        f.truncate(2048)
    with pytest.raises(ShardError) as e:
        r.read(np.arange(20, 40))
    assert e.value.shard == path and "shorter" in e.value.reason
    r.close()


def test_a_batch_may_span_more_shards_than_stay_open(make_dataset):
    root = make_dataset(60, shard_samples=5)  # 12 shards
    r = BatchReader(open_index(root), max_open=3)
    ids = np.arange(59, -1, -1)
    assert _as_samples(r.read(ids)) == _expected(root, ids)
    assert len(r._open) == 3
    assert _as_samples(r.read(ids[::2])) == _expected(root, ids[::2])
    r.close()


@pytest.mark.parametrize("read_mode", ["pread", "mmap"])
def test_a_shard_cut_after_it_was_opened_is_skipped_whole_under_skip(make_dataset, read_mode):
    root = make_dataset(40, shard_samples=20)
    r = BatchReader(open_index(root), skip=True, read_mode=read_mode)
    r.read([0, 25])
    path = open_index(root).path(1)
    with open(path, "r+b") as f:
        f.truncate(2048)
    raw = r.read(np.arange(10, 40))
    assert raw.keys == [f"{i:08d}" for i in range(10, 20)]
    assert len(raw.errors) == 1 and raw.errors[0][0] == path and raw.errors[0][2] == 20
    assert r.read([35]).errors[0][0] == path  # stays left out
    r.close()


@pytest.mark.parametrize("bad", ["mmaped", "PREAD", None, 1])
def test_an_unknown_read_mode_is_refused_naming_it_and_the_valid_ones(make_dataset, bad):
    root = make_dataset(10, shard_samples=5)
    with pytest.raises(ValueError) as e:
        BatchReader(open_index(root), read_mode=bad)
    assert repr(bad) in str(e.value) and "'pread'" in str(e.value) and "'mmap'" in str(e.value)


def test_mmap_mode_keeps_shards_mapped_and_pread_mode_leaves_mappings_untouched(make_dataset):
    """The trade the modes make: mmap copies from the mapping (pages resident), pread never touches it."""
    root = make_dataset(40, shard_samples=20)
    ids = np.arange(40)
    for mode in ("pread", "mmap"):
        r = BatchReader(open_index(root), read_mode=mode)
        assert _as_samples(r.read(ids)) == _expected(root, ids)
        assert (r._io_fn != 0) == (mode == "pread")
        assert all(v.fd >= 0 for v in r._open.values())  # size checked (mmap) or read (pread) through it
        r.close()
