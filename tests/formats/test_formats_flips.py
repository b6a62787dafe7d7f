"""Formats against damage, exhaustively where the file is small: every
single-byte flip of an index.arrow and of a Parquet footer is a ShardError
(never another exception, never an index accepted with a changed byte);
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


def test_every_byte_flip_of_index_arrow_is_refused(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=2) as w:
        for i in range(6):
            w.write({"__key__": f"k{i}", "cls": i})
    path = os.path.join(root, "index.arrow")
    orig = open(path, "rb").read()
    t0 = time.monotonic()
    accepted, other = [], []
    for i in range(len(orig)):
        b = bytearray(orig)
        b[i] ^= 0xFF
        with open(path, "wb") as f:
            f.write(b)
        try:
            open_index(root)
            accepted.append(i)
        except ShardError:
            pass
        except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
            other.append((i, type(e).__name__))
    with open(path, "wb") as f:
        f.write(orig)
    assert time.monotonic() - t0 < 120
    assert not other, other[:10]
    assert not accepted, f"{len(accepted)} of {len(orig)} flipped bytes accepted, e.g. at {accepted[:10]}"
    assert len(open_index(root)) == 3


def _footer_flips(path):
    orig = open(path, "rb").read()
    flen = struct.unpack("<I", orig[-8:-4])[0]
    for i in range(len(orig) - 8 - flen, len(orig)):
        b = bytearray(orig)
        b[i] ^= 0xFF
        with open(path, "wb") as f:
            f.write(b)
        yield i
    with open(path, "wb") as f:
        f.write(orig)


def test_every_parquet_footer_flip_is_a_shard_error_on_every_read_path(tmp_path):
    from shardfeed.tools.convert.table_sources import ParquetSource

    root = str(tmp_path / "pq")
    with ShardWriter(root, format="parquet", max_shard_samples=10) as w:
        for i in range(10):
            w.write({"__key__": f"k{i}", "cls": i, "txt": f"t{i}", "json": {"a": i}, "bin": bytes([i]) * 5})
    idx = open_index(root)
    foreign = str(tmp_path / "foreign.parquet")
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(20)], "label": list(range(20)),
                             "img": [bytes([i]) * 8 for i in range(20)]}), foreign, row_group_size=10)
    other = []

    def attempt(label, i, fn):
        try:
            fn()
        except ShardError:
            pass
        except Exception as e:  # noqa: BLE001
            other.append((label, i, type(e).__name__, str(e)[:60]))

    def read_all():
        with open_shard(idx, 0) as r:
            list(r)

    def convert_source():
        s = ParquetSource([foreign])
        s.load_many(np.arange(len(s), dtype=np.int64))

    t0 = time.monotonic()
    for i in _footer_flips(idx.path(0)):
        attempt("open_shard", i, read_all)
        attempt("shard_keys", i, lambda: shard_keys(idx, 0))
    for i in _footer_flips(foreign):
        attempt("convert's ParquetSource", i, convert_source)
    assert time.monotonic() - t0 < 150
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
        assert list(ix.names) == ["0good.tar"]
        assert sorted(os.path.basename(p) for p, _ in ix.skipped) == [
            "1nonutf8.tar", "2badsum.tar", "3trunc.tar", "4trunc.tar.gz"]
        with pytest.raises(ShardError):
            open_index(src)
