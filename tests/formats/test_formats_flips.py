"""Formats against damage, exhaustively where the file is small: every byte
of an index.arrow and of a Parquet footer, flipped by each single-bit mask and
by 0xFF or cut there, is a ShardError (never another exception, never an
index accepted with a changed byte);
closed compressed shards give their memory back; foreign tars that cannot be
read are skipped and recorded under on_error="skip"."""

from __future__ import annotations

import gzip
import io
import os
import struct
import tarfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard
from shardfeed.formats.readers import shard_keys

pytestmark = pytest.mark.hostile(timeout=240)  # bounded time and memory (conftest.py)


# each byte of a small file is flipped by every one of these masks, or the file is cut there
DAMAGE = [1, 2, 4, 8, 16, 32, 64, 128, 255, "cut"]


def _damaged(orig: bytes, positions, how):
    """(position, damaged bytes) for every position: one byte xor ``how``, or the file cut there."""
    for i in positions:
        if how == "cut":
            yield i, orig[:i]
        else:
            b = bytearray(orig)
            b[i] ^= how
            yield i, bytes(b)


def _index_30(root: str) -> str:
    """The issue's dataset: 30 samples in 2 shards; its index.arrow is ~2 KB."""
    with ShardWriter(root, max_shard_samples=15) as w:
        for i in range(30):
            w.write({"__key__": f"k{i:03d}", "cls": i, "txt": f"t{i}"})
    return os.path.join(root, "index.arrow")


@pytest.mark.parametrize("how", DAMAGE, ids=lambda h: h if h == "cut" else f"x{h:02x}")
def test_every_byte_of_index_arrow_damaged_is_refused(tmp_path, how):
    """Every byte of an index.arrow flipped by each mask, or the file cut there, is a ShardError:
    never another exception, never an index accepted with a changed byte. Two single-bit flips
    (0x08, in the schema's type of a column) raised IndexError from the digest's buffer walk."""
    from shardfeed.formats.own_tables import parse_index_bytes

    root = str(tmp_path / "ds")
    path = _index_30(root)
    orig = open(path, "rb").read()
    t0 = time.monotonic()
    accepted, other = [], []
    for i, raw in _damaged(orig, range(len(orig)), how):
        try:
            parse_index_bytes(raw, path)
            accepted.append(i)
        except ShardError:
            pass
        except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
            other.append((i, type(e).__name__, str(e)[:60]))
    assert time.monotonic() - t0 < 30
    assert not other, other[:10]
    assert not accepted, f"{len(accepted)} of {len(orig)} damaged bytes accepted, e.g. at {accepted[:10]}"
    assert len(open_index(root)) == 2


def _footer_region(orig: bytes) -> range:
    flen = struct.unpack("<I", orig[-8:-4])[0]
    return range(len(orig) - 8 - flen, len(orig))


@pytest.mark.parametrize("how", DAMAGE, ids=lambda h: h if h == "cut" else f"x{h:02x}")
def test_every_byte_of_a_parquet_footer_damaged_is_a_shard_error_on_every_read_path(tmp_path, how):
    """Every byte of a Parquet shard's footer (the metadata and its 8-byte tail) flipped by each
    mask, or the file cut there, is a ShardError naming the shard on each read path: the reader,
    the key lookup, the batch engine (a Loader's read) and convert's ParquetSource. A flip that
    renamed the __key__ column raised TypeError from the batch engine's keys."""
    from shardfeed.formats.engine.batch import BatchReader
    from shardfeed.formats.readers import ColumnarShardReader
    from shardfeed.tools.convert.table_sources import ParquetSource

    root = str(tmp_path / "pq")
    with ShardWriter(root, format="parquet", max_shard_samples=10) as w:
        for i in range(10):
            w.write({"__key__": f"k{i}", "cls": i, "txt": f"t{i}", "bin": bytes([i]) * 5})
    idx = open_index(root)
    path = idx.path(0)
    foreign = str(tmp_path / "foreign.parquet")
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(20)], "label": list(range(20))}), foreign,
                   row_group_size=10)
    ids = np.arange(10)
    other = []

    def attempt(label, i, file, fn):
        try:
            fn()
        except ShardError as e:
            if not str(e.shard).startswith(file):  # the file, maybe with the row it failed at
                other.append((label, i, "ShardError naming", e.shard))
        except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
            other.append((label, i, type(e).__name__, str(e)[:60]))

    def read_all():
        # a cut file is refused by the index's byte count first: read it as its size allows
        with ColumnarShardReader(path, "parquet", expected_bytes=None if how == "cut" else int(idx.sizes[0])) as r:
            list(r)

    def batch():
        reader = BatchReader(idx)
        try:
            reader.read(ids)
        finally:
            reader.close()

    def convert_source():
        s = ParquetSource([foreign])
        s.load_many(np.arange(len(s), dtype=np.int64))

    t0 = time.monotonic()
    for file, paths in ((path, (("reader", read_all), ("shard_keys", lambda: shard_keys(idx, 0)),
                                ("batch engine", batch))),
                        (foreign, (("convert's ParquetSource", convert_source),))):
        orig = open(file, "rb").read()
        try:
            for i, raw in _damaged(orig, _footer_region(orig), how):
                with open(file, "wb") as f:
                    f.write(raw)
                for label, fn in paths:
                    attempt(label, i, file, fn)
        finally:
            with open(file, "wb") as f:
                f.write(orig)
    assert time.monotonic() - t0 < 30
    assert not other, other[:10]


def test_closed_compressed_shards_give_their_memory_back(tmp_path):
    """30 zstd shards of 4 MiB decompressed, each opened, read and closed,
    the closed readers kept (as a table of shards or a traceback keeps
    them): memory must not grow by the shards' decompressed bytes."""
    root = str(tmp_path / "zst")
    rng = np.random.default_rng(0)
    with ShardWriter(root, max_shard_samples=4, compression="zstd") as w:
        for i in range(4 * 30):
            w.write({"__key__": f"k{i:05d}", "bin": rng.bytes(1 << 20)})
    idx = open_index(root)

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20

    kept = []
    r = open_shard(idx, 0)
    r.read(0)
    r.close()
    before = rss_mib()
    for i in range(len(idx)):
        r = open_shard(idx, i)
        r.read(3)
        r.close()
        kept.append(r)
    grew = rss_mib() - before
    assert grew < 40, f"memory grew {grew} MiB over {len(idx)} closed compressed shards"


def _tar(members, fmt=tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for n, data in members:
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _fix_checksum(raw: bytearray, at: int) -> None:
    raw[at + 148:at + 156] = b" " * 8
    raw[at + 148:at + 156] = b"%06o\0 " % sum(raw[at:at + 512])


def test_unreadable_foreign_tars_are_skipped_and_recorded(tmp_path):
    d = tmp_path / "foreign"
    d.mkdir()
    good = _tar([("a.cls", b"1"), ("a.txt", b"x"), ("b.cls", b"2")])
    (d / "0good.tar").write_bytes(good)
    raw = bytearray(good)
    raw[1024:1029] = b"\xff\xfe\xfdab"  # the second member's name is not UTF-8 (checksum fixed)
    _fix_checksum(raw, 1024)
    (d / "1nonutf8.tar").write_bytes(bytes(raw))
    bad = bytearray(good)
    bad[148] = ord("7") if bad[148] != ord("7") else ord("6")
    (d / "2badsum.tar").write_bytes(bytes(bad))
    (d / "3trunc.tar").write_bytes(good[:700])
    (d / "4trunc.tar.gz").write_bytes(gzip.compress(good)[:40])
    for src in (str(d), str(d / "*.tar*")):
        ix = open_index(src, on_error="skip")
        # a member name that is not UTF-8 (a.txt renamed) leaves out that member only: a and b are read
        assert list(ix.names) == ["0good.tar", "1nonutf8.tar"] and list(ix.counts) == [2, 2]
        assert [(os.path.basename(e.shard), e.samples) for e in ix.left_out] == [("1nonutf8.tar", 1)]
        assert sorted(os.path.basename(p) for p, _ in ix.skipped) == ["2badsum.tar", "3trunc.tar", "4trunc.tar.gz"]
        with pytest.raises(ShardError):
            open_index(src)
