"""Opening a dataset: a folder, a shard file, a pattern or a list, each sent to what indexes it.

A folder with shardfeed's index or commit log is opened by folder_index.py; a folder of foreign
tars, a shard file, a pattern or a list is indexed by index_scan.py. This module stands above
index.py (the index itself), own_tables.py (reading index.arrow), commit_log.py and index_scan.py,
so none of them imports up into another.
"""

from __future__ import annotations

import os

from shardfeed.formats.errors import ShardError
from shardfeed.formats.folder_index import is_dataset_folder, open_folder
from shardfeed.formats.index import INDEX_NAME, DatasetIndex, write_index
from shardfeed.formats.shard_patterns import ShardPath, expand_source, is_pattern

ON_ERROR = ("raise", "skip")


def open_index(source, follow_log: bool = True, on_error: str = "raise") -> DatasetIndex:
    """The index of a dataset: a folder (or ``file://`` URL), its commit log
    included; a shard file; a glob or brace pattern of shard files; or a list
    or tuple of paths and patterns (see shardfeed.formats.shard_patterns).

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
    # index_scan imported only where a read needs it, so a folder with an index imports none of it (issue #24)
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
    if is_dataset_folder(root):
        return open_folder(root, follow_log)
    shards = sorted(n for n in os.listdir(root) if n.endswith((".tar", ".tgz", ".tar.gz", ".tar.zst")))
    if not shards:
        raise ShardError(root, f"no {INDEX_NAME}, no commit log and no tar shards here: not a dataset yet. "
                               f"`shardfeed convert {root} OUT` reads a folder of images by class "
                               "(ImageFolder), JSONL, CSV or Parquet files into shards; then read OUT")
    from shardfeed.formats.index_scan import scan_foreign

    return scan_foreign(root, shards, on_error)


def compact(root: str) -> DatasetIndex:
    """Fold the commit log into index.arrow; log entries stay for live readers."""
    idx = open_index(root)
    write_index(root, (idx.shard(i) for i in range(len(idx))), idx.fields, int(idx.meta.get("log_seq", 0)))
    return idx


def _local_root(source: str) -> str:
    if source.startswith("file://"):
        return source[len("file://"):]
    if "://" in source:
        raise ShardError(source, "a URL is read through the node-local cache, not opened here: use "
                                 "ShardDataset(url, cache_dir=...) or shardfeed.cache.open_remote_index(url, "
                                 "cache_dir), or `shardfeed inspect/verify URL --cache-dir DIR`")
    return source
