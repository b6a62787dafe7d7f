"""Indexes built rather than read from index.arrow: a folder of foreign
(WebDataset) tars scanned once each, in memory, and the index of a list or
pattern of shards, taken from the indexes of the folders they sit in.
"""

from __future__ import annotations

import os

from shardfeed.formats.errors import ShardError
from shardfeed.formats.folder_index import open_folder
from shardfeed.formats.index import INDEX_NAME, LOG_DIR, DatasetIndex, ShardInfo, format_of, join
from shardfeed.formats.shard_patterns import ShardPath


def scan_foreign(root: str, names: list[str], on_error: str = "raise") -> DatasetIndex:
    return _assemble([(root, name, None) for name in names], on_error, selected=False)


def _scan_one(path: str, name: str, skip: bool = False):
    """(ShardInfo, SampleTable, [ReadError]) of a foreign tar; any failure is a ShardError naming it.
    With ``skip``, samples whose member names are not UTF-8 are left out (one ReadError each) and
    the rest read, unless none is left."""
    from shardfeed.formats.errors import ReadError
    from shardfeed.formats.readers import hash_file
    from shardfeed.formats.sidecar import scan_tar
    from shardfeed.formats.tar_stream import load_tar_stream

    try:
        fmt = format_of(name)
    except ValueError as e:
        raise ShardError(path, f"is not a shard: {e}") from None
    if fmt not in ("tar", "tar.gz", "tar.zst"):
        raise ShardError(path, f"is a {fmt} file outside a shardfeed dataset (no index.arrow beside it); only "
                               "tar shards are read without an index: write it with ShardWriter or convert it")
    try:
        data = load_tar_stream(path, fmt)
        bad: list | None = [] if skip else None
        table = scan_tar(data, path, bad)
        # On success nothing refers to the mapping any more; after a failure the
        # traceback's frames may (close() would raise BufferError): GC unmaps it.
        if hasattr(data, "close"):
            data.close()
        left_out, last = [], None
        for key, reason in bad or ():  # consecutive members of one key are one sample, as they would have been
            if not left_out or key != last:
                left_out.append(ReadError(path, reason, 1))
            last = key
        if left_out and not len(table):
            raise ShardError(path, left_out[0].reason)
        return ShardInfo(name, fmt, len(table), os.path.getsize(path), hash_file(path)), table, left_out
    except OSError as e:  # unreadable (permissions, I/O error) is bad data too, named like the rest
        raise ShardError(path, f"cannot be read: {e.strerror or e}") from e


# -- indexes of shard lists and patterns ----------------------------------
# A shard named by a list or pattern is taken from the index of the folder it
# sits in when that folder is a shardfeed dataset (index.arrow or a commit
# log): its row (count, size, hash) and its sidecar are used, nothing is
# scanned, and the result is those rows in the order named. A shard in a
# folder without an index is a foreign tar and is scanned as a folder of them
# is. A file in an indexed folder that its index does not list is not
# published yet: a glob passes over it (a writer may be about to commit it),
# a name given outright is an error. Shards from several folders share one
# index whose root is their common folder, names relative to it.


def index_of_shards(paths: list[ShardPath], follow_log: bool, on_error: str) -> DatasetIndex:
    folders: dict[str, DatasetIndex | None] = {}
    picked = []  # (folder, name, the folder's index or None for a foreign tar)
    for sp in paths:
        folder = os.path.dirname(sp.path) or "."
        if folder not in folders:
            folders[folder] = _folder_index(folder, follow_log)
        base = folders[folder]
        name = os.path.basename(sp.path)
        if base is None:
            picked.append((folder, name, None))
            continue
        row = base.row_of(name)
        if row is None:
            if sp.explicit:
                raise ShardError(sp.path, f"is not listed in {os.path.join(folder, INDEX_NAME)} or its commit "
                                          "log (not a published shard of that dataset)")
            continue
        picked.append((folder, name, base))
    if not picked:
        raise ShardError(paths[0].named_by, "matches no published shard (the files it matches are not in "
                                            "their dataset's index yet)")
    return _assemble(picked, on_error, selected=True)


def _folder_index(folder: str, follow_log: bool) -> DatasetIndex | None:
    if not (os.path.exists(os.path.join(folder, INDEX_NAME)) or os.path.isdir(os.path.join(folder, LOG_DIR))):
        return None
    return open_folder(folder, follow_log)


def _assemble(picked: list, on_error: str, selected: bool) -> DatasetIndex:
    """One index over (folder, name, folder's index or None to scan) rows;
    ``selected`` marks a choice of shards rather than a whole folder."""
    dirs = list(dict.fromkeys(folder for folder, _, _ in picked))
    if len(dirs) == 1:
        root, prefix = dirs[0], {dirs[0]: ""}
    else:
        root = os.path.commonpath([os.path.abspath(d) for d in dirs])
        prefix = {d: _rel_prefix(os.path.relpath(os.path.abspath(d), root)) for d in dirs}
    rows, tables, fields, skipped, left_out, scanned = [], {}, {}, [], [], False
    for folder, name, base in picked:
        if base is not None:
            info = base.shard(base.row_of(name))
            table, shard_fields = None, base.fields
        else:
            scanned = True
            try:
                info, table, lost = _scan_one(join(folder, name), name, on_error == "skip")
            except ShardError as e:
                if on_error != "skip":
                    raise
                skipped.append((e.shard, e.reason))
                continue
            left_out += lost
            shard_fields = table.fields
        if table is not None:
            tables[len(rows)] = table
        rows.append(ShardInfo(prefix[folder] + info.name, info.format, info.samples, info.bytes, info.hash))
        for f in shard_fields:  # a dict keeps first-seen order in linear time
            fields.setdefault(f, None)
    meta = {**({"selected": True} if selected else {}), **({"scanned": True} if scanned else {})}
    idx = DatasetIndex(root, [r.name for r in rows], [r.format for r in rows], [r.samples for r in rows],
                       [r.bytes for r in rows], [r.hash for r in rows], fields, meta)
    idx.tables = tables
    idx.skipped = skipped
    idx.left_out = left_out
    return idx


def _rel_prefix(rel: str) -> str:
    return "" if rel in ("", ".") else rel.replace(os.sep, "/") + "/"
