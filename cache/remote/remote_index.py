"""Remote datasets: the index mirrored into the cache folder, shards by row.

``mirror_index(url, cache)`` copies ``index.arrow`` and the commit log
(``_log/<seq>.json`` after the last commit index.arrow folds, when the store
can list it: S3/GCS always, HTTP when the server answers a folder with an
HTML listing; LOG_FETCHES entries asked at once) into
``<cache_dir>/datasets/<hash of url>/``, a folder that
``shardfeed.formats.open_index`` opens like any local dataset (the index
checks its own digest there). Each file is written to a temporary name and
renamed, so concurrent mirrors on a node never see half a file. Log entries
are immutable, so a refresh fetches only new ones. Index and log bytes are
metadata and are not counted in the cache's byte budget.

``RemoteDataset`` pairs that index with the cache: ``ref(i)`` is what to
fetch for row ``i`` (URL, hash, size), ``hold(i)`` pins the shard locally with
its sidecar beside it (``<path>.idx``), so ``open_shard(index, i, path)``
reads it as it reads a local shard.

``open_remote_index(url, cache_dir)`` is the same pairing as a
``DatasetIndex`` (what ``shardfeed inspect`` and ``verify`` take): its
``path(i)`` is the verified local copy of shard ``i``, fetched on first use.
``shardfeed.formats.open_index`` refuses URLs and names this function,
since formats cannot stand on the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import xxhash

from shardfeed.cache.fetching.fetch import with_retries
from shardfeed.cache.fetching.url_schemes import is_remote
from shardfeed.cache.fetching.url_sources import open_source
from shardfeed.cache.storage import ledger
from shardfeed.cache.storage.budget import unlink_quiet
from shardfeed.cache.storage.store import ShardCache, ShardRef
from shardfeed.formats import ShardError, open_index
from shardfeed.formats.commit_log import base_log_seq
from shardfeed.formats.index import INDEX_NAME, LOG_DIR, DatasetIndex
from shardfeed.formats.staging import pid_alive

_SEQ_RE = re.compile(r"^\d{12}\.json$")
LOG_FETCHES = 16  # commit log entries asked at once (each a round trip of a few hundred bytes: latency-bound)
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked process makes its own
_pool_mu = threading.Lock()


def fetch_together(fn, items) -> list:
    """``fn(item)`` of each of ``items``, at most LOG_FETCHES at once, results in order; the first
    error (in ``items``' order) is raised once every call has ended."""
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    global _pool
    with _pool_mu:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(LOG_FETCHES, thread_name_prefix="shardfeed-log"))
        pool = _pool[1]
    futures = [pool.submit(fn, x) for x in items]
    out, error = [], None
    for f in futures:
        try:
            out.append(f.result())
        except BaseException as e:  # noqa: BLE001 - raised below, after the other fetches ended
            error = error or e
            out.append(None)
    if error is not None:
        raise error
    return out
_MAX_META_BYTES = 1 << 30  # an index of 100,000 shards is a few MB; refuse absurd claims before allocating
_MAX_LOG_ENTRY = 1 << 16  # one commit is a small JSON object (as formats/remote_log.py reads them)
_VERSION_XATTR = "user.shardfeed.source"


def mirror_folder(url: str, cache: ShardCache) -> str:
    return os.path.join(cache.cache_dir, "datasets", xxhash.xxh3_128_hexdigest(url.rstrip("/").encode())[:20])


def _copy(url: str, dest: str, cache: ShardCache, max_bytes: int = _MAX_META_BYTES, versioned: bool = True) -> bool:
    """Bring ``url`` to ``dest`` unless ``dest`` already holds the same version
    (a conditional GET over HTTP, an ETag compare elsewhere); True if it was fetched.
    ``versioned=False`` (a commit log entry: immutable, a few hundred bytes): no
    version kept beside it, as its attribute would take a disk block of its own on
    filesystems with small inodes, doubling the disk each commit holds; asked
    again, it is read again (one request either way)."""
    opts = cache.fetch_options
    src = open_source(url, cache.storage_options, opts.stall_s, opts.min_rate)
    known = _known(dest) if versioned else None
    cache._add(requests=1)
    ident, data = with_retries(url, "reading it", lambda: src.get_small(max_bytes, known,
                                                                        lambda: cache._add(requests=1)), opts)
    if data is None:
        return False  # unchanged (304, or the same ETag)
    # inside the cache's budget like a shard: room made first, renamed under the node lock; a log
    # entry's temporary beside the log's folder, which holds finished entries only (its ledger)
    folder = os.path.dirname(dest) if versioned else os.path.dirname(os.path.dirname(dest))
    # the log's first entry makes its total's file: room for its block made with the entry's, given
    # back (the temporary cut to the entry's size) under the lock where the total's file takes it
    extra = 0 if versioned or not ledger.needs_total(os.path.dirname(dest)) else cache.budget.block
    tmp = cache.budget.make_room_and_create(os.path.basename(dest), "", len(data) + extra, url, folder,
                                            xattr=_VERSION_XATTR if versioned else None)
    try:
        try:
            with open(tmp, "r+b") as f:
                f.write(data)
        except OSError as e:  # a disk without fallocate fills here, not at the reservation
            raise _disk_error(url, tmp, e) from e
        try:
            if versioned:
                os.setxattr(tmp, _VERSION_XATTR, json.dumps([ident.size, ident.etag, ident.modified]).encode())
        except OSError:
            pass  # no xattrs here: the next mirror fetches it again (never stale)
        with cache.budget.locked():  # a scan never sees it twice or not at all
            if extra:
                os.truncate(tmp, len(data))
            ledger.replace(tmp, dest, cache.budget.block)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def _disk_error(url: str, path: str, e: OSError) -> ShardError:
    return ShardError(url, f"cannot write its mirror at {path} in the cache: {e}; free space there, lower "
                           "cache_limit_bytes or point cache_dir at a larger disk")


def _known(dest: str):
    from shardfeed.cache.fetching.source_contract import Identity

    try:
        size, etag, modified = json.loads(os.getxattr(dest, _VERSION_XATTR))
        return Identity(size, etag, modified)
    except (OSError, ValueError, TypeError):
        return None


def _list_log(url: str, cache: ShardCache) -> list[str] | None:
    """Names of commit log entries, or None when the store has no log there
    (404, or a server that lists no folders). Other failures raise."""
    src = open_source(url.rstrip("/") + f"/{LOG_DIR}/", cache.storage_options, cache.fetch_options.stall_s,
                      cache.fetch_options.min_rate)
    cache._add(requests=1)
    try:
        listed = with_retries(src.url, "listing it", src.list, cache.fetch_options)
    except ShardError as e:
        if isinstance(e.__cause__, (FileNotFoundError, NotImplementedError)):
            return None
        raise
    except NotImplementedError:
        return None
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in listed]
    return sorted(n for n in names if _SEQ_RE.match(n))


def mirror_index(url: str, cache: ShardCache) -> str:
    """Bring the dataset's index (and commit log) at ``url`` into the cache;
    returns the local folder for ``open_index``. Call again to follow new
    commits: every mirrored file is revalidated (conditional requests), a
    file the source no longer has is dropped, so a dataset rewritten at the
    same URL is never read stale."""
    url = str(url).rstrip("/")
    if not is_remote(url):
        return url[len("file://"):] if url.startswith("file://") else url  # already local: nothing to copy
    folder = mirror_folder(url, cache)
    note = os.path.join(folder, "source.txt")
    try:
        os.makedirs(os.path.join(folder, LOG_DIR), exist_ok=True)
        if not os.path.exists(note):  # for people looking at the cache folder (a block, in the budget)
            text = (url + "\n").encode()
            tmp = cache.budget.make_room_and_create("source.txt", "", len(text), url, folder)
            try:
                with open(tmp, "r+b") as f:
                    f.write(text)
                with cache.budget.locked():
                    os.replace(tmp, note)
            finally:
                unlink_quiet(tmp)
    except OSError as e:  # a full disk (ENOSPC), a quota, a read-only folder
        raise _disk_error(url, folder, e) from e
    have_index = True
    try:
        _copy(f"{url}/{INDEX_NAME}", os.path.join(folder, INDEX_NAME), cache)
    except ShardError as e:
        if not isinstance(e.__cause__, FileNotFoundError):
            raise
        have_index = False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, INDEX_NAME))  # the source dropped it: so does the mirror
    _drop_dead_temporaries(folder)
    os.makedirs(os.path.join(folder, LOG_DIR), exist_ok=True)
    with cache.budget.locked():  # its entries' charge a running total from now on: never listed again
        ledger.count(os.path.join(folder, LOG_DIR), cache.budget.block)
    log = _list_log(url, cache) or []
    for name in set(os.listdir(os.path.join(folder, LOG_DIR))) - set(log):
        if _SEQ_RE.match(name):
            with cache.budget.locked():  # gone at the source (rewritten log)
                ledger.remove(os.path.join(folder, LOG_DIR, name), cache.budget.block)
    # index.arrow folds the log up to its log_seq (`shardfeed compact`): only the entries after it are read
    base = base_log_seq(folder) if have_index else 0
    fetch_together(lambda name: _copy(f"{url}/{LOG_DIR}/{name}", os.path.join(folder, LOG_DIR, name), cache,
                                      _MAX_LOG_ENTRY, versioned=False),
                   [n for n in log if int(n[:12]) > base])
    if not have_index and not log:
        raise ShardError(url, f"not found: no {INDEX_NAME} and no {LOG_DIR}/ commit log is there (check the "
                              "URL and bucket; a dataset is written with ShardWriter or `shardfeed convert`)")
    return folder


def _drop_dead_temporaries(folder: str) -> None:
    """Temporaries of mirrors whose process died (the budget counts them until they go)."""
    for d in (folder, os.path.join(folder, LOG_DIR)):
        for name in os.listdir(d):
            m = re.search(r"\.tmp-(\d+)-", name)
            if m and not pid_alive(int(m.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(d, name))


class RemoteDataset:
    """A dataset at a URL, read through a ShardCache: ``index``, ``ref(i)``, ``hold(i)``."""

    def __init__(self, url: str, cache: ShardCache):
        self.url = str(url).rstrip("/")
        self.cache = cache
        self.folder = mirror_index(self.url, cache)
        self.index = open_index(self.folder)

    def refresh(self):
        """Fetch new commits and reopen the index (a growing dataset)."""
        self.folder = mirror_index(self.url, self.cache)
        self.index = open_index(self.folder)
        return self.index

    def url_of(self, i: int) -> str:
        return f"{self.url}/{self.index.names[i]}"

    def ref(self, i: int) -> ShardRef:
        from shardfeed.cache.readers.reads import index_version

        info = self.index.shard(i)
        return ShardRef(self.url_of(i), info.hash or None, info.bytes, None if info.hash else index_version(self.index))

    def refs(self, rows) -> list[ShardRef]:
        return [self.ref(int(i)) for i in rows]

    def needs_sidecar(self, i: int) -> bool:
        return self.index.formats[i].startswith("tar")

    @contextlib.contextmanager
    def hold(self, i: int):
        """Local path of shard ``i`` (verified, with its sidecar), pinned for the block."""
        ref = self.ref(i)
        with self.cache.hold(ref.url, ref.hash, ref.size, sidecar=self.needs_sidecar(i), version=ref.version) as path:
            yield path

    def get(self, i: int) -> str:
        with self.hold(i) as path:
            return path


class RemoteIndex(DatasetIndex):
    """A URL dataset's index whose ``path(i)`` is the cached, verified copy of
    shard ``i`` (with its sidecar), fetched on first use. ``root`` is the URL,
    so messages name the source; ``url_of(i)``, ``hold(i)`` and ``discard(i)``
    reach the cache. A path it hands out is not pinned: a small cache may
    evict it once the caller has opened it (the open file stays readable)."""

    def __init__(self, remote: RemoteDataset):
        ix = remote.index
        super().__init__(remote.url, ix.names, ix.formats, ix.counts, ix.sizes, ix.hashes, ix.fields, ix.meta)
        self.remote = remote
        self.cache = remote.cache

    def path(self, i: int) -> str:
        return self.remote.get(i)

    def url_of(self, i: int) -> str:
        return self.remote.url_of(i)

    def hold(self, i: int):
        return self.remote.hold(i)

    def is_cached(self, i: int) -> bool:
        ref = self.remote.ref(i)
        return os.path.exists(os.path.join(self.cache.data_dir, self.cache.key_for(ref.url, ref.hash, ref.version)))

    def discard(self, i: int) -> bool:
        """Drop the cached copy of shard ``i`` (found damaged), so the next use fetches it again."""
        ref = self.remote.ref(i)
        return self.cache.discard(ref.url, ref.hash, ref.version)


def open_remote_index(url: str, cache_dir: str | None = None, limit_bytes: int | None = None,
                      storage_options: dict | None = None) -> RemoteIndex:
    """The index of the dataset at ``url`` (http(s)://, s3://, gs://, ...),
    mirrored into the node-local cache at ``cache_dir`` (default: as
    ShardDataset, ``$SHARDFEED_CACHE_DIR`` else ``<tmp>/shardfeed-cache-<uid>``)
    holding at most ``limit_bytes`` of shards (default: 80% of its disk)."""
    from shardfeed.cache.readers.reads import default_cache_dir, default_limit

    url = str(url).rstrip("/")
    if not is_remote(url):
        raise ValueError(f"{url} is local: open it with shardfeed.formats.open_index")
    cache_dir = os.path.abspath(os.fspath(cache_dir)) if cache_dir is not None else default_cache_dir()
    if limit_bytes is None:
        limit_bytes = default_limit(cache_dir)
    return RemoteIndex(RemoteDataset(url, ShardCache(cache_dir, int(limit_bytes), storage_options)))
