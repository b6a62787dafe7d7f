"""Per-record-batch checksums of Arrow IPC shards.

Parquet has page checksums and tar samples have the sidecar's; an Arrow IPC
file has nothing, and ``validate(full=True)`` only proves that offsets stay
in bounds: a flipped payload byte, or a flipped bit in the footer that turns
one valid value into another, reads back as different data. So the writer
stores an xxh3-64 of each record batch's values in that batch's custom
metadata, and the schema metadata marks the file as carrying them; the
reader checks a batch once, when it first validates it (the batch fast path
reads batches through the same call), at memory speed.

The checksum covers the schema (names and types, so a footer flip that
renames or retypes a column shows) and each column's values in a canonical
form (normalised offsets, the bytes they span, the null mask), never raw
buffers, whose padding and capacity are the writer's business.
"""

from __future__ import annotations

import json

import numpy as np
import xxhash

from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.errors import ShardError
from shardfeed.formats.sidecar import fixed_width_values

pa = lazy_module("pyarrow", globals(), "pa")  # Parquet and Arrow shards only: a tar read never imports it

SCHEMA_KEY = b"shardfeed.arrow"
BATCH_KEY = b"shardfeed.xxh3_64"
SCHEMA_META = json.dumps({"version": 1, "checksum": "xxh3_64 per record batch"}).encode()


def mark_schema(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({**(schema.metadata or {}), SCHEMA_KEY: SCHEMA_META})


def batch_checksum(batch: pa.RecordBatch) -> str:
    h = xxhash.xxh3_64()
    for f in batch.schema:
        h.update(f"{f.name}\0{f.type}\0{int(f.nullable)}\n".encode("utf-8", "surrogatepass"))
    h.update(str(batch.num_rows).encode())
    for col in batch.columns:
        _hash(h, col)
    return h.hexdigest()


def batch_metadata(batch: pa.RecordBatch) -> dict:
    return {BATCH_KEY: batch_checksum(batch).encode()}


def _hash(h, arr: pa.Array) -> None:
    t = arr.type
    if arr.null_count:
        h.update(np.packbits(np.asarray(arr.is_null())).tobytes())
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offs = np.frombuffer(arr.buffers()[1], np.int64 if wide else np.int32)[arr.offset:arr.offset + len(arr) + 1]
        if len(offs):
            h.update((offs - offs[0]).astype(np.int64))
            data = arr.buffers()[2]
            if data is not None:
                h.update(memoryview(data)[int(offs[0]):int(offs[-1])])
    elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
          or pa.types.is_temporal(t)) and not arr.null_count:
        h.update(fixed_width_values(arr))
    else:  # nested or nullable typed columns: rare in shards; a canonical text form
        h.update(repr(arr.to_pylist()).encode("utf-8", "surrogatepass"))


def check_batch(path: str, g: int, schema_meta: dict | None, batch_meta, batch: pa.RecordBatch) -> None:
    """Raise ShardError unless record batch ``g`` of ``path`` matches its stored checksum."""
    if not schema_meta or schema_meta.get(SCHEMA_KEY) is None:
        raise ShardError(path, "Arrow shard carries no per-batch checksums (written by another tool or an "
                               "older shardfeed), so damaged bytes could not be told from data; rewrite it "
                               "with ShardWriter(format='arrow') / `shardfeed convert`, or read with verify off")
    stored = (batch_meta or {}).get(BATCH_KEY)
    if stored is None:
        raise ShardError(path, f"record batch {g} has no checksum in its metadata (damaged shard)")
    actual = batch_checksum(batch)
    if stored != actual.encode():
        raise ShardError(path, f"record batch {g} fails its checksum ({actual} != stored "
                               f"{stored[:32]!r}): bytes damaged on disk")
