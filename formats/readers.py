"""Shard readers: sequential iteration and random access by sample index.

Tar shards are memory-mapped and read through their sidecar's offsets; each
sample's payload is checked against the sidecar's xxh3 checksum before it is
handed over, so bytes damaged on disk are never delivered as data.
Compressed tars (.tar.gz, .tar.zst) cannot be seeked: they are decompressed
once into memory (capped, the cap checked as bytes arrive; tar_stream.py) and
then read the same way. Parquet and Arrow shards are read by row group / record batch.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import xxhash

from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.engine import decoded_budget
from shardfeed.formats.errors import ShardError
from shardfeed.formats.files import check_regular, open_regular
from shardfeed.formats.own_tables import read_sidecar
from shardfeed.formats.sidecar import SIDECAR_SUFFIX, SampleTable, sample_checksum, scan_tar
from shardfeed.formats.sidecar_memo import read_sidecar_once, validate_once
from shardfeed.formats.tar_stream import load_tar_stream

pa = lazy_module("pyarrow", globals(), "pa")  # Parquet and Arrow shards only: a tar read never imports it

# compressed tar shards only: a process that reads plain tar never imports it (issue #24)
decompress_thread = lazy_module("shardfeed.formats.engine.decompress_thread", globals(), "decompress_thread")
_CHUNK = 8 << 20  # read size while hashing a shard


def hash_file(path: str) -> str:
    """Hex xxh3-128 of a file's bytes (the index's content hash)."""
    h = xxhash.xxh3_128()
    with open_regular(path, what="shard") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class TarShardReader:
    """Random access to one tar shard through its sample table."""

    def __init__(self, path: str, fmt: str = "tar", table: SampleTable | None = None,
                 expected_bytes: int | None = None, verify: bool = True, require_sidecar: bool = False,
                 expected_hash: str | None = None):
        """``require_sidecar``: the shard belongs to an indexed dataset, so its
        sidecar must be there (ShardError if not); otherwise a tar without one
        is foreign and scanned once. ``expected_hash``: the index's (or the
        commit's) content hash, checked against the one the sidecar records,
        so a shard replaced whole (another valid shard, its own sidecar beside
        it, even of the same size) is refused without hashing the file."""
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
        ahead = decompress_thread.claim(path) if fmt in ("tar.gz", "tar.zst") else None
        if ahead is not None:
            self.data, self.budget_bytes = ahead
        else:
            self.data = load_tar_stream(path, fmt)
        try:
            if not isinstance(self.data, mmap.mmap) and not self.budget_bytes:
                self.budget_bytes = decoded_budget.acquire(len(self.data), path)
            if table is None:
                try:
                    table, meta = read_sidecar_once(path + SIDECAR_SUFFIX, path)
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
                    recorded = meta.get("shard_hash")
                    if expected_hash is not None and recorded is not None and recorded != expected_hash:
                        raise ShardError(path, f"sidecar was written for another version of the shard (hash "
                                               f"{recorded!r}, the index says {expected_hash!r}): the shard was "
                                               "replaced after it was committed")
            validate_once(table, path, len(self.data))  # a table read before was checked against this size
        except BaseException:
            if isinstance(self.data, mmap.mmap):
                try:
                    self.data.close()
                except BufferError:  # the traceback's frames still view it: the GC unmaps it
                    pass
            decoded_budget.release(self.budget_bytes)
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
        decoded_budget.release(self.budget_bytes)
        self.budget_bytes = 0
        if isinstance(self.data, mmap.mmap):
            try:
                self.data.close()
            except BufferError:
                pass
        else:
            # a compressed shard's decompressed bytes: the budget no longer counts them, so the reader
            # must not keep them either (a closed reader still referenced, by a table of shards or a
            # traceback, held its whole shard: memory grew with every compressed shard opened)
            self.data = b""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _footer_errors() -> tuple:  # a function: pyarrow is imported only where it is used
    return (pa.ArrowException, OSError, ValueError, KeyError, TypeError, IndexError, OverflowError,
            AttributeError, UnicodeDecodeError)


def __getattr__(name: str):
    if name == "FOOTER_ERRORS":  # what a damaged Parquet/Arrow footer makes pyarrow raise, for other readers
        return _footer_errors()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
                import pyarrow.parquet as pq  # only Parquet shards need it (~40 ms of a fresh process)
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
        except _footer_errors() as e:  # a damaged footer breaks pyarrow in many ways
            self.close()
            raise ShardError(path, f"{fmt} shard is unreadable: {type(e).__name__}: {e}") from e
        except ShardError:
            self.close()
            raise
        if any(n < 0 for n in sizes):
            self.close()
            raise ShardError(path, "negative row count in shard metadata (corrupt shard)")
        if "__key__" not in schema.names:  # every shard written here has one: a damaged footer renamed it
            self.close()
            raise ShardError(path, f"{fmt} shard has no __key__ column (damaged footer, or not a shard of this "
                                   f"dataset; its columns: {', '.join(schema.names)[:200]})")
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
                from shardfeed.formats.arrow_checksums import check_batch  # columnar shards only (issue #24)

                check_batch(self.path, g, self._schema_meta, batch_meta, batch)
        except _footer_errors() as e:
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
    # the index's columns, not index.shard(i): a ShardInfo per shard would define that dataclass on every
    # first read (shard_info.py, issue #24)
    fmt, size, samples = index.formats[i], int(index.sizes[i]), int(index.counts[i])
    path = path or index.path(i)
    if fmt in ("parquet", "arrow"):
        return ColumnarShardReader(path, fmt, expected_bytes=size, verify=verify)
    table = index.tables.get(i)
    reader = TarShardReader(path, fmt, table=table, expected_bytes=size, verify=verify,
                            require_sidecar=table is None, expected_hash=index.hashes[i])
    if len(reader) != samples:
        reader.close()
        raise ShardError(path, f"shard holds {len(reader)} samples but the index says {samples}")
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
    return list(keys)


def _columnar_keys(path: str, fmt: str) -> list[str]:
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq
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
    except _footer_errors() as e:
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
