"""ShardCache: a node-local, size-bounded cache of shards shared by every
process and rank on the node.

Life of an entry (one key: ``h-<content hash>`` when the hash is known, so a
stale cache never serves old bytes and two jobs over the same data share it;
``u-<hash of the URL>`` otherwise)::

    REMOTE --get/hold--> FETCHING --verified, renamed--> LOCAL --evicted--> EVICTED (= REMOTE)
                            |  \\__ hash/size mismatch or fetch error: temp removed, ShardError
                            v
                   (others wait on the fetch lock)     LOCAL <--hold--> PINNED (never evicted)

- REMOTE: nothing on disk. FETCHING: one process holds ``locks/<key>.fetch``
  and writes ``data/<key>.tmp-*``, preallocated to its full size so the budget
  sees it; every other process asking for the key waits on that lock.
- LOCAL: ``data/<key>`` (and its sidecar ``data/<key>.idx``), complete and
  verified: it appears only by an atomic rename, so no reader sees a partial
  file. PINNED: some reader holds a shared flock on ``locks/<key>.pin``; the
  evictor only removes an entry whose pin it can lock exclusively.
- EVICTED: removed to make room, by farthest planned next use
  (see lookahead.py); a later get fetches it again.

The byte budget counts complete entries and in-flight temporaries; making
room and creating a temporary happen under one node-wide lock
(``.cache.lock``), so concurrent fetches never overshoot it together
(budget.py). Counters (``stats()``) are this process's: hits, misses,
bytes_fetched, evictions, wait_s (on other fetchers and full budgets),
fetch_s, errors, discarded (damaged copies removed by ``discard``), and the
prefetcher's (``fetch.PREFETCH_COUNTERS``, counted where it runs).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from dataclasses import dataclass

import xxhash

from shardfeed.cache.fetching.fetch import PREFETCH_COUNTERS, FetchOptions, fetch_to_fd, with_retries
from shardfeed.cache.fetching.url_sources import open_source
from shardfeed.cache.storage.budget import NO_SIDECAR, SIDECAR, Budget, CacheLimitError, unlink_quiet
from shardfeed.cache.storage.eviction import SharedLookahead
from shardfeed.cache.storage.locks import FileLock, acquire_timed
from shardfeed.formats import ShardError
from shardfeed.formats.readers import hash_file

__all__ = ["CacheLimitError", "ShardCache", "ShardRef"]

IDENTITY_XATTR = "user.shardfeed.source"  # size|ETag|Last-Modified of an entry fetched without a hash
MAX_SIDECAR_BYTES = 1 << 30  # a sidecar of millions of samples is ~100 MB: refuse absurd claims unread


@dataclass(frozen=True)
class ShardRef:
    """What to fetch: the URL, and from the index its content hash and byte size;
    ``version`` (the index's digest) keys a shard the index has no hash for."""

    url: str
    hash: str | None = None
    size: int | None = None
    version: str | None = None


class ShardCache:
    """``ShardCache(cache_dir, limit_bytes)``: ``.get(url) -> local path``.

    ``storage_options`` go to the fsspec filesystem of remote URLs;
    ``wait_timeout_s`` bounds how long a fetch waits for pinned entries to be
    released when the budget is full before it raises CacheLimitError.
    """

    def __init__(self, cache_dir: str, limit_bytes: int, storage_options: dict | None = None,
                 fetch: FetchOptions | None = None, wait_timeout_s: float = 300.0, share_lookahead: bool = True):
        if not isinstance(limit_bytes, int) or limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be a positive int, got {limit_bytes!r}")
        self.cache_dir = os.path.abspath(str(cache_dir))
        self.limit_bytes = limit_bytes
        self.storage_options = dict(storage_options or {})
        self.fetch_options = fetch or FetchOptions()
        self.wait_timeout_s = wait_timeout_s
        self.data_dir = os.path.join(self.cache_dir, "data")
        self.lock_dir = os.path.join(self.cache_dir, "locks")
        for d in (self.data_dir, self.lock_dir):
            os.makedirs(d, exist_ok=True)
        self.lookahead = SharedLookahead(os.path.join(self.cache_dir, "lookahead"), share_lookahead)
        self._counters = dict(hits=0, misses=0, bytes_fetched=0, evictions=0, wait_s=0.0, fetch_s=0.0, errors=0,
                              discarded=0, requests=0, **{k: 0 for k in PREFETCH_COUNTERS})
        self._mu = threading.Lock()
        self.budget = Budget(self.cache_dir, limit_bytes, wait_timeout_s, self.lookahead.merged, self._add)

    # -- public ---------------------------------------------------------------

    @staticmethod
    def key_for(url: str, expected_hash: str | None = None, version: str | None = None) -> str:
        """``h-<hash>``; without a hash ``u-<hash of the URL and version>``: a
        dataset rewritten at the same URL has a new index, hence new keys."""
        return _key_for(url, expected_hash or None, version)

    def path_for(self, url: str, expected_hash: str | None = None, version: str | None = None) -> str:
        """Where the entry lives once LOCAL (it may not be there yet)."""
        return os.path.join(self.data_dir, self.key_for(url, expected_hash, version))

    def contains(self, url: str, expected_hash: str | None = None, version: str | None = None) -> bool:
        return os.path.exists(self.path_for(url, expected_hash, version))

    def get(self, url: str, expected_hash: str | None = None, size: int | None = None, *,
            sidecar: bool = False, cancel: threading.Event | None = None, version: str | None = None,
            on_wait=None) -> str:
        """Local path of ``url``, fetched (and verified) if needed. Unpinned: it
        may be evicted after this returns; readers should use ``hold``."""
        with self.hold(url, expected_hash, size, sidecar=sidecar, cancel=cancel, version=version,
                       on_wait=on_wait) as path:
            return path

    @contextlib.contextmanager
    def hold(self, url: str, expected_hash: str | None = None, size: int | None = None, *,
             sidecar: bool = False, cancel: threading.Event | None = None, version: str | None = None,
             on_wait=None):
        """Pin the entry (fetching it first if needed) for the ``with`` block.

        ``sidecar=True`` also brings ``<url>.idx`` to ``<path>.idx`` (checked by
        its own digest), so ``open_shard(index, i, path)`` finds it. Without
        ``expected_hash`` nor ``version`` a cached copy is revalidated against
        the source (size, ETag, Last-Modified) and fetched again if it changed.
        A fetch waiting for room lets go of the entry's fetch lock meanwhile and
        calls ``on_wait()`` (the reader lets go of what it holds and will not
        read soon: Budget.make_room_and_create).
        """
        key = self.key_for(url, expected_hash, version)
        pin = FileLock(os.path.join(self.lock_dir, key + ".pin"))
        self._add(wait_s=acquire_timed(pin, shared=True))  # the evictor holds it only for an unlink
        try:
            yield self._ensure(key, str(url), expected_hash, size, sidecar, cancel,
                               check=not (expected_hash or version), on_wait=on_wait)
        finally:
            pin.release()

    def discard(self, url: str, expected_hash: str | None = None, version: str | None = None) -> bool:
        """Remove the LOCAL copy of ``url`` (found damaged on disk by a reader's
        checksums), so the next get fetches and verifies it again. Processes
        that have it open keep reading their open file (and check it
        themselves). True if there was a copy."""
        key = self.key_for(url, expected_hash, version)
        path = os.path.join(self.data_dir, key)
        with FileLock(os.path.join(self.lock_dir, key + ".fetch")):  # not while someone renames a fresh copy in
            had = os.path.exists(path)
            for p in (path, path + SIDECAR, path + NO_SIDECAR):
                unlink_quiet(p)
        if had:
            self._add(discarded=1)
        return had

    def set_lookahead(self, items, publisher: SharedLookahead | None = None) -> None:
        """Plan of next uses: ``(url, step)``, ``(url, step, hash)`` or ``(ShardRef, step)``;
        the first step of each entry counts. Entries in no plan are evicted first.
        ``publisher``: a prefetcher's own (``lookahead.publisher()``), else the cache's."""
        plan: dict[str, int] = {}
        for item in items:
            what, step = item[0], int(item[1])
            key = self.key_for(what.url, what.hash, what.version) if isinstance(what, ShardRef) else \
                self.key_for(what, item[2] if len(item) > 2 else None)
            if step < plan.get(key, step + 1):
                plan[key] = step
        (publisher or self.lookahead).publish(plan)

    def reserve(self, working_set_bytes: int) -> None:
        """Fail now, not mid-epoch, if the budget is below the working set
        (shards read at once plus the prefetch window)."""
        if working_set_bytes > self.limit_bytes:
            raise CacheLimitError(self.cache_dir, f"cache limit {self.limit_bytes} bytes is below the working set: "
                                  f"{working_set_bytes} bytes are needed (shards in use plus the prefetch "
                                  f"window); raise limit_bytes to at least {working_set_bytes} or shrink the "
                                  "prefetch window", working_set_bytes)

    def used_bytes(self) -> int:
        """Bytes of complete entries and in-flight temporaries."""
        return self.budget.used_bytes()

    def stats(self) -> dict:
        with self._mu:
            return dict(self._counters)

    def close(self) -> None:
        self.lookahead.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- fetching -------------------------------------------------------------

    def _add(self, **delta) -> None:
        with self._mu:
            for k, v in delta.items():
                self._counters[k] += v

    def _ensure(self, key, url, expected_hash, size, sidecar, cancel, check=False, on_wait=None) -> str:
        path = os.path.join(self.data_dir, key)
        if os.path.exists(path) and (not sidecar or self._has_sidecar_answer(path)) and not check:
            self._add(hits=1)
            _touch(path)
            return path
        lock = FileLock(os.path.join(self.lock_dir, key + ".fetch"))
        self._add(wait_s=acquire_timed(lock))
        try:
            if os.path.exists(path) and check and not self._still_same(url, path):
                for p in (path, path + SIDECAR, path + NO_SIDECAR):
                    unlink_quiet(p)  # changed at the source: the copy is stale (open files stay readable)
            if os.path.exists(path):
                self._add(hits=1)  # cached, or another process fetched it while we waited
                _touch(path)
            else:
                self._add(misses=1)
                try:
                    self._download(key, url, path, expected_hash, size, cancel, check, (lock, on_wait))
                except BaseException:
                    self._add(errors=1)
                    raise
            if sidecar and not self._has_sidecar_answer(path):
                self._fetch_sidecar(key, url, path, cancel, expected_hash, (lock, on_wait))
        finally:
            lock.release()
        return path

    def _source(self, url: str):
        opts = self.fetch_options
        return open_source(url, self.storage_options, opts.stall_s, opts.min_rate)

    def _still_same(self, url: str, path: str) -> bool:
        """Whether the source still has the version cached at ``path`` (one HEAD)."""
        try:
            was = os.getxattr(path, IDENTITY_XATTR).decode()
        except OSError:
            return False  # no record (a filesystem without user xattrs): fetch again, never serve stale
        src = self._source(url)
        self._add(requests=1)
        return with_retries(url, "revalidating its cached copy", src.stat, self.fetch_options).token() == was

    def _download(self, key, url, path, expected_hash, size, cancel, record_identity=False,
                  waits=(None, None)) -> None:
        """``waits``: (the fetch lock, on_wait) for a wait for room (make_room_and_create)."""
        opts = self.fetch_options
        src = self._source(url)
        if size is None:
            self._add(requests=1)
            size = with_retries(url, "asking its size", src.size, opts)
        tmp = self.budget.make_room_and_create(key, "", int(size), url, held=waits[0], on_wait=waits[1],
                                               done=lambda: os.path.exists(path),
                                               xattr=IDENTITY_XATTR if record_identity else None)
        if tmp is None:
            return  # fetched by another process while this one waited for room
        t0 = time.monotonic()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
            try:
                fetch_to_fd(src, fd, int(size), opts, cancel, on_bytes=lambda n: self._add(bytes_fetched=n),
                            on_request=lambda: self._add(requests=1))
            finally:
                os.close(fd)
            if expected_hash:
                actual = hash_file(tmp)
                if actual != expected_hash.lower():
                    raise ShardError(url, f"content hash {actual} does not match the expected {expected_hash} "
                                          "(changed or damaged at the source); nothing was cached")
            if record_identity:
                ident = src.identity
                if ident is None:  # its reads check no version: ask for it, as a later revalidation will
                    self._add(requests=1)
                    ident = with_retries(url, "asking its version", src.stat, opts)
                token = ident.token()
                try:  # an attribute, not a file: no bytes beside the entry for the budget to miss
                    os.setxattr(tmp, IDENTITY_XATTR, token.encode())
                except OSError:
                    pass
            with self.budget.locked():  # never between a budget scan's listing and its sizes
                os.rename(tmp, path)
        except BaseException:
            unlink_quiet(tmp)
            raise
        finally:
            self._add(fetch_s=time.monotonic() - t0)

    def _write_small(self, key: str, suffix: str, path: str, data: bytes, url: str, waits=(None, None)) -> None:
        """A small file beside an entry (its identity, a sidecar), inside the budget."""
        tmp = self.budget.make_room_and_create(key, suffix, len(data), url, held=waits[0], on_wait=waits[1],
                                               done=lambda: self._has_sidecar_answer(path))
        if tmp is None:
            return
        try:
            with open(tmp, "r+b") as f:
                f.write(data)
            with self.budget.locked():
                os.rename(tmp, path + suffix)
        except BaseException:
            unlink_quiet(tmp)
            raise

    def _has_sidecar_answer(self, path: str) -> bool:
        return os.path.exists(path + SIDECAR) or os.path.exists(path + NO_SIDECAR)

    def _fetch_sidecar(self, key, url, path, cancel, expected_hash=None, waits=(None, None)) -> None:
        from shardfeed.formats.own_tables import read_sidecar

        opts = self.fetch_options
        src = self._source(url + SIDECAR)
        self._add(requests=1)  # http: one GET, no HEAD first (a 404 says there is none); else its size, then it
        try:
            _, data = with_retries(src.url, "reading it", lambda: src.get_small(
                MAX_SIDECAR_BYTES, on_request=lambda: self._add(requests=1)), opts)
        except ShardError as e:
            if isinstance(e.__cause__, FileNotFoundError) or "not found" in e.reason:
                self._write_small(key, NO_SIDECAR, path, b"", url, waits)  # a foreign tar: the reader scans it
                return
            raise
        size = len(data)
        self._add(bytes_fetched=size)
        tmp = self.budget.make_room_and_create(key, SIDECAR, size, src.url, held=waits[0], on_wait=waits[1],
                                               done=lambda: self._has_sidecar_answer(path))
        if tmp is None:
            return  # brought by another process while this one waited for room
        try:
            with open(tmp, "r+b") as f:
                f.write(data)
            _, meta = read_sidecar(tmp, url)  # checks the sidecar's own digest
            if meta["shard_bytes"] != os.path.getsize(path):
                raise ShardError(url, f"sidecar {src.url} describes {meta['shard_bytes']} bytes but the shard "
                                      f"has {os.path.getsize(path)} (stale sidecar); nothing was cached")
            if expected_hash and str(meta.get("shard_hash") or expected_hash).lower() != expected_hash.lower():
                raise ShardError(url, f"sidecar {src.url} describes a shard of hash {meta.get('shard_hash')}, not "
                                      f"{expected_hash} (stale sidecar); nothing was cached")
            with self.budget.locked():
                os.rename(tmp, path + SIDECAR)
        except BaseException:
            unlink_quiet(tmp)
            raise


@functools.lru_cache(maxsize=1 << 16)
def _key_for(url: str, expected_hash: str | None, version: str | None) -> str:
    """ShardCache.key_for, remembered: every range fetch and hit names its entries several
    times (tens of thousands of calls an epoch at 8,000 samples)."""
    if expected_hash:
        return "h-" + "".join(c for c in expected_hash.lower() if c in "0123456789abcdef")[:64]
    return "u-" + xxhash.xxh3_128_hexdigest(f"{url}\0{version or ''}".encode())


def _touch(path: str) -> None:
    try:
        os.utime(path)  # last use, for LRU among unplanned entries
    except OSError:
        pass
