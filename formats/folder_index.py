"""A dataset folder's index: its index.arrow, and the shards its commit log published since.

The dataset's opening (open_dataset.py) and the scan of shards named one by one (index_scan.py) both
open a folder here. The commit log is imported only when the folder has one, and the table readers
only when it has an index (issue #24).
"""

from __future__ import annotations

import os

from shardfeed.formats.index import INDEX_NAME, LOG_DIR, DatasetIndex, check_unique_names


def is_dataset_folder(folder: str) -> bool:
    """Whether ``folder`` holds shardfeed's own index or commit log (else its tars are foreign)."""
    return os.path.lexists(os.path.join(folder, INDEX_NAME)) or os.path.isdir(os.path.join(folder, LOG_DIR))


def open_folder(root: str, follow_log: bool = True) -> DatasetIndex:
    """The index of a folder that ``is_dataset_folder``: index.arrow's rows, then (``follow_log``) those
    of the shards its commit log published after them."""
    path = os.path.join(root, INDEX_NAME)
    log_seq = 0
    if os.path.lexists(path):  # a dangling link or loop is a broken index, not "no index"
        from shardfeed.formats import own_tables  # the table readers: imported when an index is read

        meta, (names, formats, counts, sizes, hashes) = own_tables.read_index_file(path, root)
        log_seq = int(meta.get("log_seq", 0))
        fields = meta.get("fields", [])
    else:  # no index yet, only the log
        meta, names, formats, counts, sizes, hashes, fields = {}, [], [], [], [], [], []
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
        from shardfeed.formats.commit_log import with_entries

        names, formats, counts, sizes, hashes = with_entries(names, formats, counts, sizes, hashes, entries)
        meta = dict(meta, log_seq=entries[-1][0])
    return DatasetIndex(root, names, formats, counts, sizes, hashes, fields, meta)
