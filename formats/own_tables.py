"""index.arrow and .idx sidecars read through arrow_ipc.py (no pyarrow): every check of the pyarrow
path (index.parse_index_bytes, sidecar.read_sidecar) made the same way, the digest computed over the
same bytes. Any failure is ``Declined``, never an error of its own: the caller then reads the file
with pyarrow, whose checks raise the ShardError the user sees (so messages stay those of one path).
"""

from __future__ import annotations

import json

import numpy as np
import xxhash

from shardfeed.formats.arrow_ipc import Declined, read, type_name
from shardfeed.formats.key_blob import Keys

MAX_FAST_BYTES = 256 << 20  # a larger file is memory-mapped by pyarrow instead of read into memory

_UTF8, _I64 = ("utf8",), ("int64",)
INDEX_FIELDS = [("name", True, _UTF8), ("format", True, ("dict", 0, _UTF8)), ("samples", True, _I64),
                ("bytes", True, _I64), ("hash", True, _UTF8)]
SIDECAR_FIELDS = [[("key", True, _UTF8), ("checksum", True, ("uint64",)), ("offset", True, (kind, _I64)),
                   ("size", True, (kind, _I64)), ("field", True, (kind, ("int16",)))]
                  for kind in ("list", "large_list")]


def digest(fields: list, columns: dict, meta: dict) -> str:
    """sidecar.table_digest of the same file: xxh3-64 of the metadata (sorted JSON, digests aside), then
    per column pyarrow's type name and its values (offsets from 0 as int64, plus the bytes they span)."""
    h = xxhash.xxh3_64()
    h.update(json.dumps({k: v for k, v in meta.items() if k not in ("digest", "file_digest")},
                        sort_keys=True).encode())
    for name, _, t in fields:
        col = columns[name]
        h.update(type_name(t).encode())
        if t[0] == "dict":  # hashed decoded, as table_digest does
            parts = [s.encode() for s in col]
            offs = np.zeros(len(parts) + 1, np.int64)
            np.cumsum([len(p) for p in parts], out=offs[1:])
            h.update(offs.tobytes())
            h.update(b"".join(parts))
        elif isinstance(col, tuple):  # strings and lists: offsets, then the data or values they span
            offs, values = col  # hashed through the buffer protocol: the same bytes as tobytes(), no copy
            h.update(offs - offs[0])
            h.update(values[int(offs[0]):int(offs[-1])])
        else:
            h.update(col)
    return h.hexdigest()


def _meta(raw_meta: dict, key: bytes) -> dict:
    try:
        meta = json.loads(raw_meta[key])
    except (KeyError, ValueError) as e:
        raise Declined(f"metadata {key!r} missing or not JSON") from e
    if not isinstance(meta, dict):
        raise Declined("metadata is not an object")
    return meta


def _strings(col) -> list[str]:
    offs, data = col
    blob = bytes(data)
    bounds = offs.tolist()
    return [blob[a:b].decode() for a, b in zip(bounds[:-1], bounds[1:])]


def sidecar(raw: bytes):
    """(SampleTable, metadata) of sidecar bytes, as sidecar.read_sidecar gives them."""
    from shardfeed.formats.sidecar import SIDECAR_VERSION, SampleTable

    fields, raw_meta, cols = read(raw)
    if fields not in SIDECAR_FIELDS:
        raise Declined("not a sidecar's schema")
    meta = _meta(raw_meta, b"shardfeed.sidecar")
    if meta.get("version") != SIDECAR_VERSION or meta.get("digest") != digest(fields, cols, meta):
        raise Declined("another version, or the digest fails")
    names, shard_bytes = meta.get("fields"), meta.get("shard_bytes")
    if not isinstance(names, list) or not all(isinstance(f, str) for f in names) \
            or not isinstance(shard_bytes, int) or shard_bytes < 0:
        raise Declined("bad fields or shard_bytes")
    (starts, offset), (size_starts, size), (field_starts, field) = cols["offset"], cols["size"], cols["field"]
    if not (np.array_equal(starts, size_starts) and np.array_equal(starts, field_starts)):
        raise Declined("offset/size/field lists disagree")
    base, end = int(starts[0]), int(starts[-1])
    key_offs, key_data = cols["key"]
    lo, hi = int(key_offs[0]), int(key_offs[-1])
    # the key blob copied (the gather reads it by address); the rest read-only views of ``raw``, as pyarrow's
    table = SampleTable(keys=Keys(key_data[lo:hi].copy(), key_offs - lo), member_start=starts - base,
                        offset=offset[base:end], size=size[base:end], member_field=field[base:end],
                        fields=list(names), checksum=cols["checksum"], shard_bytes=shard_bytes)
    return table, meta


def index(raw: bytes, path: str) -> tuple[dict, list]:
    """(metadata, [names, formats, counts, sizes, hashes]) of index bytes, as index.parse_index_bytes."""
    from shardfeed.formats.errors import ShardError
    from shardfeed.formats.index import _UNSAFE_NAME, FORMATS, INDEX_VERSION
    from shardfeed.formats.index_seal import check_seal

    fields, raw_meta, cols = read(raw)
    if fields != INDEX_FIELDS:
        raise Declined("not an index's schema")
    meta = _meta(raw_meta, b"shardfeed.index")
    if meta.get("version") != INDEX_VERSION or not isinstance(meta.get("log_seq", 0), int) \
            or not isinstance(meta.get("fields", []), list) or meta.get("digest") != digest(fields, cols, meta):
        raise Declined("another version, bad metadata, or the digest fails")
    try:
        check_seal(raw, meta, path)
    except ShardError as e:
        raise Declined(str(e)) from e
    names, formats, hashes = _strings(cols["name"]), cols["format"], _strings(cols["hash"])
    if any(_UNSAFE_NAME.search(n) for n in names) or not set(formats) <= set(FORMATS):
        raise Declined("an unsafe shard name or an unknown format")
    # copies, not views: the index outlives the bytes it was read from
    return meta, [names, formats, cols["samples"].copy(), cols["bytes"].copy(), hashes]
