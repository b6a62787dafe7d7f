"""Per-shard sample tables ("sidecars"): each sample's key, its members' byte
ranges and a checksum of its payload bytes.

A sidecar sits beside its shard (``shard-000000.tar`` ->
``shard-000000.tar.idx``), so opening one shard reads one small file and no
file grows with the dataset. It is an Arrow IPC file: flat int64 columns map
straight onto numpy without per-sample Python objects.
"""

from __future__ import annotations

import json
import os

import numpy as np
import xxhash

from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.base.records import SlotRecord
from shardfeed.formats.errors import ShardError
from shardfeed.formats.key_blob import Keys
from shardfeed.formats.tar import list_members, split_name

# writing, and reading a sidecar own_tables.py declines; a good sidecar is read without it
pa = lazy_module("pyarrow", globals(), "pa")

SIDECAR_SUFFIX = ".idx"
SIDECAR_VERSION = 1


def sample_checksum(parts) -> int:
    """xxh3-64 of a sample's payloads in member order (streamed, no copy)."""
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    return h.intdigest()


def table_digest(tbl: pa.Table, meta: dict) -> str:
    """xxh3-64 over a table's values and its metadata (the "digest" key aside).

    Sidecars and indexes are untrusted and carry no checksum of their own
    otherwise: a flipped byte in a key or a field name would be delivered as
    data. Values are hashed from their buffers (no per-row Python), each
    string column as normalised offsets plus the bytes they span.
    """
    h = xxhash.xxh3_64()
    h.update(json.dumps({k: v for k, v in meta.items() if k not in ("digest", "file_digest")},
                        sort_keys=True).encode())
    for col in tbl.columns:
        arr = col.combine_chunks()
        if pa.types.is_dictionary(arr.type):
            arr = decode_dictionary(arr)
        h.update(str(arr.type).encode())
        _hash_array(h, arr)
    return h.hexdigest()


def _hash_array(h, arr: pa.Array) -> None:
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_list(t) \
            or pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t):
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t)
        offs = np.frombuffer(arr.buffers()[1], np.int64 if wide else np.int32)[arr.offset:arr.offset + len(arr) + 1]
        h.update((offs - offs[0]).astype(np.int64).tobytes() if len(offs) else b"")
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            _hash_array(h, arr.values.slice(int(offs[0]), int(offs[-1] - offs[0])) if len(offs) else arr.values)
        elif len(offs):
            h.update(memoryview(arr.buffers()[2])[int(offs[0]):int(offs[-1])])
    else:
        h.update(fixed_width_values(arr))


def decode_dictionary(arr: pa.DictionaryArray) -> pa.Array:
    """``arr.dictionary_decode()`` without pyarrow.compute (0.1 s to import at start-up)
    for string and binary dictionaries without nulls; others take pyarrow's route."""
    vt = arr.type.value_type
    if arr.null_count or arr.dictionary.null_count or not (pa.types.is_string(vt) or pa.types.is_binary(vt)):
        return arr.dictionary_decode()
    d = arr.dictionary
    doffs = np.frombuffer(d.buffers()[1], np.int32)[d.offset:d.offset + len(d) + 1].astype(np.int64)
    ddata = np.frombuffer(d.buffers()[2], np.uint8) if d.buffers()[2] is not None else np.zeros(0, np.uint8)
    idx = as_numpy(arr.indices).astype(np.int64)
    if len(idx) and (idx.min() < 0 or idx.max() >= len(d)):
        raise ValueError(f"dictionary index {int(idx.max())} outside its {len(d)} values")
    lengths = doffs[idx + 1] - doffs[idx]
    offs = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(lengths, out=offs[1:])
    if offs[-1] >= 2**31:
        return arr.dictionary_decode()
    pos = np.arange(offs[-1], dtype=np.int64) - np.repeat(offs[:-1] - doffs[idx], lengths)
    return pa.Array.from_buffers(vt, len(idx), [None, pa.py_buffer(offs.astype(np.int32)),
                                                pa.py_buffer(ddata[pos].tobytes())])


def fixed_width_values(arr: pa.Array):
    """The bytes of ``arr.to_numpy()`` for a fixed-width column, read from its buffers.

    ``to_numpy`` makes pyarrow import pandas (0.4 s of a fresh process's start,
    paid on the first index or sidecar digest); the value buffer holds the
    same bytes. Booleans are bit-packed there, so they are unpacked to numpy's
    one byte per value; nulls and other layouts take the numpy route."""
    t = arr.type
    if arr.null_count == 0 and len(arr) and arr.buffers()[1] is not None:
        if pa.types.is_boolean(t):
            bits = np.frombuffer(arr.buffers()[1], np.uint8)
            return np.unpackbits(bits, bitorder="little")[arr.offset:arr.offset + len(arr)].view(np.bool_)
        width = getattr(t, "bit_width", 0)
        if width and width % 8 == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)
                                         or pa.types.is_temporal(t)):
            w = width // 8
            return memoryview(arr.buffers()[1])[arr.offset * w:(arr.offset + len(arr)) * w]
    return np.ascontiguousarray(arr.to_numpy(zero_copy_only=False)).tobytes()


def as_numpy(arr) -> np.ndarray:
    """``arr.to_numpy()`` (a read-only view) without importing pandas, for
    fixed-width numeric arrays without nulls; other arrays take pyarrow's route."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks != 1:
            return as_numpy(arr.combine_chunks()).copy()  # to_numpy copies chunks into a new array too
        arr = arr.chunk(0)
    t = arr.type
    width = getattr(t, "bit_width", 0)
    if arr.null_count == 0 and width and width % 8 == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        buf = arr.buffers()[1]
        dt = _NUMPY_OF.get(str(t))
        if dt is not None:
            if buf is None or not len(arr):
                out = np.zeros(0, dt)
            else:
                out = np.frombuffer(buf, dt, count=len(arr), offset=arr.offset * dt.itemsize)
            out.flags.writeable = False  # as to_numpy's view: the buffer is Arrow's
            return out
    return arr.to_numpy()


_NUMPY_OF = {t: np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}
_NUMPY_OF.update({"float": np.dtype("float32"), "double": np.dtype("float64")})


class SampleTable(SlotRecord):
    """Samples of one tar shard, as flat arrays.

    Sample ``i`` owns members ``member_start[i]:member_start[i+1]``; member ``j``
    is field ``fields[member_field[j]]`` at bytes ``offset[j]:offset[j]+size[j]``
    of the (decompressed) tar stream.
    """

    # a SlotRecord, not a dataclass: a dataclass compiles its methods at import (issue #24); unhashable, as a dataclass
    __slots__ = ("keys", "member_start", "offset", "size", "member_field", "fields", "checksum", "shard_bytes")
    __hash__ = None

    def __init__(self, keys: list[str] | Keys, member_start: np.ndarray, offset: np.ndarray, size: np.ndarray,
                 member_field: np.ndarray, fields: list[str], checksum: np.ndarray, shard_bytes: int = -1):
        self.keys = keys  # a Keys (one blob, decoded on demand) when read from a sidecar
        self.member_start = member_start  # int64, len = samples + 1
        self.offset = offset  # int64, len = members
        self.size = size  # int64
        self.member_field = member_field  # int16 (from a sidecar) or int32 (scanned)
        self.fields = fields
        self.checksum = checksum  # uint64, len = samples
        self.shard_bytes = shard_bytes

    def __len__(self) -> int:
        return len(self.keys)

    def validate(self, shard: str, stream_bytes: int) -> None:
        """Untrusted sidecar: every range must lie inside the shard."""
        n, m = len(self.keys), len(self.offset)
        if self.member_start.shape != (n + 1,) or self.checksum.shape != (n,):
            raise ShardError(shard, "sidecar arrays disagree in length (corrupt sidecar)")
        if self.member_start[0] != 0 or self.member_start[-1] != m or np.any(np.diff(self.member_start) < 0):
            raise ShardError(shard, "sidecar member table is not monotonic (corrupt sidecar)")
        # each bound checked before the sum it guards, so no int64 overflow
        if m and (self.offset.min() < 0 or self.size.min() < 0 or int(self.offset.max()) > stream_bytes
                  or int(self.size.max()) > stream_bytes
                  or int((self.offset + self.size).max()) > stream_bytes):
            raise ShardError(shard, f"sidecar names bytes beyond the shard's {stream_bytes} (stale or corrupt)")
        # Ranges that each pass could still overlap and add up to gigabytes for
        # one sample (a batch allocates their sum). In a real tar every member
        # has its own 512-byte header and its own bytes: bound the whole.
        if m and m * 512 > stream_bytes:
            raise ShardError(shard, f"sidecar lists {m} members, more than a {stream_bytes}-byte tar can hold "
                                    "(corrupt or forged sidecar)")
        total = float(self.size.sum(dtype=np.float64))
        if total > stream_bytes:
            raise ShardError(shard, f"sidecar members add up to {int(total):,} bytes, more than the shard's "
                                    f"{stream_bytes:,} (overlapping ranges: corrupt or forged sidecar)")
        if m and (self.member_field.min() < 0 or self.member_field.max() >= len(self.fields)):
            raise ShardError(shard, "sidecar field ids out of range (corrupt sidecar)")


def table_from_members(members, shard: str, buf) -> SampleTable:
    """Group (name, offset, size) members into samples, WebDataset's way:
    consecutive members with the same key form one sample."""
    keys: list[str] = []
    starts = [0]
    offs, sizes, fids = [], [], []
    field_ids: dict[str, int] = {}
    seen: set[str] = set()
    current = None
    mv = memoryview(buf)
    checks = []
    for name, off, size in members:
        kx = split_name(name)
        if kx is None:
            continue  # no extension: not a sample field (WebDataset skips these too)
        key, ext = kx
        if key != current:
            if current is not None:
                starts.append(len(offs))
                checks.append(sample_checksum(mv[o:o + s] for o, s in zip(offs[starts[-2]:], sizes[starts[-2]:])))
            keys.append(key)
            current = key
            seen = set()
        if ext in seen:
            raise ShardError(shard, f"sample {key!r} has two {ext!r} members")
        seen.add(ext)
        fid = field_ids.setdefault(ext, len(field_ids))
        offs.append(off)
        sizes.append(size)
        fids.append(fid)
    if current is not None:
        starts.append(len(offs))
        checks.append(sample_checksum(mv[o:o + s] for o, s in zip(offs[starts[-2]:], sizes[starts[-2]:])))
    return SampleTable(
        keys=keys,
        member_start=np.asarray(starts, np.int64),
        offset=np.asarray(offs, np.int64),
        size=np.asarray(sizes, np.int64),
        member_field=np.asarray(fids, np.int32),  # a foreign tar may name more than int16 holds
        fields=list(field_ids),
        checksum=np.asarray(checks, np.uint64),
        shard_bytes=len(buf),
    )


def scan_tar(buf, shard: str, bad: list | None = None) -> SampleTable:
    """Index a tar held in memory (an mmap or decompressed bytes) by scanning it once;
    ``bad``: members whose names are not UTF-8 are left out and listed there (tar.list_members)."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    return table_from_members(list_members(arr, shard, bad), shard, buf)


def write_sidecar(path: str, table: SampleTable, shard_bytes: int, shard_hash: str) -> None:
    """Atomically write ``path`` (temp file, then rename)."""
    ms = table.member_start
    n = len(table.keys)
    meta = {"version": SIDECAR_VERSION, "fields": table.fields, "shard_bytes": shard_bytes,
            "shard_hash": shard_hash, "members": int(len(table.offset))}
    # Two tables would need two files; pad the member columns to one length
    # instead by storing them as list arrays over the flat values.
    offsets = pa.array(ms.astype(np.int32) if ms[-1] < 2**31 else ms, )
    list_type = pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray
    tbl = pa.table({
        "key": pa.array(table.keys.tolist() if isinstance(table.keys, Keys) else table.keys, pa.string()),
        "checksum": pa.array(table.checksum, pa.uint64()),
        "offset": list_type.from_arrays(offsets, pa.array(table.offset, pa.int64())),
        "size": list_type.from_arrays(offsets, pa.array(table.size, pa.int64())),
        "field": list_type.from_arrays(offsets, pa.array(table.member_field, pa.int16())),
    })
    meta["digest"] = table_digest(tbl, meta)
    tbl = tbl.replace_schema_metadata({b"shardfeed.sidecar": json.dumps(meta).encode()})
    if tbl.num_rows != n:
        raise AssertionError("sidecar row count")
    tmp = f"{path}.tmp-{os.getpid()}"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, tbl.schema) as w:
        w.write_table(tbl)
    os.replace(tmp, path)
