"""Sample ranges: the bytes of the samples a plan reads, without their whole shard.

A shard the cache does not hold whole can be read a few samples at a time:
its sidecar gives each sample's members' byte ranges and an xxh3 checksum of
their payloads. The samples of one shard needed together are coalesced into
as few ranges as the cost model's gap allows (cost_model.py), each range is
one ranged GET, and every sample in it is checked against its checksum
before one byte of it is written where a reader can see it: a damaged or
changed range is refused (ShardError naming the shard), never delivered.

Where the bytes live: a *partial copy* ``data/r-<key>``, a sparse file of
the shard's full size holding only the ranges fetched (holes elsewhere take
no disk), with the shard's sidecar beside it (``data/r-<key>.idx``). A
reader opens it like any cached shard (same offsets, same checks on read:
a hole reads as zeros and fails its checksum, so it is never data). The
budget counts a partial copy by the disk blocks it holds, not its size.
Samples a reader has consumed are given back with ``punch`` (the blocks
only they cover become holes again), so a partial copy holds what the plan
reads next, not what it read; samples another reader claimed stay (locks.py).

Locks as for whole shards (store.py): a fetch pins the partial copy
(``locks/r-<key>.pin``, shared) and then takes its fetch lock, so the
evictor, which needs the pin exclusively, never removes a copy being
written. Room for one fetch's ranges comes first, for all of them (the
budget's, evicting by the lookahead if needed, or a lease's: range_room.py),
dropped once they are in the copy; then they go out side by side.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import uuid

import numpy as np

from shardfeed.cache.fetching.fetch import Cancelled, with_retries
from shardfeed.cache.fetching.url_sources import open_source
from shardfeed.cache.sample_ranges.consumed import Consumed
from shardfeed.cache.sample_ranges.range_room import Leases, drain, requests
from shardfeed.cache.storage.budget import SIDECAR, unlink_quiet
from shardfeed.cache.storage.locks import FileLock, acquire_timed, free_slots
from shardfeed.formats import ShardError
from shardfeed.formats.own_tables import read_sidecar
from shardfeed.formats.sidecar import sample_checksum

PREFIX = "r-"
_BLOCK = 4096
_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
_SIDECAR_BASE, _SIDECAR_PER_SAMPLE = 2 << 10, 384  # one GET of this much holds most sidecars (~300 bytes a sample)


def partial_key(key: str) -> str:
    return PREFIX + key


def spans(table, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) in the shard of samples ``local``: first member's payload to last member's end."""
    local = np.asarray(local, np.int64)
    ms = table.member_start
    first, last = ms[local], ms[local + 1] - 1
    empty = last < first
    start = np.where(empty, 0, table.offset[np.maximum(first, 0)])
    end = np.where(empty, 0, table.offset[np.maximum(last, 0)] + table.size[np.maximum(last, 0)])
    return start.astype(np.int64), end.astype(np.int64)


def coalesce(start: np.ndarray, end: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """Ranges covering every ``[start, end)``, two merged when at most ``gap`` bytes apart."""
    keep = end > start
    if not keep.any():
        return []
    order = np.argsort(start[keep], kind="stable")
    s, e = start[keep][order].tolist(), end[keep][order].tolist()
    out = [[s[0], e[0]]]
    for a, b in zip(s[1:], e[1:]):
        if a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def sample_ok(buf, base: int, table, i: int) -> bool:
    """Whether sample ``i``'s payloads in ``buf`` (which holds the shard from byte ``base``) match its checksum."""
    lo, hi = int(table.member_start[i]), int(table.member_start[i + 1])
    mv = memoryview(buf)
    parts = [mv[int(o) - base:int(o) - base + int(n)] for o, n in zip(table.offset[lo:hi], table.size[lo:hi])]
    return sample_checksum(parts) == int(table.checksum[i])


_libc = None


def punch(fd: int, start: int, end: int) -> None:
    """Give back the disk blocks lying wholly inside ``[start, end)`` (a hole reads as zeros)."""
    global _libc
    a, b = -(-start // _BLOCK) * _BLOCK, end // _BLOCK * _BLOCK
    if b <= a:
        return
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.fallocate(fd, _FALLOC_PUNCH, a, b - a)  # a filesystem without holes keeps the blocks: only disk lost


class RangeFetcher:
    """Fetches sample ranges of shards into partial copies in ``cache`` (a ShardCache)."""

    def __init__(self, cache, cost, on_sidecar=None):
        self.cache = cache
        self.cost = cost
        self.on_sidecar = on_sidecar  # (sidecar bytes, shard bytes) of each sidecar fetched
        self._tables: dict[str, tuple] = {}  # sidecar path -> (mtime_ns, size, table)
        self.consumed = Consumed()  # what this process's readers read and may have punched (consumed.py)
        self._mu = threading.Lock()
        self.room = Leases(cache)  # room for a prefetch's small fetches, taken ahead (range_room.py)
        self.counters = {"range_requests": 0, "range_bytes": 0, "sidecar_requests": 0, "samples_fetched": 0,
                         "samples_present": 0}

    def _count(self, **delta) -> None:
        with self._mu:
            for k, v in delta.items():
                self.counters[k] += v

    def _asked(self, fn):
        """``fn`` counted in the cache's ``requests`` (stats(), the Loader's) at every try: a
        range or sidecar GET is a request to the source like a whole shard's."""
        def attempt():
            self.cache._add(requests=1)
            return fn()
        return attempt

    def path(self, ref) -> str:
        return os.path.join(self.cache.data_dir, partial_key(self.cache.key_for(ref.url, ref.hash, ref.version)))

    def drop_superseded(self, ref) -> bool:
        """Remove ``ref``'s partial copy once its whole copy is here and nobody pins it (it
        holds budget the whole copy already covers); whether it went."""
        path = self.path(ref)
        if not os.path.exists(path) or not self.cache.contains(ref.url, ref.hash, ref.version):
            return False
        return self.cache.budget.remove_unpinned(os.path.basename(path))

    def discard(self, ref) -> None:
        """Remove ``ref``'s partial copy and its sidecar (found damaged; the next fetch starts afresh)."""
        path = self.path(ref)
        with FileLock(os.path.join(self.cache.lock_dir, os.path.basename(path) + ".fetch")):
            for p in (path, path + SIDECAR):
                unlink_quiet(p)

    def pin(self, ref) -> FileLock:
        """A shared pin on ``ref``'s partial copy (release it when done)."""
        name = partial_key(self.cache.key_for(ref.url, ref.hash, ref.version))
        pin = FileLock(os.path.join(self.cache.lock_dir, name + ".pin"))
        self.cache._add(wait_s=acquire_timed(pin, shared=True))
        return pin

    def table(self, ref, path: str, count: int, headroom: int = 0, for_step: int | None = None, held=None,
              on_wait=None):
        """The partial copy's sidecar table (fetched and checked if not here yet); caller holds the fetch
        lock (``held``, let go while the fetch waits for room: Budget.make_room_and_create)."""
        side = path + SIDECAR
        if not os.path.exists(side):
            self._fetch_sidecar(ref, side, count, headroom, for_step, held, on_wait)
        st = os.stat(side)
        memo = self._tables.get(side)
        if memo is not None and memo[:2] == (st.st_mtime_ns, st.st_size):
            return memo[2]
        table, meta = read_sidecar(side, ref.url)
        if meta["shard_bytes"] != ref.size or (ref.hash and meta.get("shard_hash") not in (None, "", ref.hash)):
            unlink_quiet(side)
            raise ShardError(ref.url, f"sidecar describes a shard of {meta['shard_bytes']} bytes (hash "
                                      f"{meta.get('shard_hash')}) but the index says {ref.size} ({ref.hash}): stale "
                                      "sidecar; nothing was read from it")
        table.validate(ref.url, int(ref.size))
        if len(table) != count:
            unlink_quiet(side)
            raise ShardError(ref.url, f"sidecar lists {len(table)} samples but the index says {count}")
        self._tables[side] = (st.st_mtime_ns, st.st_size, table)
        return table

    def _fetch_sidecar(self, ref, side: str, count: int, headroom: int = 0, for_step: int | None = None,
                       held=None, on_wait=None) -> None:
        opts = self.cache.fetch_options
        src = open_source(ref.url + SIDECAR, self.cache.storage_options, opts.stall_s)
        want = _SIDECAR_BASE + _SIDECAR_PER_SAMPLE * int(count)
        key = os.path.basename(side).split(".", 1)[0]
        room = dict(headroom=headroom, for_step=for_step, held=held, on_wait=on_wait)
        # a prefetch's sidecar draws its room from the lease its ranges draw from (range_room.py): one room
        # made per sidecar was a folder scan for each of the ~700 a warm epoch of bench remote fetches
        lease = self.room.draw(want, src.url, headroom, for_step)
        if lease is None:
            tmp = self.cache.budget.make_room_and_create(key, SIDECAR, want, src.url, **room)
        else:
            tmp = os.path.join(self.cache.data_dir, f"{key}{SIDECAR}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            except BaseException:
                self.room.landed(lease)
                raise
        try:
            t0 = time.monotonic()
            data = with_retries(src.url, "reading it",
                                self._asked(lambda: src.read_head(want, lambda: self.cache._add(requests=1))), opts)
            self.cost.observe(len(data), time.monotonic() - t0)
            self._count(sidecar_requests=1)
            self.cache._add(bytes_fetched=len(data))
            if len(data) >= want:  # larger than guessed: its size, then all of it
                size = with_retries(src.url, "asking its size", self._asked(src.size), opts)
                if size > 64 * want:
                    raise ShardError(src.url, f"sidecar claims {size} bytes for {count} samples (corrupt)")
                unlink_quiet(tmp)
                tmp = self.cache.budget.make_room_and_create(key, SIDECAR, size, src.url, **room)
                data = with_retries(src.url, "reading it", self._asked(lambda: src.read_range(0, size)), opts)
                self._count(sidecar_requests=2)
                self.cache._add(bytes_fetched=len(data))
            with open(tmp, "r+b") as f:
                f.write(data)
                f.truncate(len(data))
            read_sidecar(tmp, ref.url)  # its own digest, before it is published
            if self.on_sidecar is not None:
                self.on_sidecar(len(data), int(ref.size), ref.url)
            os.rename(tmp, side)
        except BaseException:
            unlink_quiet(tmp)
            raise
        finally:
            if lease is not None:
                self.room.landed(lease)

    def ensure(self, ref, local, count: int, cancel=None, headroom: int = 0,
               for_step: int | None = None, on_wait=None) -> tuple[int, int]:
        """Samples ``local`` of shard ``ref`` (of ``count`` samples) present and checked in its
        partial copy; the caller holds its pin. Returns (samples found there, samples fetched).
        ``headroom``, ``for_step``: a prefetch's terms (Budget.make_room_and_create: NoRoom, not a wait);
        with ``for_step``, samples this process's readers read at that step are left out (consumed.py);
        ``on_wait()``: called while the fetch waits for room, its fetch lock let go."""
        path = self.path(ref)
        local = np.unique(np.asarray(local, np.int64))
        if self._all_present(ref, path, local):  # no lock: a fetch of other samples may be running
            self._count(samples_present=len(local))
            return len(local), 0
        lock = FileLock(os.path.join(self.cache.lock_dir, os.path.basename(path) + ".fetch"))
        self.cache._add(wait_s=acquire_timed(lock))
        try:
            table = self.table(ref, path, count, headroom, for_step, lock, on_wait)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if os.fstat(fd).st_size != ref.size:
                    os.ftruncate(fd, int(ref.size))  # new: all holes, no disk used
                local = np.unique(np.asarray(local, np.int64))
                if for_step is not None:  # a prefetch: what the readers read at that step is not wanted again
                    local = local[~self.consumed.at(for_step, ref.url, local)]
                missing = [i for i in local.tolist() if not self._present(fd, table, i)]
                self._count(samples_present=len(local) - len(missing))
                if missing:
                    self._fetch(ref, fd, table, np.asarray(missing, np.int64), cancel, headroom, for_step, lock,
                                on_wait)
                    self._count(samples_fetched=len(missing))
            finally:
                os.close(fd)
        finally:
            lock.release()
        return len(local) - len(missing), len(missing)

    def present(self, ref, local) -> bool:
        """Whether samples ``local`` of ``ref`` are all in its partial copy and checked, without a
        lock (False when unsure: ``ensure`` decides under the lock); the caller holds the pin."""
        return self._all_present(ref, self.path(ref), np.unique(np.asarray(local, np.int64)))

    def _all_present(self, ref, path: str, local) -> bool:
        """Whether every sample of ``local`` is in the copy and checked (caller holds the pin)."""
        memo = self._tables.get(path + SIDECAR)
        if memo is None:
            return False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            st = os.stat(path + SIDECAR)
            if memo[:2] != (st.st_mtime_ns, st.st_size):
                return False
            return all(self._present(fd, memo[2], i) for i in local.tolist())
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    def _present(self, fd: int, table, i: int) -> bool:
        s, e = spans(table, np.array([i]))
        if e[0] <= s[0]:
            return True
        buf = os.pread(fd, int(e[0] - s[0]), int(s[0]))
        return len(buf) == e[0] - s[0] and sample_ok(buf, int(s[0]), table, i)

    def _fetch(self, ref, fd: int, table, missing: np.ndarray, cancel, headroom: int = 0,
               for_step: int | None = None, held=None, on_wait=None) -> None:
        """The coalesced ranges of ``missing``, all in flight at once, in room made first for all of them."""
        opts = self.cache.fetch_options
        src = open_source(ref.url, self.cache.storage_options, opts.stall_s)
        start, end = spans(table, missing)
        key = partial_key(self.cache.key_for(ref.url, ref.hash, ref.version))
        ranges = coalesce(start, end, self.cost.gap_bytes())
        if cancel is not None and cancel.is_set():
            raise Cancelled(ref.url)
        size = sum(b - a for a, b in ranges)
        lease = self.room.draw(size, ref.url, headroom, for_step)
        tmp = None if lease is not None else self.cache.budget.make_room_and_create(
            key, "", size, ref.url, headroom=headroom, for_step=for_step, held=held, on_wait=on_wait,
            sparse=True)  # room in the partial copy
        try:
            if src.ignores_range():  # one read of the whole object serves every range (any HTTP server works)
                opts = self.cache.fetch_options
                datas = with_retries(ref.url, "reading the whole object (its server ignores Range)",
                                     self._asked(lambda: src.read_ranges(ranges)), opts)
                self.cache._add(bytes_fetched=int(ref.size) - size)  # the rest of the body, read and dropped
                for (a, b), data in zip(ranges, datas):
                    self._put(ref, fd, table, missing, start, end, a, b, data)
                return
            if len(ranges) == 1:  # nothing to overlap: no hand-over to the pool
                self._get(ref, src, fd, table, missing, start, end, *ranges[0])
                return
            drain([requests().submit(self._get, ref, src, fd, table, missing, start, end, a, b)
                    for a, b in ranges])
        finally:
            if lease is not None:
                self.room.landed(lease)
            else:
                unlink_quiet(tmp)

    def _get(self, ref, src, fd: int, table, missing, start, end, a: int, b: int) -> None:
        """One range request for bytes ``[a, b)`` of ``ref`` (retried), then ``_put``."""
        opts = self.cache.fetch_options
        t0 = time.monotonic()
        data = with_retries(ref.url, f"reading bytes {a}-{b - 1}",
                            self._asked(lambda: src.read_range(a, b)), opts)
        self.cost.observe(len(data), time.monotonic() - t0)
        self._put(ref, fd, table, missing, start, end, a, b, data)

    def _put(self, ref, fd: int, table, missing, start, end, a: int, b: int, data: bytes) -> None:
        """Fetched bytes ``[a, b)`` of ``ref`` into the copy ``fd``, each sample in them checked first."""
        self._count(range_requests=1, range_bytes=len(data))
        self.cache._add(bytes_fetched=len(data))
        inside = missing[(start >= a) & (end <= b)]
        for i in inside.tolist():
            if not sample_ok(data, a, table, i):
                raise ShardError(ref.url, f"sample {i} ({table.keys[i]!r}) fails its checksum in bytes "
                                          f"{a}-{b - 1} fetched from the source (changed or damaged there); "
                                          "nothing of it was delivered")
        view = memoryview(data)
        while view:
            view = view[os.pwrite(fd, view, b - len(view)):]

    def punch(self, ref, table, local) -> bool:
        """Samples ``local`` were consumed: give back every block that holds no other
        sample present in the copy (see the module docstring). Under the copy's
        fetch lock, so no range is written between the check and the punch. False when a
        fetch holds that lock (never waited for: it may be waiting for room this caller's pins
        hold); the caller tries again later."""
        path = self.path(ref)
        lock = FileLock(os.path.join(self.cache.lock_dir, os.path.basename(path) + ".fetch"))
        if not lock.acquire(blocking=False):
            return False
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                return True
            try:
                pin = os.path.join(self.cache.lock_dir, os.path.basename(path) + ".pin")
                with free_slots(pin, np.unique(np.asarray(local, np.int64)).tolist()) as free:
                    self._punch(fd, table, np.asarray(free, np.int64))
            finally:
                os.close(fd)
        finally:
            lock.release()
        return True

    def punch_consumed(self, ref, local) -> bool:
        """``punch`` with the copy's known table (nothing to give back without one: nothing was fetched here)."""
        memo = self._tables.get(self.path(ref) + SIDECAR)
        return memo is None or self.punch(ref, memo[2], local)

    def _punch(self, fd: int, table, consumed: np.ndarray) -> None:
        every = np.arange(len(table), dtype=np.int64)
        s_all, e_all = spans(table, every)
        gone = np.zeros(len(table), np.bool_)
        gone[consumed] = True
        for i in consumed.tolist():
            a = int(s_all[i]) // _BLOCK * _BLOCK
            b = -(-int(e_all[i]) // _BLOCK) * _BLOCK
            # a block shared with a sample still present (not consumed) stays
            near = np.flatnonzero((s_all < b) & (e_all > a) & ~gone)
            for j in near.tolist():
                if self._present(fd, table, j):
                    if s_all[j] < a + _BLOCK:
                        a += _BLOCK
                    if e_all[j] > b - _BLOCK:
                        b -= _BLOCK
                else:
                    gone[j] = True  # absent: its bytes there are not data
            if b > a:
                punch(fd, a, b)
