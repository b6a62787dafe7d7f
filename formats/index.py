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
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.errors import ShardError
from shardfeed.formats.index_seal import UNSEALED, seal
from shardfeed.formats.sidecar import table_digest

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

    def url_of(self, i: int) -> str:
        """Where shard ``i`` lives, as a message names it: its path here; a remote index, its URL."""
        return self.path(i)

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


def check_unique_names(names, where: str) -> None:
    """A growing dataset commits a name at most once: a second row of one name
    (index.arrow and the log, or the log twice) would deliver its samples twice."""
    if len(set(names)) != len(names):
        seen: set = set()
        twice = next(n for n in names if n in seen or seen.add(n))
        raise ShardError(where, f"shard {twice} is committed twice (in {INDEX_NAME} and the log, or twice in "
                                "the log): the log is damaged; its samples would be delivered twice")
