"""The decode threads: a batch's missing Parquet row groups decoded on two threads before its rows are placed.

Why: under ``global`` order a batch takes a row or two from nearly every row
group, so the first batch of a pass decodes nearly every group of the dataset
before it is delivered (2 KiB samples, 32 groups of 2 MB: ~110 ms of a 0-worker
pass whose other 127 batches take ~150 ms, most of it pyarrow's page CRCs).
pyarrow releases the GIL while it reads, checks and decodes a group, so two
shards' groups decode at once on two cores.

Only where the reader was allowed threads (the process that reads at
``num_workers=0``; a worker already has a core of its own, and its siblings
share decoded groups through row_group_share.py). The groups of one shard stay on
one thread: its reader (one ``ParquetFile``, its last-group memo) is never used
from two threads at once. The helper only fills the decoded-group store: a
group it could not decode or keep (a damaged group, the budget held) is decoded
again by ``ColumnarView.locate`` on the reading thread, which raises or skips
as it always does, so errors and their order are those of one thread.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.engine.helper_thread import Helper

MIN_GROUPS = 4  # fewer missing groups are decoded where they are needed: a handoff costs ~50 us

_helper = Helper("shardfeed-group-decode")  # one a process: group decodes never overlap (one reading thread)


def decode_missing(groups: list, local: np.ndarray, threads: int) -> int:
    """Decode the row groups that ``groups`` ([(ColumnarView, batch rows)]) need and the store lacks,
    half of them (by shard) on a helper thread. Returns how many groups the helper decoded."""
    if threads < 2 or len(groups) < 2:
        return 0
    todo = []
    for view, rows in groups:
        missing = view.missing_groups(local[rows])
        if missing:
            todo.append((view, missing))
    total = sum(len(m) for _, m in todo)
    if len(todo) < 2 or total < MIN_GROUPS:
        return 0
    # shards to the helper until it holds half of the groups (largest first keeps the halves even)
    todo.sort(key=lambda t: -len(t[1]))
    mine, theirs, n_theirs = [], [], 0
    for item in todo:
        if n_theirs < total / 2 and len(mine) > 0:
            theirs.append(item)
            n_theirs += len(item[1])
        else:
            mine.append(item)
    if not theirs:
        return 0
    _helper.submit(_decode, theirs)
    try:
        _decode(mine)
    finally:
        _helper.wait()  # the helper is idle again before the batch's rows are placed
    return n_theirs


def _decode(work: list) -> None:
    for view, missing in work:
        for g in missing:
            try:
                view.decoded(g)
            except Exception:  # noqa: BLE001 - locate decodes it again on the reading thread and raises there
                break  # the shard's other groups too: the reading thread meets its error first
