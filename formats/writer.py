"""ShardWriter: samples in, finished shards plus an index out.

A shard's life: OPEN (``*.tmp-PID``, never listed) -> sidecar written ->
renamed to its final name -> listed in the index (at close) or committed to
the log at once (``append=True``). A crash leaves only temp files, never a
half-written shard under a published name; a shard renamed but killed before
its commit is a file no reader lists (readers go by the index and log, never
by the folder).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
import zstandard

from shardfeed.formats.arrow_checksums import batch_metadata, mark_schema
from shardfeed.formats.codecs import codec_of, encode_field
from shardfeed.formats.commit_log import end_stream, publish
from shardfeed.formats.errors import ShardError
from shardfeed.formats.index import INDEX_NAME, LOG_DIR, ShardInfo, write_index
from shardfeed.formats.readers import hash_file
from shardfeed.formats.sidecar import SIDECAR_SUFFIX, SampleTable, sample_checksum, write_sidecar
from shardfeed.formats.tar import END_OF_ARCHIVE, member_header, padding

_FIELD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")
_SUFFIX = {("tar", None): ".tar", ("tar", "zstd"): ".tar.zst", ("parquet", None): ".parquet",
           ("arrow", None): ".arrow"}


def check_key(key: Any) -> str:
    """A key must read back as itself and never look like a path."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"__key__ must be a non-empty str, got {key!r}")
    parts = key.split("/")
    if (key.startswith("/") or "\\" in key or "\0" in key or any(p in ("", ".", "..") for p in parts)):
        raise ValueError(f"__key__ {key!r} is path-like (absolute, empty or '..' parts); use a plain key")
    if "." in parts[-1]:
        raise ValueError(f"__key__ {key!r} has a '.' after its last '/': readers would split the "
                         "extension there (WebDataset convention); replace the dot")
    return key


def check_field(name: str) -> str:
    if not _FIELD_RE.match(name):
        raise ValueError(f"field name {name!r} is not an extension like 'jpg', 'cls' or 'seg.png'")
    return name


MAX_FIELDS = 32767  # distinct field names in one tar shard: sidecar field ids are int16


def approx_sample_bytes(format: str, sample: dict[str, Any]) -> int:
    """What ``sample`` adds to a shard's size as ShardWriter measures it against
    ``max_shard_bytes`` (a tar's uncompressed members; a columnar shard's values),
    so a conversion can plan a 1-process run's shard boundaries before writing."""
    key, total = sample["__key__"], 0
    for ext, value in sample.items():
        if ext.startswith("__"):
            continue
        if format == "tar":
            n = len(encode_field(ext, value))
            total += len(member_header(f"{key}.{ext}", n)) + n + len(padding(n))
        elif codec_of(ext) == "int" and not isinstance(value, (bytes, bytearray)):
            total += 8  # as _ColumnarShard.add counts them
        elif codec_of(ext) == "text" and isinstance(value, str):
            total += len(value)
        else:
            total += len(encode_field(ext, value))
    return total


class _TarShard:
    def __init__(self, path: str, compression: str | None):
        self.path = path
        self.tmp = f"{path}.tmp-{os.getpid()}"
        self.file = open(self.tmp, "wb")
        self.hasher = xxhash.xxh3_128()
        self.zstd = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj() if compression == "zstd" else None
        self.pos = 0  # position in the uncompressed tar stream
        self.disk_bytes = 0
        self.keys: list[str] = []
        self.starts = [0]
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.field_ids: list[int] = []
        self.fields: dict[str, int] = {}
        self.checks: list[int] = []

    def _emit(self, data: bytes) -> None:
        self.pos += len(data)
        if self.zstd is not None:
            data = self.zstd.compress(data)
            if not data:
                return
        self.hasher.update(data)
        self.file.write(data)
        self.disk_bytes += len(data)

    def add(self, key: str, fields: list[tuple[str, bytes]]) -> None:
        if self.keys and self.keys[-1] == key:
            # a tar groups consecutive members by key: the two samples would read back as one
            raise ValueError(f"__key__ {key!r} is written twice in a row; keys must differ from the "
                             "previous sample's (a tar reader would merge the two samples)")
        new = {ext for ext, _ in fields} - self.fields.keys()
        if len(self.fields) + len(new) > MAX_FIELDS:
            raise ValueError(f"sample {key!r} brings shard {self.path} to {len(self.fields) + len(new)} distinct "
                             f"field names, over {MAX_FIELDS} (the sidecar stores field ids as int16); use "
                             "fewer distinct extensions or smaller shards")
        out = []
        for ext, payload in fields:
            hdr = member_header(f"{key}.{ext}", len(payload))
            self.offsets.append(self.pos + sum(len(b) for b in out) + len(hdr))
            self.sizes.append(len(payload))
            self.field_ids.append(self.fields.setdefault(ext, len(self.fields)))
            out += [hdr, payload, padding(len(payload))]
        self._emit(b"".join(out))
        self.keys.append(key)
        self.starts.append(len(self.offsets))
        self.checks.append(sample_checksum(p for _, p in fields))

    @property
    def approx_bytes(self) -> int:
        return self.pos

    @property
    def count(self) -> int:
        return len(self.keys)

    def finish(self) -> tuple[str, int, str, int]:
        self._emit(END_OF_ARCHIVE)
        if self.zstd is not None:
            tail = self.zstd.flush()
            self.hasher.update(tail)
            self.file.write(tail)
            self.disk_bytes += len(tail)
        self.file.close()
        table = SampleTable(self.keys, np.asarray(self.starts, np.int64), np.asarray(self.offsets, np.int64),
                            np.asarray(self.sizes, np.int64), np.asarray(self.field_ids, np.int16),
                            list(self.fields), np.asarray(self.checks, np.uint64), self.pos)
        digest = self.hasher.hexdigest()
        write_sidecar(self.path + SIDECAR_SUFFIX, table, self.disk_bytes, digest)
        os.replace(self.tmp, self.path)
        return self.path, len(self.keys), digest, self.disk_bytes

    def abort(self) -> None:
        self.file.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


class _ColumnarShard:
    """Rows buffered into record batches; ints and text typed, the rest binary."""

    ROWS_PER_GROUP = 1024

    def __init__(self, path: str, fmt: str, compression: str | None):
        self.path = path
        self.fmt = fmt
        self.tmp = f"{path}.tmp-{os.getpid()}"
        self.compression = compression
        self.rows: list[dict] = []
        self.schema: pa.Schema | None = None
        self.writer = None
        self.count = 0
        self.approx_bytes = 0

    def add(self, key: str, fields: list[tuple[str, Any]]) -> None:
        row = {"__key__": key}
        for ext, value in fields:
            codec = codec_of(ext)
            if codec == "int" and not isinstance(value, (bytes, bytearray)):
                row[ext] = int(value)
                self.approx_bytes += 8
            elif codec == "text" and isinstance(value, str):
                row[ext] = value
                self.approx_bytes += len(value)
            else:
                row[ext] = encode_field(ext, value)
                self.approx_bytes += len(row[ext])
        if self.schema is None:
            self.schema = pa.schema([pa.field("__key__", pa.string())] + [
                pa.field(ext, pa.int64() if isinstance(v, int) else pa.string() if isinstance(v, str)
                         else pa.large_binary()) for ext, v in row.items() if ext != "__key__"])
        elif set(row) != set(self.schema.names):
            raise ValueError(f"sample {key!r} has fields {sorted(row)} but this {self.fmt} shard's "
                             f"schema is {sorted(self.schema.names)}; columnar shards need one schema")
        self.rows.append(row)
        self.count += 1
        if len(self.rows) >= self.ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if not self.rows:
            return
        batch = pa.RecordBatch.from_pylist(self.rows, schema=self.schema)
        self.rows = []
        if self.writer is None:
            if self.fmt == "parquet":
                # Dictionary pages only pay for low-cardinality columns (labels,
                # short text); for payload bytes they are wasted work on write.
                small = [f.name for f in self.schema if not pa.types.is_large_binary(f.type)]
                self.writer = pq.ParquetWriter(self.tmp, self.schema, compression=self.compression or "none",
                                               write_page_checksum=True, use_dictionary=small)
            else:
                self.sink = pa.OSFile(self.tmp, "wb")
                self.writer = pa.ipc.new_file(self.sink, mark_schema(self.schema))
        if self.fmt == "parquet":
            self.writer.write_batch(batch, row_group_size=self.ROWS_PER_GROUP)
        else:  # Arrow IPC has no checksums of its own (arrow_checksums.py)
            self.writer.write_batch(batch, custom_metadata=batch_metadata(batch))

    def finish(self) -> tuple[str, int, str, int]:
        self._flush()
        self.writer.close()
        if self.fmt == "arrow":
            self.sink.close()
        digest = hash_file(self.tmp)
        size = os.path.getsize(self.tmp)
        os.replace(self.tmp, self.path)
        return self.path, self.count, digest, size

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


class ShardWriter:
    """Write samples into shards of a dataset folder and index them.

    >>> with ShardWriter("out", max_shard_samples=1000) as w:
    ...     w.write({"__key__": "000001", "jpg": jpeg_bytes, "cls": 3})

    ``format``: "tar" (WebDataset-compatible, ``compression="zstd"`` for
    .tar.zst), "parquet" (``compression`` is the Parquet codec) or "arrow"
    (Arrow IPC, memory-mapped on read). ``append=True`` adds to a live dataset:
    each finished shard is committed at once and readers that follow the
    dataset see it, never a partial one.
    """

    def __init__(self, root: str, format: str = "tar", max_shard_bytes: int = 256 << 20,
                 max_shard_samples: int | None = None, compression: str | None = None,
                 append: bool = False, prefix: str = "shard"):
        if format not in ("tar", "parquet", "arrow"):
            raise ValueError(f"format {format!r} is not one of 'tar', 'parquet', 'arrow'")
        if format == "tar" and compression not in (None, "zstd"):
            raise ValueError(f"tar compression {compression!r}: use None or 'zstd'")
        if format == "arrow" and compression is not None:
            raise ValueError("arrow shards are stored uncompressed so they can be memory-mapped")
        if max_shard_bytes <= 0 or (max_shard_samples is not None and max_shard_samples <= 0):
            raise ValueError("max_shard_bytes and max_shard_samples must be positive")
        self.root = str(root)
        self.format = format
        self.compression = compression
        self.max_shard_bytes = max_shard_bytes
        self.max_shard_samples = max_shard_samples
        self.append = append
        self.prefix = prefix
        os.makedirs(self.root, exist_ok=True)
        has_data = os.path.exists(os.path.join(self.root, INDEX_NAME)) or os.path.isdir(
            os.path.join(self.root, LOG_DIR))
        if has_data and not append:
            raise ShardError(self.root, "a dataset already exists here; pass append=True to add to it "
                                        "or write to a new folder")
        if append:
            # The log folder marks a live dataset: open_index sees an empty one
            # before the first shard is published.
            os.makedirs(os.path.join(self.root, LOG_DIR), exist_ok=True)
        # Appending writers name shards uniquely so concurrent writers never collide.
        self._tag = f"{time.time_ns():x}-{os.getpid()}-" if append else ""
        self.shards: list[ShardInfo] = []
        self.fields: list[str] = []
        self._current = None
        self._n = 0
        self._closed = False
        self.samples_written = 0
        self.bytes_written = 0

    def _new_shard(self):
        name = f"{self.prefix}-{self._tag}{self._n:06d}{_SUFFIX[(self.format, self.compression if self.format == 'tar' else None)]}"
        self._n += 1
        path = os.path.join(self.root, name)
        if self.format == "tar":
            return _TarShard(path, self.compression)
        return _ColumnarShard(path, self.format, self.compression)

    def write(self, sample: dict[str, Any]) -> None:
        if self._closed:
            raise RuntimeError("ShardWriter is closed")
        key = check_key(sample.get("__key__"))
        fields = []
        for ext, value in sample.items():
            if ext.startswith("__"):
                continue
            check_field(ext)
            fields.append((ext, encode_field(ext, value) if self.format == "tar" else value))
            if ext not in self.fields:
                self.fields.append(ext)
        if not fields:
            raise ValueError(f"sample {key!r} has no fields besides __key__")
        if self._current is None:
            self._current = self._new_shard()
        self._current.add(key, fields)
        self.samples_written += 1
        if (self._current.approx_bytes >= self.max_shard_bytes
                or (self.max_shard_samples and self._current.count >= self.max_shard_samples)):
            self._finish_shard()

    def _finish_shard(self) -> None:
        shard, self._current = self._current, None
        path, count, digest, size = shard.finish()
        name = os.path.relpath(path, self.root).replace(os.sep, "/")
        fmt = "tar.zst" if name.endswith(".tar.zst") else name.rsplit(".", 1)[-1]
        info = ShardInfo(name, fmt, count, size, digest)
        self.shards.append(info)
        self.bytes_written += size
        if self.append:
            publish(self.root, info, self.fields)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._finish_shard()
        if not self.append:
            write_index(self.root, self.shards, self.fields)

    def end_stream(self) -> int:
        """Publish the shard in progress, then the commit that ends the growing
        dataset (followers end their iteration there, all at the same step);
        closes the writer. Returns the end's sequence number. ShardError if
        another writer ended the stream first."""
        if not self.append:
            raise ValueError(f"{self.root}: end_stream() ends a growing dataset; open the writer with "
                             "append=True (a dataset written without it is complete at close())")
        self.close()
        return end_stream(self.root)

    def abort(self) -> None:
        """Drop the shard in progress; finished shards stay, no index is written."""
        self._closed = True
        if self._current is not None:
            self._current.abort()
            self._current = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        else:
            self.close()
