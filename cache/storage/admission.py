"""Whole-shard admission: room claimed for a shard and its sidecar before their fetch starts.

A reader or prefetcher that decides to bring a shard whole (ranged_reads.py)
claims its room under the node's budget lock with a placeholder temporary
(``<key>.tmp-admit-<pid>-<id>``, sparse: no disk), sized for the shard and
its sidecar in the disk's blocks. The shard's own fetch gives back the
shard's part when it starts and the rest (its sidecar's) when the sidecar's
fetch starts (budget.py: a temporary of the key it fetches). Several ranks
and threads deciding at once would otherwise all see the same free room; and
a sidecar left unclaimed was room a reader could wait for while the node's
readers pinned every other byte.
"""

from __future__ import annotations

import os
import time
import uuid

from shardfeed.cache.storage.disk_blocks import rounded
from shardfeed.cache.storage.locks import FileLock
from shardfeed.formats.staging import pid_alive

ADMIT = ".tmp-admit-"  # a placeholder holding room for a whole shard admitted, until its fetch starts
ADMIT_HOLD_S = 60.0  # longer than any admission waits for its fetch to start (a fetch lock another holds)


def claim(cache, key: str, size: int, sidecar_share: float, room: int) -> tuple[bool, int]:
    """(whether shard ``key`` of ``size`` bytes, with its sidecar, was given room within ``room``
    bytes of whole shards, the whole shards' bytes seen); True at once when it is here already."""
    block = cache.budget.block
    # the placeholder's own block beside the shard's and its sidecar's (simulate.simulate_ranged asks the same)
    size = rounded(size, block) + rounded(int(size * sidecar_share), block) + block
    with FileLock(os.path.join(cache.cache_dir, ".cache.lock")):
        used = cache.budget.whole_bytes()
        if used + size > room:
            return False, used
        if os.path.exists(os.path.join(cache.data_dir, key)):
            return True, used
        tmp = os.path.join(cache.data_dir, f"{key}{ADMIT}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as f:
            f.truncate(size)
    return True, used + size


def admission_held(path: str) -> bool:
    """Whether the placeholder ``path`` (``<key>.tmp-admit-<pid>-<id>``) still holds its room:
    its process lives and it is recent. Nobody holds its key's fetch lock before the fetch
    starts, so without this any budget scan took it for a dead fetcher's temporary and
    dropped it, and concurrent admissions (other ranks) overfilled the whole shards' room."""
    name = os.path.basename(path)
    if ADMIT not in name:
        return False
    try:
        pid = int(name.split(ADMIT, 1)[1].split("-", 1)[0])
        age = time.time() - os.stat(path).st_mtime
    except (ValueError, OSError):
        return False
    return age < ADMIT_HOLD_S and pid_alive(pid)
