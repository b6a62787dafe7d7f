"""Shard readers: sequential iteration and random access by sample index.

Tar shards are memory-mapped and read through their sidecar's offsets; each
sample's payload is checked against the sidecar's xxh3 checksum before it is
handed over, so bytes damaged on disk are never delivered as data.
Compressed tars (.tar.gz, .tar.zst) cannot be seeked: they are decompressed
once into memory (capped, the cap checked as bytes arrive) and then read the
same way. Parquet and Arrow shards are read by row group / record batch.
"""

from __future__ import annotations

import gzip
import mmap
import os
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
import zstandard

from shardfeed.formats.arrow_checksums import check_batch
from shardfeed.formats.engine import decompress_ahead, decompressed
from shardfeed.formats.errors import ShardError
from shardfeed.formats.files import check_regular, open_regular
from shardfeed.formats.sidecar import SIDECAR_SUFFIX, SampleTable, read_sidecar, sample_checksum, scan_tar

# A compressed shard is held in memory while read; refuse pathological ones
# (a "zip bomb") instead of exhausting memory. 1 GiB: a compressed shard is
# typically 64-512 MiB decompressed; the total of all open ones is bounded
# apart (decompressed.py).
MAX_DECOMPRESSED_BYTES = int(os.environ.get("SHARDFEED_MAX_DECOMPRESSED_BYTES", 1 << 30))
_CHUNK = 8 << 20


def hash_file(path: str) -> str:
    """Hex xxh3-128 of a file's bytes (the index's content hash)."""
    h = xxhash.xxh3_128()
    with open_regular(path, what="shard") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _decompress(stream, path: str, limit: int) -> bytes:
    out = bytearray()
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            return bytes(out)
        out += chunk
        if len(out) > limit:
            raise ShardError(path, f"decompresses to more than {limit} bytes; raise "
                                   "SHARDFEED_MAX_DECOMPRESSED_BYTES if this shard is genuine")


def _gunzip(path: str, limit: int) -> bytes:
    """A .tar.gz shard's bytes: each gzip member inflated by zlib in one call
    straight into its output, bounded by ``limit``: ~15% faster than
    GzipFile (measured on 7 MB shards) and half its peak memory, since
    GzipFile's 8 MiB reads are gathered in a bytearray that is then copied
    whole into bytes. Like GzipFile: members may follow one another,
    zero padding may follow the last; a member cut short is an error."""
    with open_regular(path, what="shard") as raw:
        if os.fstat(raw.fileno()).st_size == 0:
            raise ShardError(path, "gzip stream is corrupt or truncated: the file is empty")
        with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            view = memoryview(buf)
            data: memoryview | bytes = view
            parts: list[bytes] = []
            total = 0
            try:
                while True:
                    d = zlib.decompressobj(31)
                    out = d.decompress(data, limit - total + 1)
                    total += len(out)
                    parts.append(out)
                    if total > limit:
                        raise ShardError(path, f"decompresses to more than {limit} bytes; raise "
                                               "SHARDFEED_MAX_DECOMPRESSED_BYTES if this shard is genuine")
                    if not d.eof:
                        raise ShardError(path, "gzip stream is corrupt or truncated: "
                                               "it ends inside a member (truncated shard)")
                    data = d.unused_data.lstrip(b"\0")
                    if not data:
                        break
            finally:
                view.release()
    return parts[0] if len(parts) == 1 else b"".join(parts)


_ZSTD_MAGIC = 0xFD2FB528


def check_zstd_frames(buf, path: str) -> None:
    """Walk the frame and block headers of a zstd file; raise on a cut or a
    malformed frame.

    Why: zstandard's stream reader returns a truncated frame's bytes without
    complaint, and a cut at a block boundary then looks like a shorter, valid
    tar. Frame-at-a-time decompressobj() would notice, but cannot bound its
    output (one call may inflate a few KiB into GiB). So the structure is
    checked here (a 3-byte header per <=128 KiB block: ~2,000 per 256 MiB
    shard) and the bytes are then decoded by the bounded stream reader.
    """
    n = len(buf)
    pos = 0
    if n == 0:
        raise ShardError(path, "zstd frame error: the file is empty (truncated shard)")
    while pos < n:
        if n - pos < 8:
            raise ShardError(path, f"zstd frame error: {n - pos} stray bytes at {pos} (truncated frame)")
        magic = int.from_bytes(buf[pos:pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
            size = int.from_bytes(buf[pos + 4:pos + 8], "little")
            if pos + 8 + size > n:
                raise ShardError(path, f"zstd frame error: skippable frame at {pos} runs past the end")
            pos += 8 + size
            continue
        if magic != _ZSTD_MAGIC:
            raise ShardError(path, f"zstd frame error: no zstd magic number at byte {pos}")
        fhd = buf[pos + 4]
        single = (fhd >> 5) & 1
        fcs = (0, 2, 4, 8)[fhd >> 6] or single
        if fhd & 0x08:
            raise ShardError(path, f"zstd frame error: reserved bit set in the frame header at {pos}")
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + fcs
        while True:
            if pos + 3 > n:
                raise ShardError(path, "zstd frame error: the last frame is truncated (file cut short)")
            bh = int.from_bytes(buf[pos:pos + 3], "little")
            btype, bsize = (bh >> 1) & 3, bh >> 3
            if btype == 3:
                raise ShardError(path, f"zstd frame error: reserved block type at byte {pos}")
            pos += 3 + (1 if btype == 1 else bsize)
            if pos > n:
                raise ShardError(path, "zstd frame error: the last frame is truncated (file cut short)")
            if bh & 1:
                break
        pos += 4 if fhd & 0x04 else 0
        if pos > n:
            raise ShardError(path, "zstd frame error: the last frame's checksum is cut off (truncated)")


def _decompress_zstd(path: str, limit: int) -> bytes:
    with open_regular(path, what="shard") as raw:
        if os.fstat(raw.fileno()).st_size == 0:
            raise ShardError(path, "zstd frame error: the file is empty (truncated shard)")
        with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            check_zstd_frames(buf, path)
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as f:
            return _decompress(f, path, limit)


def load_tar_stream(path: str, fmt: str, limit: int | None = None):
    """The shard's tar bytes: an mmap for plain tar, decompressed bytes otherwise."""
    limit = MAX_DECOMPRESSED_BYTES if limit is None else limit
    try:
        if fmt == "tar":
            with open_regular(path, what="shard") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise ShardError(path, "shard is empty (0 bytes; truncated)")
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if fmt == "tar.gz":
            return _gunzip(path, limit)
        if fmt == "tar.zst":
            return _decompress_zstd(path, limit)
    except FileNotFoundError as e:
        raise ShardError(path, "shard is missing (no such file)") from e
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ShardError(path, f"gzip stream is corrupt or truncated: {e}") from e
    except zstandard.ZstdError as e:
        raise ShardError(path, f"zstd frame error: {e}") from e
    raise ShardError(path, f"format {fmt!r} is not a tar format")


class TarShardReader:
    """Random access to one tar shard through its sample table."""

    def __init__(self, path: str, fmt: str = "tar", table: SampleTable | None = None,
                 expected_bytes: int | None = None, verify: bool = True, require_sidecar: bool = False):
        """``require_sidecar``: the shard belongs to an indexed dataset, so its
        sidecar must be there (ShardError if not); otherwise a tar without one
        is foreign and scanned once."""
        self.path = path
        self.verify = verify
        self.budget_bytes = 0
        if expected_bytes is not None:
            try:
                actual = check_regular(path, what="shard")
            except FileNotFoundError as e:
                raise ShardError(path, "shard is missing (no such file)") from e
            if actual != expected_bytes:
                raise ShardError(path, f"shard has {actual} bytes but the index says {expected_bytes} "
                                       "(truncated, replaced or index mismatch)")
        # decompressed ahead by this process's background thread (counted already), or here
        ahead = decompress_ahead.claim(path) if fmt in ("tar.gz", "tar.zst") else None
        if ahead is not None:
            self.data, self.budget_bytes = ahead
        else:
            self.data = load_tar_stream(path, fmt)
        try:
            if not isinstance(self.data, mmap.mmap) and not self.budget_bytes:
                self.budget_bytes = decompressed.acquire(len(self.data), path)
            if table is None:
                try:
                    table, meta = read_sidecar(path + SIDECAR_SUFFIX, path)
                except FileNotFoundError:
                    if require_sidecar:
                        raise ShardError(path, f"sidecar {os.path.basename(path)}{SIDECAR_SUFFIX} is missing: "
                                               "its samples cannot be checked against their checksums; "
                                               "restore it (or rewrite the dataset with `shardfeed convert`)"
                                         ) from None
                    table = scan_tar(self.data, path)  # a foreign tar: index it once
                else:
                    on_disk = os.path.getsize(path)
                    if meta["shard_bytes"] != on_disk:
                        raise ShardError(path, f"sidecar describes a shard of {meta['shard_bytes']} bytes but "
                                               f"the shard has {on_disk} (stale sidecar or replaced shard)")
            table.validate(path, len(self.data))
        except BaseException:
            if isinstance(self.data, mmap.mmap):
                try:
                    self.data.close()
                except BufferError:  # the traceback's frames still view it: the GC unmaps it
                    pass
            decompressed.release(self.budget_bytes)
            self.budget_bytes = 0
            raise
        self.table = table
        self.view = memoryview(self.data)
        self.fields = table.fields

    def __len__(self) -> int:
        return len(self.table)

    def key(self, i: int) -> str:
        return self.table.keys[i]

    def read(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as ``{"__key__": key, ext: bytes}``."""
        n = len(self.table)
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for shard {self.path} of {n} samples")
        t = self.table
        a, b = int(t.member_start[i]), int(t.member_start[i + 1])
        mv = self.view
        parts = [mv[o:o + s] for o, s in zip(t.offset[a:b].tolist(), t.size[a:b].tolist())]
        if self.verify and sample_checksum(parts) != int(t.checksum[i]):
            for p in parts:  # a traceback keeps this frame alive: let close() unmap
                p.release()
            raise ShardError(self.path, f"sample {i} ({t.keys[i]!r}) fails its checksum "
                                        "(bytes damaged on disk)")
        sample: dict[str, Any] = {"__key__": t.keys[i]}
        for f, p in zip(t.member_field[a:b].tolist(), parts):
            sample[t.fields[f]] = bytes(p)
        return sample

    def read_many(self, indices) -> list[dict[str, Any]]:
        return [self.read(i) for i in np.asarray(indices, np.int64).tolist()]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self.read(i)

    def close(self) -> None:
        """Safe to call twice. If a caller still holds a view into the map,
        the map is left for the garbage collector instead of failing."""
        self.view.release()
        decompressed.release(self.budget_bytes)
        self.budget_bytes = 0
        if isinstance(self.data, mmap.mmap):
            try:
                self.data.close()
            except BufferError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_FOOTER_ERRORS = (pa.ArrowException, OSError, ValueError, KeyError, TypeError, IndexError, OverflowError,
                  AttributeError, UnicodeDecodeError)


class ColumnarShardReader:
    """Parquet (by row group) and Arrow IPC (memory-mapped record batches).

    Random access pulls one row out of a cached Arrow batch (no whole-group
    Python conversion); iteration converts a group at a time. Every batch is
    fully validated before its values are touched: the file is untrusted and
    Arrow follows its offsets blindly.
    """

    def __init__(self, path: str, fmt: str, expected_bytes: int | None = None, verify: bool = True):
        self.path = path
        self.verify = verify
        self._pf = None
        self._src = None
        self._schema_meta = None
        try:
            on_disk = check_regular(path, what="shard")
            if expected_bytes is not None and on_disk != expected_bytes:
                raise ShardError(path, f"shard has {on_disk} bytes but the index says "
                                       f"{expected_bytes} (truncated, replaced or index mismatch)")
            if fmt == "parquet":
                # no pre_buffer: it reads each row group's column chunks into fresh large buffers first,
                # which with pyarrow's default pool (mimalloc) made a fresh process's first decode of
                # every group 1-5x slower, varying run to run (2 KiB global, 32 groups: 41-227 ms against
                # a steady 37-57 ms); it serves high-latency storage, and shards here are local files
                self._pf = pq.ParquetFile(path, page_checksum_verification=verify, pre_buffer=False)
                md = self._pf.metadata
                sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
                schema = self._pf.schema_arrow
            elif fmt == "arrow":
                self._src = pa.memory_map(path, "r")
                self._ipc = pa.ipc.open_file(self._src)
                sizes = [self._ipc.get_batch(b).num_rows for b in range(self._ipc.num_record_batches)]
                schema = self._ipc.schema
                self._schema_meta = schema.metadata
            else:
                raise ShardError(path, f"format {fmt!r} is not a columnar format (parquet, arrow)")
        except FileNotFoundError as e:
            self.close()
            raise ShardError(path, "shard is missing (no such file)") from e
        except _FOOTER_ERRORS as e:  # a damaged footer breaks pyarrow in many ways
            self.close()
            raise ShardError(path, f"{fmt} shard is unreadable: {type(e).__name__}: {e}") from e
        except ShardError:
            self.close()
            raise
        if any(n < 0 for n in sizes):
            self.close()
            raise ShardError(path, "negative row count in shard metadata (corrupt shard)")
        self.group_start = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=self.group_start[1:])
        self.fields = [n for n in schema.names if n != "__key__"]
        self._cached: tuple[int, pa.RecordBatch] | None = None
        self._mapped: dict[int, pa.RecordBatch] = {}

    def __len__(self) -> int:
        return int(self.group_start[-1])

    def _group(self, g: int) -> pa.RecordBatch | pa.Table:
        if self._cached is not None and self._cached[0] == g:
            return self._cached[1]
        if g in self._mapped:
            return self._mapped[g]
        try:
            if self._pf is not None:
                # one thread: a loader reads in each of its processes already, and
                # pyarrow's pool decoding into fresh memory measured 3-5x slower
                # (25 MB row groups of 100 KiB values: 60-130 ms against ~20 ms)
                batch = self._pf.read_row_group(g, use_threads=False)
            else:
                batch, batch_meta = self._ipc.get_batch_with_custom_metadata(g)
            batch.validate(full=True)
            if batch.num_rows != self.group_start[g + 1] - self.group_start[g]:
                raise ValueError(f"holds {batch.num_rows} rows, metadata says "
                                 f"{self.group_start[g + 1] - self.group_start[g]}")
            if self._pf is None and self.verify:
                check_batch(self.path, g, self._schema_meta, batch_meta, batch)
        except _FOOTER_ERRORS as e:
            raise ShardError(self.path, f"row group {g} is unreadable: {type(e).__name__}: {e}") from e
        if self._pf is None:
            # Arrow batches are views of the mapping: keeping every validated
            # one costs no memory and spares random access a re-validation.
            self._mapped[g] = batch
        else:
            self._cached = (g, batch)
        return batch

    def read(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for shard {self.path} of {len(self)} samples")
        g = int(np.searchsorted(self.group_start, i, side="right") - 1)
        batch = self._group(g)
        j = i - int(self.group_start[g])
        return {name: batch.column(k)[j].as_py() for k, name in enumerate(batch.schema.names)}

    def read_many(self, indices) -> list[dict[str, Any]]:
        return [self.read(i) for i in np.asarray(indices, np.int64).tolist()]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for g in range(len(self.group_start) - 1):
            yield from self._group(g).to_pylist()

    def close(self) -> None:
        self._cached = None
        self._mapped = {}
        self._ipc = None
        if self._src is not None:
            self._src.close()
            self._src = None
        if self._pf is not None and hasattr(self._pf, "close"):
            self._pf.close()
        self._pf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_shard(index, i: int, path: str | None = None, verify: bool = True):
    """A reader for shard ``i`` of ``index`` (``path`` overrides where it lives,
    e.g. a cached local copy)."""
    info = index.shard(i)
    path = path or index.path(i)
    if info.format in ("parquet", "arrow"):
        return ColumnarShardReader(path, info.format, expected_bytes=info.bytes, verify=verify)
    table = index.tables.get(i)
    reader = TarShardReader(path, info.format, table=table, expected_bytes=info.bytes, verify=verify,
                            require_sidecar=table is None)
    if len(reader) != info.samples:
        reader.close()
        raise ShardError(path, f"shard holds {len(reader)} samples but the index says {info.samples}")
    return reader


def shard_keys(index, i: int, path: str | None = None) -> list[str]:
    """The sample keys of shard ``i`` in stored order, without reading payloads.

    Tar: from the sidecar (digest-checked) or the table scanned on open;
    Parquet/Arrow: the ``__key__`` column alone (validated, page checksums on).
    For key lookup, which needs every shard's keys but none of their bytes.
    """
    info = index.shard(i)
    path = path or index.path(i)
    if info.format in ("parquet", "arrow"):
        keys = _columnar_keys(path, info.format)
    elif index.tables.get(i) is not None:
        keys = index.tables[i].keys
    else:
        try:
            keys = read_sidecar(path + SIDECAR_SUFFIX, path)[0].keys
        except FileNotFoundError:
            raise ShardError(path, f"sidecar {os.path.basename(path)}{SIDECAR_SUFFIX} is missing: restore it "
                                   "(or rewrite the dataset with `shardfeed convert`)") from None
    if len(keys) != info.samples:
        raise ShardError(path, f"shard holds {len(keys)} keys but the index says {info.samples} samples")
    return keys


def _columnar_keys(path: str, fmt: str) -> list[str]:
    try:
        if fmt == "parquet":
            check_regular(path, what="shard")
            col = pq.ParquetFile(path, page_checksum_verification=True).read(columns=["__key__"]).column(0)
        else:  # through the reader: each batch's checksum covers its keys
            with ColumnarShardReader(path, fmt) as r:
                col = pa.chunked_array([r._group(g).column("__key__") for g in range(len(r.group_start) - 1)],
                                       pa.string())
        col.validate(full=True)
        if col.null_count:
            raise ValueError(f"{col.null_count} null keys")
        return col.to_pylist()
    except FileNotFoundError as e:
        raise ShardError(path, "shard is missing (no such file)") from e
    except _FOOTER_ERRORS as e:
        raise ShardError(path, f"{fmt} shard's __key__ column is unreadable: {type(e).__name__}: {e}") from e


def verify_shard(index, i: int, path: str | None = None) -> None:
    """Check the shard's size, content hash, offsets and every sample checksum."""
    info = index.shard(i)
    path = path or index.path(i)
    try:
        actual = hash_file(path)
    except FileNotFoundError as e:
        raise ShardError(path, "shard is missing (no such file)") from e
    if actual != info.hash:
        raise ShardError(path, f"content hash {actual} does not match the index's {info.hash}")
    with open_shard(index, i, path) as r:
        for j in range(len(r)):
            r.read(j)
