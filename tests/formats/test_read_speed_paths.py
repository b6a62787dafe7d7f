"""The steady-state read path (BatchReader._steady, steady_read.py: every shard of a batch
already open, a few numpy calls, no pins) returns exactly what the general
path returns, never delivers damaged bytes, and keeps the open-shard table
consistent through eviction; through a Loader with 0 and 2 workers, across a
resume, and with the lifetime rules of both byte forms."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.open_shards import TarView
from shardfeed.loader import Loader, ShardDataset
from tests.conftest import labelled_sample


def _sample(i: int) -> dict:
    s = labelled_sample(i, payload_bytes=40 + (i * 37) % 300)
    if i % 7 == 3:
        del s["txt"]  # some samples lack a field: its size is -1 there
    return s


@pytest.fixture
def ragged(tmp_path):
    root = str(tmp_path / "ragged")
    with ShardWriter(root, max_shard_samples=23) as w:
        for i in range(150):
            w.write(_sample(i))
    return root


def _content(raw) -> list:
    """Per sample: (id, key, shard, {field: bytes or None}) of a RawBatch."""
    buf = raw.buf.tobytes()
    out = []
    for r in range(len(raw)):
        fields = {}
        for name, spec in raw.fields.items():
            a, z = int(spec[1][r]), int(spec[2][r])
            fields[name] = None if z < 0 else buf[a:a + z]
        out.append((int(raw.ids[r]), raw.keys[r], int(raw.shards[r]), fields))
    return out


def _batches(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [np.arange(0, 40), np.arange(40, 41), rng.permutation(n)[:64], rng.integers(0, n, 50),
            np.array([7, 7, 149, 0, 7]), rng.permutation(n)]


@pytest.mark.parametrize("read_mode", ["pread", "mmap"])
def test_open_shard_fast_path_matches_general_path(ragged, read_mode):
    """Regression guard for the steady path: same keys, bytes, fields (absent ones
    too), shards and byte counts as the general path, for stored, random and
    repeated ids, once every shard is open."""
    index = open_index(ragged)
    fast = BatchReader(index, read_mode=read_mode)
    general = BatchReader(index, read_mode=read_mode, path_of=index.path)  # a path_of always takes the general path
    fast.read(np.arange(index.num_samples))  # opens every shard
    assert (fast.shards.slot_of >= 0).all()
    for ids in _batches(index.num_samples):
        got, want = fast.read(ids), general.read(ids)
        assert _content(got) == _content(want)
        assert list(got.fields) == list(want.fields) and got.bytes_read == want.bytes_read
        for i, (sid, key, _, fields) in zip(ids.tolist(), _content(got)):
            s = _sample(i)
            assert sid == i and key == s["__key__"] and fields["bin"] == s["bin"]
            assert fields["txt"] == (s["txt"].encode() if "txt" in s else None)
    fast.close()
    general.close()


def test_fast_path_never_delivers_damaged_bytes(ragged):
    """A payload damaged on disk after its shard was opened (so the batch takes the
    steady path) is still caught by its checksum: ShardError, or left out and
    reported under skip."""
    index = open_index(ragged)
    victim = 30  # shard 1, row 7
    strict, skipping = BatchReader(index), BatchReader(index, skip=True)
    ids = np.arange(23, 46)
    for r in (strict, skipping):
        r.read(ids)
    view = strict.shards.views[1]
    first = int(view.member_start[victim - 23])
    off = int(view.offset[first])
    with open(index.path(1), "r+b") as f:
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ShardError, match="checksum") as e:
        strict.read(ids)
    assert index.path(1) in str(e.value)
    raw = skipping.read(ids)
    assert victim not in raw.ids.tolist() and len(raw) == len(ids) - 1
    assert len(raw.errors) == 1 and "checksum" in raw.errors[0].reason
    for r in (strict, skipping):
        r.close()


def test_slot_table_consistent_through_eviction(ragged):
    """With fewer shards kept open than a batch touches, shards are opened and
    evicted on every read: the shard -> slot map stays exact and the bytes right."""
    index = open_index(ragged)
    small = BatchReader(index, max_open=2)
    general = BatchReader(index, path_of=index.path)
    rng = np.random.default_rng(1)
    for k in range(12):
        ids = rng.integers(0, index.num_samples, 30) if k % 3 else np.arange(23 * (k % 6), 23 * (k % 6) + 20)
        assert _content(small.read(ids)) == _content(general.read(ids))
        views = small.shards.views
        for s in range(len(index)):
            v = views.get(s)
            expected = v.slot if isinstance(v, TarView) else -1
            assert small.shards.slot_of[s] == expected
        assert len(views) <= 2
    small.close()
    general.close()


def _rows(batch, bytes_as: str) -> list:
    """(key, payload bytes, cls) per sample, the payload copied out at once (a view lives one batch)."""
    bins = batch["bin"]
    if bytes_as == "tensor":
        bins = [bytes(t.numpy()) for t in bins]
    return list(zip(batch["__key__"], bins, batch["cls"].tolist()))


def _expected(rows) -> None:
    for key, payload, cls in rows:
        s = _sample(int(key))
        assert payload == s["bin"] and cls == s["cls"], f"sample {key} differs"


@pytest.mark.parametrize("shuffle", ["none", "global"])
@pytest.mark.parametrize("bytes_as", ["bytes", "tensor"])
def test_loader_batches_same_through_workers_and_resume(ragged, shuffle, bytes_as):
    """Bytes, keys and labels of every batch agree with the written samples and
    are identical through 0 and 2 workers; a Loader resumed mid-epoch from
    state_dict yields exactly the rest, in the same batches."""
    def loader(workers):
        return Loader(ShardDataset(ragged, shuffle=shuffle, seed=3), batch_size=16, num_workers=workers,
                      bytes_as=bytes_as)

    runs = {}
    for workers in (0, 2):
        with loader(workers) as ld:
            runs[workers] = [_rows(b, bytes_as) for _ in range(2) for b in ld]  # two epochs
    assert runs[0] == runs[2]
    per_epoch = len(runs[0]) // 2
    rows = [r for b in runs[0][:per_epoch] for r in b]
    assert sorted(int(k) for k, _, _ in rows) == list(range(150))
    _expected(rows)
    for workers, k in ((0, 3), (2, 5)):
        with loader(workers) as a:
            it = iter(a)
            head = [_rows(next(it), bytes_as) for _ in range(k)]
            state = a.state_dict()
        with loader(workers) as b:
            b.load_state_dict(state)
            rest = [_rows(x, bytes_as) for x in b]
        assert head + rest == runs[0][:per_epoch]


@pytest.mark.parametrize("workers", [0, 2])
def test_lifetime_of_reused_batch_buffers(ragged, workers):
    """The batch buffer is reused (a worker's shared-memory slot, the reader's
    scratch buffer at 0 workers): ``bytes`` batches stay intact after later
    batches were read; a ``tensor`` batch's views hold its own samples until
    the next batch is asked for."""
    with Loader(ShardDataset(ragged, shuffle="global", seed=1), batch_size=8, num_workers=workers) as ld:
        kept = list(ld)
    assert len(kept) > 2 * max(1, workers) * 2  # more batches than slots: buffers were reused
    _expected([r for b in kept for r in _rows(b, "bytes")])
    with Loader(ShardDataset(ragged, shuffle="global", seed=1), batch_size=8, num_workers=workers,
                bytes_as="tensor") as ld:
        for b in ld:
            _expected(_rows(b, "tensor"))
