"""The budget of decoded shard bytes held in memory, one per process (decompressed tars, decoded row groups).

A .tar.gz or .tar.zst shard cannot be seeked, so an open one is held
decompressed in memory (readers.py). Each is capped on its own
(SHARDFEED_MAX_DECOMPRESSED_BYTES), but a reader keeps up to 256 shards open:
the caps alone bound nothing in practice. This budget bounds their total
(SHARDFEED_MAX_DECOMPRESSED_TOTAL_BYTES, default 2 GiB per process): a shard
that would go over first asks the tables of open shards to close their least
recently used unpinned compressed shards (``add_reclaimer``); if that frees
too little (the shards of one batch alone exceed it), opening the shard is a
ShardError naming the setting. Peak use is the budget plus the shards being
decompressed: the one a read needs and the one decompress_thread.py's thread
is on (``try_acquire``: it takes only free budget and closes nothing).
Read in stored order, a shard is closed well before that: once neither the
read nor the next one needs it (OpenShards.let_go, from the loader's hint).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

from shardfeed.formats.errors import ShardError

LIMIT = int(os.environ.get("SHARDFEED_MAX_DECOMPRESSED_TOTAL_BYTES", 2 << 30))

_lock = threading.RLock()
_used = 0
_reclaimers: list = []  # weak references to reclaim(nbytes) -> bytes freed


def used() -> int:
    return _used


def add_reclaimer(method: Callable[[int], object]) -> None:
    """Register a bound method ``reclaim(nbytes)`` that closes open compressed
    shards to free about ``nbytes`` (held weakly: its owner may go away)."""
    with _lock:
        _reclaimers.append(weakref.WeakMethod(method))


def acquire(nbytes: int, path: str, limit: int | None = None) -> int:
    """Count ``nbytes`` of decompressed shard ``path`` against the budget;
    returns ``nbytes`` (give it back to ``release``)."""
    global _used
    limit = LIMIT if limit is None else limit
    with _lock:
        if _used + nbytes > limit:
            for ref in list(_reclaimers):
                fn = ref()
                if fn is None:
                    _reclaimers.remove(ref)
                    continue
                fn(_used + nbytes - limit)
                if _used + nbytes <= limit:
                    break
        if _used + nbytes > limit:
            raise ShardError(path, f"decompressed, this shard ({nbytes:,} bytes) would bring the compressed "
                                   f"shards held in memory to {_used + nbytes:,} bytes, over the budget of "
                                   f"{limit:,} (shards in use cannot be closed); raise "
                                   "SHARDFEED_MAX_DECOMPRESSED_TOTAL_BYTES, use smaller batches, or store "
                                   "shards as plain .tar (memory-mapped, not held)")
        _used += nbytes
        return nbytes


def try_acquire(nbytes: int, limit: int | None = None) -> bool:
    """Count ``nbytes`` if they fit in what is free now, closing nothing
    (decompress_thread.py: a guess must never close a shard someone reads)."""
    global _used
    limit = LIMIT if limit is None else limit
    with _lock:
        if _used + nbytes > limit:
            return False
        _used += nbytes
        return True


def release(nbytes: int) -> None:
    global _used
    if nbytes:
        with _lock:
            _used -= nbytes
