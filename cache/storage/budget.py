"""The byte budget of a cache folder, shared by every process on the node.

What counts: everything the cache writes: complete entries (shard plus
sidecar), in-flight temporaries (preallocated to their full size so a
directory scan sees them), and the mirrored dataset metadata and lookahead
plans (``datasets/``, ``lookahead/``, never evicted), and the folders
themselves. Each file is charged what the disk allocates for it: its blocks
(``st_blocks``), never less than its size rounded up to the filesystem's
block (a file still being written), a sparse partial copy by its allocated
blocks alone; a file that carries an extended attribute may take a block
for it, reserved before it is set. So ``du`` of the folder never exceeds
the limit, whatever the files' sizes (a 170-byte log entry takes a block).
Making room, creating a temporary and renaming one into place all happen
under one node-wide flock (``<cache_dir>/.cache.lock``): two fetches never
overshoot the budget together, and no rename lands between a scan's listing
and its sizes (which would hide a file from the count). Eviction takes
entries in lookahead.victim_order and skips pinned ones; when all that is
left is pinned or in flight, a fetch waits (readers finish shards and unpin)
up to a timeout, then raises CacheLimitError with the limit that would have
worked.
"""

from __future__ import annotations

import os
import time
import uuid

from shardfeed.cache.storage import ledger
from shardfeed.cache.storage.admission import ADMIT, admission_held
from shardfeed.cache.storage.disk_blocks import ATTR_MARK, block_size, on_disk, rounded, temp_bytes
from shardfeed.cache.storage.eviction import victim_order
from shardfeed.cache.storage.locks import FileLock
from shardfeed.formats import ShardError

SIDECAR = ".idx"
PARTIAL = "r-"  # key prefix of a partial copy (ranges.py)
_NEVER = 1 << 62  # a step after every planned one (a prefetch with headroom evicts only what no plan reads)
NO_SIDECAR = ".noidx"  # marker: the source has no sidecar for this shard (a foreign tar)


class CacheLimitError(ShardError):
    """The byte budget cannot hold what is needed at once; ``needed_bytes`` says how much would."""

    def __init__(self, where: str, reason: str, needed_bytes: int):
        self.needed_bytes = int(needed_bytes)
        super().__init__(where, reason)

    def __reduce__(self):
        return (type(self), (self.shard, self.reason, self.needed_bytes))


class NoRoom(CacheLimitError):
    """A fetch with headroom found no room now (it does not wait: a prefetch is advice)."""


class Budget:
    """Accounting and eviction for one cache folder (any number of Budget objects may share it)."""

    def __init__(self, cache_dir: str, limit_bytes: int, wait_timeout_s: float, plan, count):
        self.cache_dir = cache_dir
        self.data_dir = os.path.join(cache_dir, "data")
        self.lock_dir = os.path.join(cache_dir, "locks")
        self.limit_bytes = limit_bytes
        self.wait_timeout_s = wait_timeout_s
        self._plan = plan  # () -> {key: next step}
        self._count = count  # (**counter deltas) -> None
        self._live: set[str] = set()  # temporaries this object made that may still be written to
        self._sizes: dict[str, tuple] = {}  # name -> (inode, size, blocks, mtime) of content-keyed files (_scan)
        self.block = block_size(cache_dir)
        self._files: dict[str, tuple] = {}  # path -> (inode, bytes) of finished metadata files (_folder_bytes)
        self._meta_now = 0  # metadata bytes at the last scan

    _after_listing = None  # tests: called between a scan's listing and its sizes (the rename race)

    def used_bytes(self) -> int:
        entries, tmp_bytes, _ = self._scan()
        return tmp_bytes + sum(b for b, _ in entries.values())

    def whole_bytes(self) -> int:
        """Budget bytes outside partial copies: whole shards, their sidecars, temporaries.
        Partial copies live in ranged_reads' reserve, so a whole shard is never admitted into
        room they hold only for a moment (it would evict what the plan reads next)."""
        total = 0
        with os.scandir(self.data_dir) as it:
            for e in it:
                if e.name.startswith(PARTIAL) and ".tmp-" not in e.name:
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                total += on_disk(st.st_size, st.st_blocks, self.block)
        return total

    def locked(self) -> FileLock:
        """The node-wide lock, for a rename into the budget's folders (``with budget.locked(): ...``)."""
        return FileLock(os.path.join(self.cache_dir, ".cache.lock"))

    def fixed_bytes(self, plans: bool = True) -> int:
        """Bytes of the budget that eviction cannot free: mirrored indexes and logs, lookahead plans."""
        return self._meta_bytes(("datasets", "lookahead") if plans else ("datasets",), settled=not plans)

    def _meta_bytes(self, tops=("datasets", "lookahead"), settled: bool = False) -> int:
        """Mirrored indexes and logs, lookahead plans: counted, never evicted
        (``settled``: without files being written now, the same on every rank), with the
        folders holding them and the cache's own folders (a folder takes blocks too)."""
        total = 0
        for d in (self.cache_dir, self.data_dir, self.lock_dir):
            try:
                total += os.lstat(d).st_blocks * 512
            except FileNotFoundError:
                pass
        for top in tops:
            # a folder kept by a running total (a mirrored log) is not listed: ledger.py
            total += ledger.tree_bytes(os.path.join(self.cache_dir, top), lambda d: self._folder_bytes(d, settled))
        return total


    def _folder_bytes(self, folder: str, settled: bool) -> int:
        """A metadata folder's own blocks and its files'. A finished file there (no ``.tmp`` in
        its name) appears by a rename and goes by an unlink, never changing while it has its
        name and inode, so its charge is remembered: a mirrored log of 10,000 entries is listed,
        not stat-ed again, at every fetch's scan."""
        try:
            total = os.lstat(folder).st_blocks * 512
            with os.scandir(folder) as it:
                listed = list(it)
        except FileNotFoundError:
            return 0
        for e in listed:
            name = e.name
            temp = ".tmp" in name
            if settled and temp:
                continue
            memo = None if temp else self._files.get(e.path)
            if memo is None or memo[0] != e.inode():
                try:
                    if e.is_dir(follow_symlinks=False):
                        continue
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                memo = (e.inode(), temp_bytes(name, st.st_size, st.st_blocks, self.block))
                if not temp:
                    self._files[e.path] = memo
            total += memo[1]
        return total

    def _scan(self, fresh: bool = False):
        """(complete entries: key -> (bytes, last used), in-flight and fixed bytes, temporaries by key).

        A file of a content-keyed entry (``h-<hash>``, its sidecar, a partial copy's sidecar)
        never changes size while it has its name and inode (it appears by a rename, goes by
        an unlink), so its size is remembered from the last scan rather than asked again:
        each range fetched scans the folder under the node's lock, and stat-ing every entry
        each time was most of a prefetch's cost. Partial copies (which grow and are punched),
        temporaries and other entries are stat-ed every time. ``fresh``: every file stat-ed
        (last use of the entries as it is now, for LRU eviction)."""
        entries: dict[str, list] = {}
        tmp_bytes, temps = self._meta_bytes(), []
        self._meta_now = tmp_bytes
        with os.scandir(self.data_dir) as it:
            listed = list(it)
        if self._after_listing is not None:
            self._after_listing()
        seen: dict[str, tuple] = {}
        for e in listed:
            name = e.name
            fixed = ".tmp-" not in name and (name.startswith("h-") or (name.startswith("r-h-") and "." in name))
            memo = self._sizes.get(name) if fixed and not fresh else None
            if memo is None or memo[0] != e.inode():
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                memo = (e.inode(), st.st_size, st.st_blocks, st.st_mtime)
            if fixed:
                seen[name] = memo
            _, size, blocks, mtime = memo
            key = name.split(".", 1)[0]
            if ".tmp-" in name:
                charged = temp_bytes(name, size, blocks, self.block)  # preallocated, or a reservation (sparse)
                tmp_bytes += charged
                temps.append((key, e.path, charged))
                continue
            rec = entries.setdefault(key, [0, 0.0])
            # a partial copy (ranged_reads.py) is sparse: count the disk it holds, not its size
            rec[0] += on_disk(size, blocks, self.block, sparse=name.startswith("r-") and "." not in name)
            if "." not in name:
                rec[1] = mtime
        self._sizes = seen
        return {k: (b, t) for k, (b, t) in entries.items()}, tmp_bytes, temps

    def make_room_and_create(self, key: str, suffix: str, size: int, url: str, folder: str | None = None,
                             headroom: int = 0, for_step: int | None = None, held=None, on_wait=None,
                             done=None, xattr: str | None = None, sparse: bool = False) -> str | None:
        """A new temporary for ``key`` of ``size`` bytes, within the budget; the
        caller holds ``key``'s fetch lock (or, with ``folder``, writes a
        metadata file there: ``<folder>/<key>.tmp-...``). Rename it into place
        under ``locked()``.

        A prefetch (a fetch nobody waits on) gets NoRoom at once rather than a
        wait, and evicts partial copies only, never a whole shard: with
        ``headroom``, bytes that must stay free beside it (what the readers may
        still need, ranged_reads.py), and only copies no plan reads; with
        ``for_step`` (the step the bytes are fetched for: the prefetcher's
        guaranteed window), copies whose next use is later than that step
        (Belady: the reader would evict the same ones to fetch it itself).

        A fetch that waits for room lets go of ``held`` (its fetch lock) during
        each wait and takes it again before the next try, and calls ``on_wait()``
        first (a reader's consumed samples not yet given back): a fetch waiting
        with its lock held kept others from punching consumed samples out of that
        copy, and two ranks at the start check's figure could each wait for room
        only those samples held (ranges.py). ``done()``: whether another process
        brought what this fetch is for while its lock was let go; then None, no
        temporary (the caller has nothing left to fetch).

        The room is charged in the disk's blocks: ``size`` rounded up, and a block
        more while it is a temporary for an extended attribute ``xattr`` the caller
        will set (its name ends in ATTR_MARK); once renamed, what it holds. ``sparse``: a
        reservation for bytes written into a partial copy (ranges.py), not a file of
        its own: no disk is allocated to it, and it holds the blocks those bytes
        may touch (one more than their size rounded: a range need not start on a block)."""
        data_size = size
        size = rounded(size, self.block) + (self.block if xattr or sparse else 0)
        if size > self.limit_bytes:
            raise CacheLimitError(url, f"shard of {size} bytes does not fit a cache limit of {self.limit_bytes} "
                                       f"bytes; raise limit_bytes to at least {size}", size)
        if folder is not None and self.fixed_bytes(plans=False) + size > self.limit_bytes:
            # metadata beside metadata that is never evicted: no wait can make this room
            raise CacheLimitError(url, f"{size} bytes of dataset metadata do not fit beside the "
                                       f"{self.fixed_bytes(plans=False)} bytes mirrored already in a cache limit of "
                                       f"{self.limit_bytes} bytes; raise limit_bytes", self.fixed_bytes(plans=False) + size)
        deadline = time.monotonic() + self.wait_timeout_s
        delay = 0.02
        while True:
            with FileLock(os.path.join(self.cache_dir, ".cache.lock")):
                entries, tmp_bytes, temps = self._scan()
                fixed = self._meta_now
                if fixed + size > self.limit_bytes:  # no eviction nor wait frees what is never evicted
                    raise CacheLimitError(url, f"{size:,} bytes (in the disk's blocks) do not fit beside the "
                                               f"{fixed:,} bytes of mirrored indexes, logs and plans in a cache "
                                               f"limit of {self.limit_bytes:,}; raise cache_limit_bytes to at "
                                               f"least {fixed + size:,}", fixed + size)
                tmp_bytes -= self._drop_orphans(temps, mine=key, shard_bytes=None if suffix else size)
                used = tmp_bytes + sum(b for b, _ in entries.values())
                advice = bool(headroom) or for_step is not None
                if used + size + headroom > self.limit_bytes and not advice:
                    entries, tmp_bytes, _ = self._scan(fresh=True)  # whole entries may go: their last use now
                    used = tmp_bytes + sum(b for b, _ in entries.values())
                if used + size + headroom > self.limit_bytes:
                    # a prefetch evicts only ranges read after the ones it brings: a whole shard, or a
                    # partial copy read sooner, it evicted would be fetched again (its sidecar with it)
                    after = None if not advice else for_step if for_step is not None else _NEVER
                    used -= self._evict(entries, used + size + headroom - self.limit_bytes, keep=key,
                                        only=PARTIAL if advice else "", after=after)
                if used + size + headroom <= self.limit_bytes:
                    tmp = os.path.join(folder or self.data_dir, f"{key}{suffix}.tmp-{os.getpid()}-"
                                                                 f"{uuid.uuid4().hex[:8]}{ATTR_MARK if xattr else ''}")
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                    try:
                        if sparse:
                            os.ftruncate(fd, size)  # a reservation: counted at its size, holding no disk
                        else:
                            _preallocate(fd, data_size, tmp, url)
                    except BaseException:
                        os.close(fd)
                        unlink_quiet(tmp)
                        raise
                    os.close(fd)
                    self._live = {p for p in self._live if os.path.exists(p)} | {tmp}
                    return tmp
            if advice:
                raise NoRoom(url, f"no room for {size} bytes beside the {headroom} kept for readers", size)
            if time.monotonic() > deadline:
                held = used
                raise CacheLimitError(url, f"cannot make room for {size} bytes in a cache limit of "
                                           f"{self.limit_bytes}: {held} bytes stay pinned or in flight after "
                                           f"{self.wait_timeout_s:.0f} s; raise limit_bytes to at least "
                                           f"{held + size}", held + size)
            t0 = time.monotonic()
            if held is not None:
                held.release()
            try:
                if on_wait is not None:
                    on_wait()
                time.sleep(delay)  # pinned entries are released as readers finish their shards
            finally:
                if held is not None:
                    held.acquire()
            self._count(wait_s=time.monotonic() - t0)
            if done is not None and done():
                return None
            delay = min(delay * 2, 0.5)

    def _drop_orphans(self, temps, mine: str, shard_bytes: int | None = None) -> int:
        """Remove temporaries whose fetcher died (nobody holds their fetch lock).
        The caller holds the fetch lock of ``mine`` and has no temporary of it
        yet, so one already there is a dead fetcher's (flock would not tell:
        the caller's own lock refuses the probe). ``mine``'s admission placeholder
        gives up ``shard_bytes`` when the shard's own fetch starts and keeps the
        rest (its sidecar's room, fetched next) until the sidecar's fetch starts."""
        freed = 0
        for key, path, size in temps:
            if path in self._live:
                continue  # this fetch's own shard temporary, while it writes a file beside it
            if key != mine and admission_held(path):
                continue  # room a live process admitted a whole shard into (ranged_reads.py), before its fetch
            if key == mine:
                if shard_bytes is not None and ADMIT in path and size > shard_bytes:
                    try:
                        os.truncate(path, size - shard_bytes)
                        os.utime(path)
                        freed += shard_bytes
                        continue
                    except OSError:
                        pass
                unlink_quiet(path)
                freed += size
                continue
            lock = FileLock(os.path.join(self.lock_dir, key + ".fetch"))
            if lock.acquire(blocking=False):
                try:
                    if os.path.exists(path):
                        unlink_quiet(path)
                        freed += size
                finally:
                    lock.release()
        return freed

    def _evict(self, entries, need: int, keep: str, only: str = "", after: int | None = None) -> int:
        """Evict up to ``need`` bytes of ``entries`` (prefixed ``only``) in victim order, skipping
        pinned ones; with ``after``, only entries no plan reads at or before step ``after``."""
        freed = 0
        plan = self._plan()
        for key in victim_order({k: v for k, v in entries.items() if k != keep and k.startswith(only)
                                 and (after is None or plan.get(k, _NEVER + 1) > after)}, plan):
            if freed >= need:
                break
            if not self.remove_unpinned(key):
                continue  # PINNED: a reader (in any process) holds it
            freed += entries[key][0]
            self._count(evictions=1)
        return freed

    def remove_unpinned(self, key: str) -> bool:
        """Remove entry ``key`` (its file, sidecar and locks) unless a reader pins it; whether it went."""
        pin = FileLock(os.path.join(self.lock_dir, key + ".pin"))
        if not pin.acquire(blocking=False):
            return False
        try:
            base = os.path.join(self.data_dir, key)
            # Every fetcher pins first, so with the pin held exclusively nobody is
            # inside the fetch lock either: its file can go too (FileLock re-checks
            # the inode, so a waiter on the old file retries on a new one).
            for p in (base, base + SIDECAR, base + NO_SIDECAR, os.path.join(self.lock_dir, key + ".fetch")):
                unlink_quiet(p)
            pin.unlink_locked()
        finally:
            pin.release()
        return True


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _preallocate(fd: int, size: int, path: str, url: str) -> None:
    """Give the temporary its full size now: the budget scan counts it, and a
    full disk fails here rather than mid-download. The error names the URL
    (what the user asked for) and the cache folder (what to fix)."""
    def full(e: OSError) -> ShardError:
        return ShardError(url, f"cannot reserve {size} bytes for it in the cache at {os.path.dirname(path)}: "
                               f"{e}; free space there, lower cache_limit_bytes or point cache_dir at a larger "
                               "disk (nothing was cached)")

    try:
        os.ftruncate(fd, size)
    except OSError as e:  # EFBIG: a file-size limit (ulimit -f) or the filesystem's own
        raise full(e) from e
    if size and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (95, 22):  # EOPNOTSUPP / EINVAL: filesystem without fallocate
                raise full(e) from e
