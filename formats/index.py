"""The dataset index: one row per shard (name, format, samples, bytes, hash).

Stored as ``index.arrow``, an uncompressed Arrow IPC file that is memory-
mapped on open: 100,000 shards load in milliseconds (JSON of the same takes
~100x longer, see `shardfeed bench formats`). Per-sample offsets are not here:
they sit in each shard's sidecar.

A dataset that grows is an append-only commit log: ``_log/<seq>.json``, one
file per published shard, each created with a no-overwrite link so two
writers never take the same sequence number. ``compact`` folds the log into
``index.arrow`` (recording the last folded sequence number).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.errors import ShardError
from shardfeed.formats.index_seal import UNSEALED, check_seal, seal
from shardfeed.formats.sidecar import decode_dictionary, fixed_width_values, table_digest
from shardfeed.formats.sources import ShardPath, expand_source, is_pattern

if TYPE_CHECKING:
    from shardfeed.formats.shard_info import ShardInfo

# writing, and reading an index own_tables.py declines; a good index is read without it
pa = lazy_module("pyarrow", globals(), "pa")

INDEX_NAME = "index.arrow"
LOG_DIR = "_log"
INDEX_VERSION = 1
HASH_ALGO = "xxh3_128"
MAX_COUNT = 1 << 62  # samples or bytes of a whole dataset; more is a forged index (int64 sums overflow)
FORMATS = ("tar", "tar.gz", "tar.zst", "parquet", "arrow")


def __getattr__(name: str):
    # ShardInfo is defined on first use (shard_info.py says why); this module's own code imports it there too
    if name == "ShardInfo":
        from shardfeed.formats.shard_info import ShardInfo

        globals()["ShardInfo"] = ShardInfo
        return ShardInfo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_shard_name(name: str, where: str) -> str:
    """Shard names come from untrusted indexes: only plain relative paths."""
    if (not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name
            or any(p in ("", ".", "..") for p in name.split("/"))):
        raise ShardError(where, f"index names an unsafe shard path {name!r}")
    return name


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


def format_of(name: str) -> str:
    for suffix, fmt in ((".tar.zst", "tar.zst"), (".tar.gz", "tar.gz"), (".tgz", "tar.gz"), (".tar", "tar"),
                        (".parquet", "parquet"), (".arrow", "arrow")):
        if name.endswith(suffix):
            return fmt
    raise ValueError(f"{name!r}: unknown shard format (expected one of .tar .tar.gz .tgz .tar.zst .parquet .arrow)")


class DatasetIndex:
    """Columnar view of a dataset's shards; ``shard(i)`` gives one row."""

    def __init__(self, root: str, names: Sequence[str], formats: Sequence[str], counts, sizes,
                 hashes: Sequence[str], fields: Sequence[str] = (), meta: dict | None = None):
        self.root = root
        self.names = list(names)
        self.formats = list(formats)
        try:
            self.counts = np.asarray(counts, np.int64)
            self.sizes = np.asarray(sizes, np.int64)
        except (OverflowError, ValueError, TypeError) as e:
            raise ShardError(root, f"index sample counts or sizes are not int64 values ({e}) (broken index)") from e
        self.hashes = list(hashes)
        self.fields = tuple(fields)
        self.meta = dict(meta or {})
        self.tables: dict[int, object] = {}  # shard -> SampleTable for shards scanned on open
        # (path, reason) of each foreign shard left out on open under on_error="skip"
        self.skipped: list[tuple[str, str]] = []
        # ReadError of each sample left out of a shard kept on open under on_error="skip" (a member
        # name that is not UTF-8: the rest of its shard is read)
        self.left_out: list = []
        self._rows: dict[str, int] | None = None
        n = len(self.names)
        if not (len(self.formats) == len(self.counts) == len(self.sizes) == len(self.hashes) == n):
            raise ShardError(root, "index columns disagree in length (broken index)")
        if n and (self.counts.min() < 0 or self.sizes.min() < 0):
            raise ShardError(root, "index has negative sample counts or sizes (broken index)")
        # sums in float: int64 would wrap silently and turn sample ids negative
        if n and (float(self.counts.sum(dtype=np.float64)) >= MAX_COUNT
                  or float(self.sizes.sum(dtype=np.float64)) >= MAX_COUNT):
            raise ShardError(root, f"index counts add up to more than {MAX_COUNT:,} samples or bytes "
                                   "(int64 would overflow: broken or forged index)")
        self.offsets = np.zeros(n + 1, np.int64)
        np.cumsum(self.counts, out=self.offsets[1:])

    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_samples(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_bytes(self) -> int:
        return int(self.sizes.sum())

    def shard(self, i: int) -> ShardInfo:
        from shardfeed.formats.shard_info import ShardInfo

        return ShardInfo(self.names[i], self.formats[i], int(self.counts[i]), int(self.sizes[i]), self.hashes[i])

    def path(self, i: int) -> str:
        return join(self.root, self.names[i])

    def row_of(self, name: str) -> int | None:
        """The row of the shard called ``name`` (relative to the root), or None."""
        if self._rows is None:
            self._rows = {n: i for i, n in enumerate(self.names)}
        return self._rows.get(name)

    def locate(self, sample_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global sample ids -> (shard, index inside the shard)."""
        ids = np.asarray(sample_ids, np.int64)
        shard = np.searchsorted(self.offsets, ids, side="right") - 1
        return shard, ids - self.offsets[shard]

    def __repr__(self) -> str:
        return f"DatasetIndex({self.root!r}, shards={len(self)}, samples={self.num_samples})"


def join(root: str, name: str) -> str:
    if "://" in root:
        return root.rstrip("/") + "/" + name
    return os.path.join(root, *name.split("/"))


def _local_root(source: str) -> str:
    if source.startswith("file://"):
        return source[len("file://"):]
    if "://" in source:
        raise ShardError(source, "a URL is read through the node-local cache, not opened here: use "
                                 "ShardDataset(url, cache_dir=...) or shardfeed.cache.open_remote_index(url, "
                                 "cache_dir), or `shardfeed inspect/verify URL --cache-dir DIR`")
    return source


def write_index(root: str, shards: Iterable[ShardInfo], fields: Sequence[str] = (), log_seq: int = 0,
                extra: dict | None = None) -> str:
    """Atomically (temp, rename) write ``root/index.arrow``; returns its path.

    ``extra``: more JSON metadata kept in the index (e.g. convert's shuffle
    seed); it cannot replace the keys the index itself uses."""
    shards = list(shards)
    for s in shards:
        check_shard_name(s.name, root)
    tbl = pa.table({
        "name": pa.array([s.name for s in shards], pa.string()),
        "format": pa.array([s.format for s in shards], pa.string()).dictionary_encode(),
        "samples": pa.array([s.samples for s in shards], pa.int64()),
        "bytes": pa.array([s.bytes for s in shards], pa.int64()),
        "hash": pa.array([s.hash for s in shards], pa.string()),
    })
    meta = {"version": INDEX_VERSION, "hash": HASH_ALGO, "fields": list(fields), "log_seq": log_seq}
    for k, v in (extra or {}).items():
        if k in meta or k in ("digest", "file_digest"):
            raise ValueError(f"write_index extra key {k!r} is one the index uses itself; pick another name")
        meta[k] = v
    meta["digest"] = table_digest(tbl, meta)
    meta["file_digest"] = UNSEALED
    tbl = tbl.replace_schema_metadata({b"shardfeed.index": json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, tbl.schema) as w:
        w.write_table(tbl)
    raw = sink.getvalue().to_pybytes()
    path = os.path.join(root, INDEX_NAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(seal(raw))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _int64s(col) -> np.ndarray:
    # a copy read from the buffers (ChunkedArray.to_numpy would import pandas at start-up)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return np.frombuffer(bytes(memoryview(fixed_width_values(arr)).cast("B")), np.int64).copy()


def _read_index_file(path: str, root: str) -> tuple[dict, list]:
    from shardfeed.formats.files import open_regular

    try:
        with open_regular(path, what="index") as f:  # one read: the bytes parsed are the bytes checksummed
            raw = f.read()
    except FileNotFoundError as e:
        raise ShardError(path, "index vanished while opening it") from e
    return parse_index_bytes(raw, path)


def parse_index_bytes(raw: bytes, path: str) -> tuple[dict, list]:
    """(metadata, [names, formats, counts, sizes, hashes]) of index bytes, every check of a local index made.

    Read without pyarrow (own_tables.py) when laid out as shardfeed writes it and every check passes;
    otherwise pyarrow reads it, and its checks say what is wrong."""
    from shardfeed.formats import own_tables

    try:
        return own_tables.index(raw, path)
    except own_tables.Declined:
        pass
    from shardfeed.formats.sidecar import read_arrow_bytes

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


def read_log(root: str, after: int = 0) -> list[tuple[int, ShardInfo]]:
    """Published shards with seq > ``after``, in commit order, no end marker (formats/commit_log.py owns the log)."""
    from shardfeed.formats import commit_log  # it builds on this module

    return commit_log.read_log(root, after)


def publish(root: str, info: ShardInfo, fields=()) -> int:
    """Commit a written shard (and the fields written so far) to a live dataset: its seq (see commit_log.publish)."""
    from shardfeed.formats import commit_log

    return commit_log.publish(root, info, fields)


def check_unique_names(names, where: str) -> None:
    """A growing dataset commits a name at most once: a second row of one name
    (index.arrow and the log, or the log twice) would deliver its samples twice."""
    if len(set(names)) != len(names):
        seen: set = set()
        twice = next(n for n in names if n in seen or seen.add(n))
        raise ShardError(where, f"shard {twice} is committed twice (in {INDEX_NAME} and the log, or twice in "
                                "the log): the log is damaged; its samples would be delivered twice")


ON_ERROR = ("raise", "skip")


def open_index(source, follow_log: bool = True, on_error: str = "raise") -> DatasetIndex:
    """The index of a dataset: a folder (or ``file://`` URL), its commit log
    included; a shard file; a glob or brace pattern of shard files; or a list
    or tuple of paths and patterns (see shardfeed.formats.sources).

    A folder with no index but WebDataset tars is indexed by scanning each tar
    once, in memory; so is a foreign tar named by a pattern or a list.
    on_error: ``"raise"`` (default) raises ShardError at the first foreign tar
    that cannot be scanned; ``"skip"`` leaves it out and records
    ``(path, reason)`` in ``DatasetIndex.skipped``, and leaves out a sample
    whose member name is not UTF-8 (a ReadError in ``DatasetIndex.left_out``),
    reading the rest of its tar. A source that names
    nothing (an empty pattern, a missing file) raises under either policy:
    that is a mistake in the source, not damaged data.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error={on_error!r} is not one of {ON_ERROR}; use 'raise' to stop at the first "
                         "unreadable shard or 'skip' to leave it out and record it")
    # index_scan builds on this module, and commit_log too: both imported only where a read needs them, so a
    # folder with an index and no log imports neither (nor defines ShardInfo; issue #24)
    if isinstance(source, (list, tuple)):
        from shardfeed.formats.index_scan import index_of_shards

        return index_of_shards(expand_source(source), follow_log, on_error)
    root = _local_root(os.fspath(source))
    if os.path.isfile(root) or (not os.path.exists(root) and is_pattern(root)):
        from shardfeed.formats.index_scan import index_of_shards

        return index_of_shards([ShardPath(root, True, root)] if os.path.isfile(root) else expand_source(root),
                               follow_log, on_error)
    if not os.path.isdir(root):
        raise ShardError(root, "dataset not found (no such folder or file)")
    path = os.path.join(root, INDEX_NAME)
    log_seq = 0
    if os.path.lexists(path):  # a dangling link or loop is a broken index, not "no index"
        meta, (names, formats, counts, sizes, hashes) = _read_index_file(path, root)
        log_seq = int(meta.get("log_seq", 0))
        fields = meta.get("fields", [])
    else:
        meta, names, formats, counts, sizes, hashes, fields = {}, [], [], [], [], [], []
        if not os.path.isdir(os.path.join(root, LOG_DIR)):
            shards = sorted(n for n in os.listdir(root) if n.endswith((".tar", ".tgz", ".tar.gz", ".tar.zst")))
            if not shards:
                raise ShardError(root, f"no {INDEX_NAME}, no commit log and no tar shards here: not a dataset yet. "
                                       f"`shardfeed convert {root} OUT` reads a folder of images by class "
                                       "(ImageFolder), JSONL, CSV or Parquet files into shards; then read OUT")
            from shardfeed.formats.index_scan import scan_foreign

            return scan_foreign(root, shards, on_error)
    entries = []
    if follow_log:  # the log's fields are the index's too
        view = None
        if os.path.lexists(os.path.join(root, LOG_DIR)):  # nothing there: no entries (read_commits finds none)
            from shardfeed.formats.commit_log import read_commits

            view = read_commits(root, after=log_seq)
        entries, fields = (view.shards, list(dict.fromkeys([*fields, *view.fields]))) if view else \
            ([], list(dict.fromkeys(fields)))
    if os.path.isdir(os.path.join(root, LOG_DIR)):
        check_unique_names(list(names) + [e.name for _, e in entries], root)
    if entries:
        names = list(names) + [e.name for _, e in entries]
        formats = list(formats) + [e.format for _, e in entries]
        counts = np.concatenate([np.asarray(counts, np.int64), [e.samples for _, e in entries]])
        sizes = np.concatenate([np.asarray(sizes, np.int64), [e.bytes for _, e in entries]])
        hashes = list(hashes) + [e.hash for _, e in entries]
        meta = dict(meta, log_seq=entries[-1][0])
    return DatasetIndex(root, names, formats, counts, sizes, hashes, fields, meta)


def compact(root: str) -> DatasetIndex:
    """Fold the commit log into index.arrow; log entries stay for live readers."""
    idx = open_index(root)
    write_index(root, (idx.shard(i) for i in range(len(idx))), idx.fields, int(idx.meta.get("log_seq", 0)))
    return idx
