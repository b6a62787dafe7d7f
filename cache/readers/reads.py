"""A reader's shards through the node-local cache: ``path_of`` / ``release`` / ``refetch``.

``CacheSpec`` is what a dataset keeps: where the cache lives, its budget and
how to reach the source. It is plain data, so it pickles to spawned workers;
``spec.open()`` gives this process's one ShardCache (a forked child gets its
own, never its parent's).

``CachedShards`` is the path resolver a BatchReader (formats/engine/batch.py) takes:
``path_of(s)`` returns the local file of shard ``s``, fetched and verified
against the index hash if need be, and *pins* it (a shared flock), so no
process on the node evicts a file a reader holds open; ``release(s)`` unpins
it when the reader closes the file. A reader that finds a cached copy damaged
(per-sample checksums) calls ``refetch(s)``: the copy is discarded and the
next open fetches a fresh one, checked against the hash again. The cache does
not re-hash a copy on every open (a full read of the shard each time);
damage is caught where it matters, on read, and never delivered.

Counters, as deltas since the last ``take()``: ``hits`` / ``misses`` (was the
shard cached when the reader opened it), ``wait_s`` (the reader's time
waiting for fetches: the stall the cache caused), ``late_samples`` (sample
ranges the reader fetched itself: not prefetched in time), and the process
cache's ``bytes_fetched``, ``evictions``, ``requests`` and prefetch counters
(counted once per process whoever takes them, see ``CacheSpec.take``).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field

from shardfeed.cache.fetching.fetch import PREFETCH_COUNTERS, FetchOptions
from shardfeed.cache.readers.shard_access import ShardAccess
from shardfeed.cache.storage.store import ShardCache, ShardRef

DEFAULT_DIR_ENV = "SHARDFEED_CACHE_DIR"
_DISK_SHARE = 0.8
_SIDECAR_FIXED = 2560  # schema, footer and metadata of a sidecar file  # default budget: this share of the disk space the cache could use

_TAKEN = ("bytes_fetched", "evictions", "requests", *PREFETCH_COUNTERS)  # what take() hands the Loader
_caches: dict[tuple, ShardCache] = {}
_seen: dict[tuple, dict] = {}  # last cache counters handed out by take(), per process cache
_mu = threading.Lock()


def default_cache_dir() -> str:
    """``$SHARDFEED_CACHE_DIR``, else ``<tmp>/shardfeed-cache-<uid>``: one folder per
    user and node, so every rank and job on the node shares it (entries are
    keyed by content hash, so sharing never serves stale bytes)."""
    import tempfile

    return os.environ.get(DEFAULT_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"shardfeed-cache-{os.getuid()}")


def default_limit(cache_dir: str) -> int:
    """80% of what the cache could hold on its disk: free space plus what it holds now."""
    os.makedirs(cache_dir, exist_ok=True)
    held = 0
    data = os.path.join(cache_dir, "data")
    if os.path.isdir(data):
        with os.scandir(data) as it:
            for e in it:
                try:
                    held += e.stat().st_size
                except FileNotFoundError:
                    pass
    return max(1, int((shutil.disk_usage(cache_dir).free + held) * _DISK_SHARE))


def entry_bytes(index):
    """What each shard's cache entry takes on disk: the shard plus, for a tar with a
    sidecar, an upper estimate of the sidecar (the index does not record its
    size; Arrow's fixed part plus key, checksum and each member's offset, size
    and field per sample), each in whole disk blocks, so budget checks count
    what the cache will hold."""
    import numpy as np

    from shardfeed.cache.sample_ranges.cost_model import BLOCK
    from shardfeed.cache.sample_ranges.cost_model import (
        rounded_blocks_array as blocks,  # the budget charges whole blocks
    )

    sizes = np.asarray(index.sizes, np.int64)
    tars = np.array([f.startswith("tar") and i not in index.tables for i, f in enumerate(index.formats)], bool)
    side = _SIDECAR_FIXED + np.asarray(index.counts, np.int64) * (48 + 24 * max(1, len(index.fields)))
    # a copy kept without a hash carries its source's identity in an attribute: a block more at worst
    unhashed = np.array([not h for h in index.hashes], bool)
    return blocks(sizes) + np.where(tars, blocks(side), 0) + np.where(unhashed, BLOCK, 0)


def index_version(index) -> str:
    """What names this version of a dataset: its index's digest (with its size
    and row count), so a shard the index has no hash for is keyed by it."""
    meta = index.meta
    return f"{meta.get('digest', '')}|{len(index)}|{int(index.num_bytes)}"


def max_entry_bytes(index) -> int:
    return int(entry_bytes(index).max()) if len(index) else 1


@dataclass(frozen=True)
class CacheSpec:
    """Where a dataset's cache lives and how its source is reached (picklable)."""

    cache_dir: str
    limit_bytes: int
    storage_options: dict = field(default_factory=dict, hash=False, compare=False)
    fetch: FetchOptions = field(default_factory=FetchOptions)
    wait_timeout_s: float = 300.0

    def _key(self) -> tuple:
        return (os.getpid(), self.cache_dir, self.limit_bytes, self.fetch, self.wait_timeout_s)

    def open(self) -> ShardCache:
        """This process's ShardCache for the spec (one per process: counters add up once)."""
        key = self._key()
        with _mu:
            cache = _caches.get(key)
            if cache is None:
                cache = _caches[key] = ShardCache(self.cache_dir, self.limit_bytes, self.storage_options,
                                                  self.fetch, self.wait_timeout_s)
            return cache

    def take(self) -> dict:
        """bytes_fetched, evictions, requests (to the source) and the prefetcher's counters
        (fetch.PREFETCH_COUNTERS) of this process's cache since the last take()."""
        key = self._key()
        with _mu:
            cache = _caches.get(key)
            if cache is None:
                return dict.fromkeys(_TAKEN, 0)
            now = cache.stats()
            last = _seen.get(key, {})
            _seen[key] = now
        return {k: now[k] - last.get(k, 0) for k in _TAKEN}


def _reader_counters() -> dict:
    # late_samples: samples a reader fetched itself as ranges (ranged_reads.py), not prefetched in time
    return {"hits": 0, "misses": 0, "wait_s": 0.0, "late_samples": 0}


class CachedShards(ShardAccess):
    """Path resolver of a BatchReader over ``index`` (see the module docstring): the
    whole-shard ShardAccess (cache/shard_access.py).

    ``url_of(i)`` names shard ``i`` at its source (default ``index.path(i)``).
    ``let_go``: set by the reader (loader/batcher.py) to close the shards it keeps
    open between reads and is not reading now; a fetch waiting for room calls it,
    so no reader waits for room its own idle pins hold (nor two readers for each
    other's).
    """

    let_go = None  # () -> None; see the class docstring

    def __init__(self, index, spec: CacheSpec, url_of=None):
        self.index = index
        self.spec = spec
        self.url_of = url_of or index.path
        self._held: dict[int, list] = {}  # shard -> open pins (one per path_of not yet released)
        self._paths: dict[str, int] = {}  # cached file -> shard, for errors that name the file
        self._c = _reader_counters()
        self._refs: tuple = (None, {})  # (the index, {shard: its ShardRef})

    def ref(self, i: int) -> ShardRef:
        refs = self._refs
        if refs[0] is not self.index:  # a followed dataset's index is replaced as it grows
            refs = self._refs = (self.index, {})
        got = refs[1].get(i)
        if got is None:  # remembered: the prefetcher's plan names hundreds of shards at every step
            h = self.index.hashes[i] or None
            got = refs[1][i] = ShardRef(self.url_of(i), h, int(self.index.sizes[i]),
                                        None if h else index_version(self.index))
        return got

    def needs_sidecar(self, i: int) -> bool:
        # a foreign tar scanned on open has its table in the index and no sidecar anywhere
        return self.index.formats[i].startswith("tar") and i not in self.index.tables

    def path_of(self, i: int) -> str:
        cache = self.spec.open()
        ref = self.ref(i)
        had = os.path.exists(os.path.join(cache.data_dir, cache.key_for(ref.url, ref.hash, ref.version)))
        t0 = time.monotonic()
        pin = cache.hold(ref.url, ref.hash, ref.size, sidecar=self.needs_sidecar(i), version=ref.version,
                         on_wait=self.on_wait)
        path = pin.__enter__()
        self._c["wait_s"] += time.monotonic() - t0
        self._c["hits" if had else "misses"] += 1
        self._held.setdefault(i, []).append(pin)
        self._paths[path] = i
        return path

    def on_wait(self) -> None:
        """Called while a fetch of this reader waits for room: let go of idle pins."""
        if self.let_go is not None:
            self.let_go()

    def release(self, i: int) -> None:
        pins = self._held.get(i)
        if not pins:
            return
        pin = pins.pop(0)
        if not pins:
            del self._held[i]
        pin.__exit__(None, None, None)

    def shard_of_path(self, path: str) -> int | None:
        """The shard whose cached file (or its sidecar) or source is ``path``, if any."""
        path = str(path).removesuffix(".idx")
        if path in self._paths:
            return self._paths[path]
        root = str(self.index.root).rstrip("/")
        for sep in {"/", os.sep}:
            if path.startswith(root + sep):
                return self.index.row_of(path[len(root) + 1:].replace(os.sep, "/"))
        return None

    def refetch(self, i: int) -> bool:
        """Discard shard ``i``'s cached copy (found damaged): the next open fetches it again."""
        ref = self.ref(i)
        return self.spec.open().discard(ref.url, ref.hash, ref.version)

    def take(self) -> dict:
        """This reader's counters since the last take(), with its process cache's fetches."""
        out, self._c = self._c, _reader_counters()
        out.update(self.spec.take())
        return out

    def close(self) -> None:
        for i in list(self._held):
            while i in self._held:
                self.release(i)
