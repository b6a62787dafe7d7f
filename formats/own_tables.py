"""Reading the project's own Arrow tables, index.arrow and .idx sidecars: the one owner of their reads.

Each is read without pyarrow (arrow_ipc.py) when laid out as shardfeed writes it: every check of the
pyarrow path made the same way, the digest computed over the same bytes. Any failure there is
``Declined``, never an error of its own: the file is then read with pyarrow, whose checks raise the
ShardError the user sees (so messages stay those of one path). index.py and sidecar.py define the
tables and write them; this module, above both, reads them; the dataset's opening
(open_dataset.py) and the readers call it. Imported when an index or sidecar is read, not with
``import shardfeed.loader`` (arrow_ipc and flatbuffer cost ~0.5 ms of an import).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import xxhash

from shardfeed.formats.arrow_ipc import Declined, read, type_name
from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.errors import ShardError
from shardfeed.formats.files import check_regular, open_regular
from shardfeed.formats.index import FORMATS, INDEX_NAME, INDEX_VERSION
from shardfeed.formats.index_seal import check_seal
from shardfeed.formats.key_blob import Keys
from shardfeed.formats.sidecar import (
    SIDECAR_VERSION,
    SampleTable,
    as_numpy,
    decode_dictionary,
    fixed_width_values,
    table_digest,
)

# a file the fast path declines; a good index or sidecar is read without it
pa = lazy_module("pyarrow", globals(), "pa")

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
    """(SampleTable, metadata) of sidecar bytes, as read_sidecar gives them."""
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
    """(metadata, [names, formats, counts, sizes, hashes]) of index bytes, as parse_index_bytes."""
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


# --- the pyarrow path, and the reads that try the fast path first

# An empty, "." or ".." path part (which covers absolute and trailing-slash
# names), a backslash or a NUL: the same rule as check_shard_name, run over a
# whole column in Arrow (100,000 names in ms instead of ~1 s of Python).
_UNSAFE_NAME_RE = r"(^|/)\.{0,2}(/|$)|[\\\x00]"
# the same in Python's re (\Z: Python's $ also matches before a final newline; RE2's does not)
_UNSAFE_NAME = re.compile(r"(^|/)\.{0,2}(/|\Z)|[\\\x00]")
_FEW_NAMES = 4096  # below this a Python loop beats importing pyarrow.compute (~0.1 s of start-up)


def check_shard_names(names: pa.Array, where: str) -> None:
    if len(names) <= _FEW_NAMES:
        for name in names.to_pylist():
            if _UNSAFE_NAME.search(name):
                raise ShardError(where, f"index names an unsafe shard path {name!r}")
        return
    import pyarrow.compute as pc

    bad = pc.match_substring_regex(names, _UNSAFE_NAME_RE)
    if pc.any(bad).as_py():
        first = names.filter(bad)[0].as_py()
        raise ShardError(where, f"index names an unsafe shard path {first!r}")


def _int64s(col) -> np.ndarray:
    # a copy read from the buffers (ChunkedArray.to_numpy would import pandas at start-up)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return np.frombuffer(bytes(memoryview(fixed_width_values(arr)).cast("B")), np.int64).copy()


def read_index_file(path: str, root: str) -> tuple[dict, list]:
    try:
        with open_regular(path, what="index") as f:  # one read: the bytes parsed are the bytes checksummed
            raw = f.read()
    except FileNotFoundError as e:
        raise ShardError(path, "index vanished while opening it") from e
    return parse_index_bytes(raw, path)


def parse_index_bytes(raw: bytes, path: str) -> tuple[dict, list]:
    """(metadata, [names, formats, counts, sizes, hashes]) of index bytes, every check of a local index made.

    Read without pyarrow (arrow_ipc.py) when laid out as shardfeed writes it and every check passes;
    otherwise pyarrow reads it, and its checks say what is wrong."""
    try:
        return index(raw, path)
    except Declined:
        pass
    tbl = read_arrow_bytes(raw, path, "index", INDEX_NAME)
    try:
        meta = json.loads((tbl.schema.metadata or {})[b"shardfeed.index"])
        if not isinstance(meta, dict):
            raise ValueError("metadata is not an object")
    except (KeyError, TypeError, ValueError) as e:
        raise ShardError(path, f"index metadata is unreadable ({e}); rebuild it with `shardfeed convert`") from e
    if meta.get("version") != INDEX_VERSION:
        raise ShardError(path, f"index version {meta.get('version')!r} is not {INDEX_VERSION}")
    if not isinstance(meta.get("log_seq", 0), int) or not isinstance(meta.get("fields", []), list):
        raise ShardError(path, "index metadata has a bad log_seq or fields entry (broken index)")
    try:
        ok = meta.get("digest") == table_digest(tbl, meta)
    except (pa.ArrowException, TypeError, ValueError, IndexError, KeyError, AttributeError, OverflowError) as e:
        # a flipped type in the schema gives a column whose buffers are not what its hash expects
        raise ShardError(path, f"index columns are unreadable ({e}) (broken index)") from e
    if not ok:
        raise ShardError(path, "index fails its digest (corrupt index); restore it or rebuild it "
                               "with `shardfeed convert`")
    check_seal(raw, meta, path)
    try:
        fmt = tbl.column("format").combine_chunks()
        if pa.types.is_dictionary(fmt.type):
            fmt = decode_dictionary(fmt)
        cols = [tbl.column("name"), fmt, tbl.column("samples"), tbl.column("bytes"), tbl.column("hash")]
    except (KeyError, pa.ArrowException) as e:
        raise ShardError(path, f"index lacks a column ({e}) (broken index)") from e
    want = [pa.string(), pa.string(), pa.int64(), pa.int64(), pa.string()]
    for c, t, label in zip(cols, want, ("name", "format", "samples", "bytes", "hash")):
        if c.type != t or c.null_count:
            raise ShardError(path, f"index column {label!r} is {c.type} with {c.null_count} nulls; "
                                   f"expected {t} without nulls (broken index)")
    # copies, not views: the index must not depend on the mapped file staying as it was
    cols = [cols[0].to_pylist(), cols[1].to_pylist(), _int64s(cols[2]), _int64s(cols[3]), cols[4].to_pylist()]
    check_shard_names(tbl.column("name").combine_chunks(), path)
    bad = set(cols[1]) - set(FORMATS)
    if bad:
        raise ShardError(path, f"index names unknown shard formats {sorted(bad)!r} (expected {FORMATS})")
    return meta, cols


def _expected_schema(list_type) -> pa.Schema:
    return pa.schema([("key", pa.string()), ("checksum", pa.uint64()), ("offset", list_type(pa.int64())),
                      ("size", list_type(pa.int64())), ("field", list_type(pa.int16()))])


def _sidecar_schemas() -> tuple:
    return _expected_schema(pa.list_), _expected_schema(pa.large_list)


def read_arrow_file(path: str, shard: str, what: str) -> pa.Table:
    """An untrusted Arrow IPC file, fully validated before any value is touched.

    Arrow trusts its buffers' offsets; a flipped byte in a string offset would
    otherwise read outside the mapping. ``validate(full=True)`` checks every
    offset and length first (O(bytes), once per open).
    """
    check_regular(path, shard, what)  # a FIFO would block pyarrow's open forever
    try:
        with pa.memory_map(path, "r") as src:
            tbl = pa.ipc.open_file(src).read_all()
        tbl.validate(full=True)
        return tbl
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ShardError(shard, f"{what} {os.path.basename(path)} is unreadable: {e}") from e


def read_arrow_bytes(raw: bytes, shard: str, what: str, name: str) -> pa.Table:
    """``read_arrow_file`` for a file already read into memory (so a caller can
    also checksum exactly the bytes that were parsed)."""
    try:
        tbl = pa.ipc.open_file(pa.py_buffer(raw)).read_all()
        tbl.validate(full=True)
        return tbl
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError, OverflowError) as e:
        raise ShardError(shard, f"{what} {name} is unreadable: {type(e).__name__}: {e}") from e


def read_sidecar(path: str, shard: str) -> tuple[SampleTable, dict]:
    """Load a sidecar; raises ShardError naming the shard when it is unreadable
    (FileNotFoundError passes through: the caller says whether the shard is a
    foreign tar to scan or a shard of an indexed dataset that needs it).

    Read without pyarrow (arrow_ipc.py) when it is laid out as shardfeed writes it and
    passes every check; otherwise pyarrow reads it, and its checks say what is wrong."""
    with open_regular(path, shard, "sidecar") as f:  # a FIFO would block the read forever
        raw = f.read() if os.fstat(f.fileno()).st_size <= MAX_FAST_BYTES else None
    if raw is not None:
        try:
            return sidecar(raw)
        except Declined:
            pass
    return _read_sidecar_pyarrow(path, shard)


def _read_sidecar_pyarrow(path: str, shard: str) -> tuple[SampleTable, dict]:
    tbl = read_arrow_file(path, shard, "sidecar")
    name = os.path.basename(path)
    if not any(tbl.schema.equals(s) for s in _sidecar_schemas()):
        raise ShardError(shard, f"sidecar {name} has an unexpected schema (corrupt sidecar): {tbl.schema}")
    try:
        meta = json.loads((tbl.schema.metadata or {})[b"shardfeed.sidecar"])
        if not isinstance(meta, dict):
            raise ValueError("metadata is not an object")
        if meta.get("version") != SIDECAR_VERSION:
            raise ShardError(shard, f"sidecar version {meta.get('version')!r} is not {SIDECAR_VERSION}")
        if meta.get("digest") != table_digest(tbl, meta):
            raise ShardError(shard, f"sidecar {name} fails its digest (corrupt sidecar); rewrite it with "
                                    "`shardfeed convert` or restore it from a good copy")
        fields = meta["fields"]
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise ValueError(f"fields {fields!r} is not a list of names")
        shard_bytes = meta["shard_bytes"]
        if not isinstance(shard_bytes, int) or shard_bytes < 0:
            raise ValueError(f"shard_bytes {shard_bytes!r} is not a byte count")
        off = tbl.column("offset").combine_chunks()
        size = tbl.column("size").combine_chunks()
        field = tbl.column("field").combine_chunks()
        starts = as_numpy(off.offsets).astype(np.int64)
        if not (np.array_equal(starts, as_numpy(size.offsets)) and np.array_equal(starts, as_numpy(field.offsets))):
            raise ValueError("offset/size/field lists disagree")
        if off.null_count or size.null_count or field.null_count or tbl.column("key").null_count \
                or tbl.column("checksum").null_count:
            raise ValueError("null entries")
        # Sliced list arrays carry a base offset; the flat values start there.
        base = int(starts[0]) if len(starts) else 0
        m = int(starts[-1]) - base if len(starts) else 0
        table = SampleTable(
            keys=Keys.from_arrow(tbl.column("key").combine_chunks()),  # UTF-8 checked by validate(full=True)
            member_start=starts - base,
            offset=as_numpy(off.values)[base:base + m].astype(np.int64, copy=False),
            size=as_numpy(size.values)[base:base + m].astype(np.int64, copy=False),
            member_field=as_numpy(field.values)[base:base + m].astype(np.int16, copy=False),
            fields=list(fields),
            checksum=as_numpy(tbl.column("checksum")).astype(np.uint64, copy=False),
            shard_bytes=shard_bytes,
        )
    except ShardError:
        raise
    except (KeyError, ValueError, TypeError, AttributeError, pa.ArrowException) as e:
        raise ShardError(shard, f"sidecar {name} is malformed: {e}") from e
    return table, meta
