"""The table of open shards a BatchReader reads from: open on first use, LRU, pins.

A shard is opened the first time a batch needs it and stays open, least
recently used first out, while more than ``max_open`` are open. Each open tar
shard has a row of addresses in the slot table (``Slots``) that the jitted
gather reads (columns in kernels.py); the table starts small and doubles when
full, so neither it nor anything here is sized from the index, and the index
may grow (``update_index``: the old shards as a prefix, new ones after).

A shard in use is *pinned*: ``pin(s)``/``unpin(s)`` count holders, and
``holding(shards)`` pins for a ``with`` block. A pinned shard is never closed
by eviction (the LRU here, or a node-local cache asking ``is_pinned``); one
found damaged while pinned (``retire``) is never handed out again and closed
at its last ``unpin``. Only ``close()``, the end of the table's life, closes
pinned shards.

Where shards come from is the caller's: ``path_of(s)`` gives the local path
to open (a node-local cache fetches and pins its copy there) and
``release(s)`` is called once for each ``path_of`` when that shard's file is
closed or failed to open (the cache unpins it). ``forget(s)`` drops a shard's
view and bad mark so the next ``get`` asks ``path_of`` again (a damaged cached
copy that the cache refetched). formats knows nothing of the cache.

Lifecycle of a shard number: unopened -> open (in the LRU, maybe pinned) ->
closed by eviction, by the budget of decompressed bytes, or once the reads
have moved past it (``let_go``: compressed ones) (unopened again) | retired
as bad (never opened again).
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from shardfeed.formats.engine import decoded_budget
from shardfeed.formats.engine.kernels import (
    CSUM,
    FD,
    FID,
    KDATA,
    KLEN,
    KOFF,
    MSTART,
    NCOL,
    NMEM,
    NSAMP,
    OFF,
    SIZE,
    SRC,
    SRC_LEN,
)
from shardfeed.formats.errors import ShardError
from shardfeed.formats.key_blob import key_blob
from shardfeed.formats.readers import TarShardReader, open_shard

if TYPE_CHECKING:  # imported where a columnar shard is opened: a tar read never needs it
    from shardfeed.formats.engine.columns import ColumnarView

MAX_OPEN_SHARDS = 256  # default max_open: shards kept open between reads
INITIAL_SLOTS = 8  # rows of the slot table at first; it doubles when full


class TarView:
    """One open tar shard: its arrays, kept alive while its row of the slot table points at them."""

    def __init__(self, reader: TarShardReader, field_ids: dict):
        self.reader = reader
        self.path = reader.path
        t = reader.table
        self.src = np.frombuffer(reader.data, np.uint8)
        self.member_start = np.ascontiguousarray(t.member_start, np.int64)
        self.offset = np.ascontiguousarray(t.offset, np.int64)
        self.size = np.ascontiguousarray(t.size, np.int64)
        field_map = np.array([field_ids.setdefault(f, len(field_ids)) for f in t.fields], np.int64)
        self.fid = np.ascontiguousarray(field_map[t.member_field]) if len(t.offset) else np.zeros(0, np.int64)
        self.keys = t.keys
        # keys as one UTF-8 blob + offsets: the gather copies them next to the
        # payloads and the batch's keys come back with one decode and split
        # (a sidecar's keys are that blob already: no per-sample work, key_blob.py)
        self.key_data, self.key_off = key_blob(t.keys)
        if self.key_data.size and not self.key_data.all():
            raise ShardError(self.path, "a sample key contains a NUL byte (impossible in a tar name: corrupt sidecar)")
        self.checksum = np.ascontiguousarray(t.checksum, np.uint64)
        self.slot = -1
        # a mapped shard is read with preadv through its own descriptor: the
        # mapping's pages are never touched, so they never count in RSS
        self.fd = -1
        if isinstance(reader.data, mmap.mmap):
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            now = os.fstat(fd).st_size
            if now != self.src.size:
                os.close(fd)
                raise ShardError(self.path, f"shard changed size while opened ({self.src.size} -> {now} bytes)")
            self.fd = fd

    def row(self) -> np.ndarray:
        """This shard's row of the slot table."""
        def addr(a):
            return a.ctypes.data if a.size else 0
        row = np.zeros(NCOL, np.int64)
        row[SRC], row[SRC_LEN] = addr(self.src), self.src.size
        row[MSTART], row[NSAMP] = addr(self.member_start), len(self.member_start) - 1
        row[OFF], row[SIZE], row[FID], row[NMEM] = addr(self.offset), addr(self.size), addr(self.fid), self.offset.size
        row[KOFF], row[KDATA], row[KLEN] = addr(self.key_off), addr(self.key_data), self.key_data.size
        row[CSUM], row[FD] = addr(self.checksum), self.fd
        return row

    def short(self) -> bool:
        """Whether the file is now shorter than its mapping (truncated while open):
        copying from the mapping past its end would raise SIGBUS."""
        return self.fd >= 0 and os.fstat(self.fd).st_size < self.src.size

    def release_pages(self) -> None:
        if isinstance(self.reader.data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            self.reader.data.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.src = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.reader.close()


class Slots:
    """The slot table: one row of addresses per open tar shard (see kernels.tar_gather).

    Starts at ``capacity`` rows and doubles when full; ``table`` is then a new
    array, so read it after the shards of a batch are open."""

    def __init__(self, capacity: int = INITIAL_SLOTS):
        self.table = np.zeros((max(capacity, 1), NCOL), np.int64)
        self.free = list(range(len(self.table)))[::-1]

    def add(self, view: TarView) -> None:
        if not self.free:
            grown = np.zeros((2 * len(self.table), NCOL), np.int64)
            grown[:len(self.table)] = self.table
            self.free = list(range(len(grown) - 1, len(self.table) - 1, -1))
            self.table = grown
        view.slot = self.free.pop()
        self.table[view.slot] = view.row()

    def remove(self, view: TarView) -> None:
        if view.slot >= 0:
            self.table[view.slot] = 0
            self.free.append(view.slot)
            view.slot = -1


class OpenShards:
    """Open shards of ``index`` by shard number (see the module docstring).

    ``path_of`` maps a shard number to a local path (a cache may supply one)
    and ``release`` is told when that path is no longer open (see the module
    docstring); ``field_ids`` (shared with the reader) numbers the fields of every shard
    opened, in the order first seen.
    """

    def __init__(self, index, verify: bool = True, max_open: int = MAX_OPEN_SHARDS,
                 path_of: Callable[[int], str] | None = None, field_ids: dict | None = None,
                 release: Callable[[int], None] | None = None):
        self.index = index
        self.release = release
        self.verify = verify
        self.max_open = max_open
        self.path_of = path_of
        self.field_ids = {} if field_ids is None else field_ids
        self.views: OrderedDict[int, TarView | ColumnarView] = OrderedDict()  # least recently used first
        self.slots = Slots()
        self._pins: dict[int, int] = {}  # shard -> holders
        self._retired: dict[int, TarView | ColumnarView] = {}  # bad but pinned: closed at the last unpin
        self._bad: dict[int, str] = {}  # shards found unreadable: reason
        self._touched: set[int] = set()  # tar shards read from since release_pages
        # open shards the next batches read: a guess's room (decompress_thread.want) never closes them
        self.keep: frozenset[int] = frozenset()
        # slot of each open tar shard by shard number (-1: not an open tar view):
        # lets a batch whose shards are all open find its slots in one numpy call
        self.slot_of = np.full(len(index), -1, np.int64)
        decoded_budget.add_reclaimer(self.reclaim)

    @property
    def table(self) -> np.ndarray:
        return self.slots.table

    def update_index(self, index) -> None:
        """Read from ``index`` from now on: the same shards as the current one
        first (same names, sample counts and hashes, so open shards and sample
        ids stay valid), then any new ones."""
        old = self.index
        n = len(old)
        if len(index) < n or list(index.names[:n]) != list(old.names) or list(index.hashes[:n]) != list(old.hashes) \
                or not np.array_equal(np.asarray(index.counts[:n]), np.asarray(old.counts)):
            raise ValueError(f"the new index ({len(index)} shards) does not start with the {n} shards of the "
                             "current one (same names, sample counts and hashes): a grown index only adds shards "
                             "after the old ones; open a new BatchReader for a different dataset")
        self.index = index
        if len(index) > len(self.slot_of):
            self.slot_of = np.concatenate([self.slot_of, np.full(len(index) - len(self.slot_of), -1, np.int64)])

    # -- open, pin, close -------------------------------------------------
    def get(self, s: int) -> TarView | ColumnarView:
        """Shard ``s``'s view, opened if it is not; ShardError if it cannot be (or was found bad)."""
        v = self.views.get(s)
        if v is not None:
            self.views.move_to_end(s)
            return v
        if s in self._bad:
            raise ShardError(self.index.path(s), self._bad[s])
        path = self.path_of(s) if self.path_of else None
        try:
            try:
                reader = open_shard(self.index, s, path=path, verify=self.verify)
            except ShardError as e:
                self._bad[s] = e.reason
                raise
            if isinstance(reader, TarShardReader):
                try:
                    v = TarView(reader, self.field_ids)
                except BaseException:
                    reader.close()
                    raise
                self.slots.add(v)
            else:
                from shardfeed.formats.engine.columns import ColumnarView  # Parquet/Arrow only (issue #24)

                v = ColumnarView(reader)
        except BaseException:
            if path is not None and self.release is not None:
                self.release(s)
            raise
        self.views[s] = v
        if isinstance(v, TarView):
            self.slot_of[s] = v.slot
        return v

    def _pop_view(self, s: int):
        self.slot_of[s] = -1
        return self.views.pop(s, None)

    def use(self, shards: list) -> None:
        """Mark open shards as just used (LRU order, pages touched), as ``get`` does."""
        deque(map(self.views.move_to_end, shards), 0)
        self._touched.update(shards)

    def pin(self, s: int) -> TarView | ColumnarView:
        """Shard ``s``'s view, opened if need be, held open until as many ``unpin(s)``."""
        v = self.get(s)
        self._pins[s] = self._pins.get(s, 0) + 1
        return v

    def unpin(self, s: int) -> None:
        n = self._pins.get(s, 0)
        if n <= 0:
            raise ValueError(f"unpin({s}): shard {s} is not pinned (every unpin must follow a pin)")
        if n > 1:
            self._pins[s] = n - 1
            return
        del self._pins[s]
        v = self._retired.pop(s, None)
        if v is not None:
            self._close(s, v)

    def is_pinned(self, s: int) -> bool:
        """Whether shard ``s`` is held: a cache must not evict its file."""
        return s in self._pins

    def pinned(self) -> frozenset[int]:
        return frozenset(self._pins)

    @contextmanager
    def holding(self, shards: Iterable[int]) -> Iterator[list]:
        """Pin ``shards`` for a ``with`` block; yields their views."""
        held = []
        try:
            views = []
            for s in shards:
                views.append(self.pin(s))
                held.append(s)
            yield views
        finally:
            for s in held:
                self.unpin(s)

    def retire(self, s: int, reason: str) -> None:
        """Shard ``s`` is unreadable (``reason``): never handed out again; closed
        now, or at its last unpin if it is pinned."""
        self._bad[s] = reason
        self._drop_view(s)

    def forget(self, s: int) -> None:
        """Forget shard ``s``'s open view and bad mark: the next ``get`` opens it
        again through ``path_of`` (its copy was replaced). A pinned view is
        closed at its last ``unpin``."""
        self._bad.pop(s, None)
        self._drop_view(s)

    def _drop_view(self, s: int) -> None:
        # a pinned view stays usable by its holder and is closed at its last unpin
        v = self._pop_view(s)
        if v is None:
            return
        if s in self._pins:
            self._retired[s] = v
        else:
            self._close(s, v)

    def reclaim(self, nbytes: int) -> None:
        """Close least recently used unpinned compressed shards until about
        ``nbytes`` of decompressed memory is free (decoded_budget.py's budget)."""
        for s in [s for s, v in self.views.items() if s not in self._pins and s not in self.keep
                  and isinstance(v, TarView) and v.reader.budget_bytes]:
            if nbytes <= 0:
                return
            nbytes -= self.views[s].reader.budget_bytes
            self._close(s, self._pop_view(s))

    def let_go(self, needed: set) -> None:
        """Close the unpinned compressed shards (held decompressed in memory)
        that ``needed``, the shards of the next reads, leaves out: the read has
        moved on, and memory would otherwise grow with every shard read until
        the budget's limit (decoded_budget.py)."""
        for s in [s for s, v in self.views.items() if s not in self._pins and s not in needed
                  and isinstance(v, TarView) and v.reader.budget_bytes]:
            self._close(s, self._pop_view(s))

    def evict(self) -> None:
        """Close the least recently used unpinned shards while more than ``max_open`` are open."""
        excess = len(self.views) - self.max_open
        if excess <= 0:
            return
        for s in [s for s in self.views if s not in self._pins][:excess]:
            self._close(s, self._pop_view(s))

    def close_idle(self) -> None:
        """Close every open shard no read holds now (a node-local cache waiting for room asks:
        their pins would hold it); they open again when a read needs them."""
        for s in [s for s in self.views if s not in self._pins and s not in self.keep]:
            self._close(s, self._pop_view(s))

    def _close(self, s: int, v) -> None:
        if isinstance(v, TarView):
            self.slots.remove(v)
            self._touched.discard(s)
        try:
            v.close()
        finally:
            if self.path_of is not None and self.release is not None:
                self.release(s)

    def close(self) -> None:
        """Close every shard, pinned or not: the end of the table's use (safe to call twice;
        a later ``get`` opens shards again)."""
        self._pins.clear()
        while self._retired:
            self._close(*self._retired.popitem())
        self.slot_of[:] = -1
        while self.views:
            self._close(*self.views.popitem())

    # -- mapped pages -------------------------------------------------------
    def touch(self, s: int) -> None:
        self._touched.add(s)

    def release_pages(self) -> None:
        """Unmap the pages of the tar shards read since the last call (the page cache keeps them)."""
        for s in self._touched:
            v = self.views.get(s)
            if isinstance(v, TarView):
                v.release_pages()
        self._touched.clear()

    def checksums(self, t_slot: np.ndarray, t_local: np.ndarray) -> np.ndarray:
        """The sidecar checksums of samples ``t_local`` of the tar shards in slots ``t_slot``."""
        by_slot = {v.slot: v for v in list(self.views.values()) + list(self._retired.values())
                   if isinstance(v, TarView)}
        return np.array([by_slot[s].checksum[i] for s, i in zip(t_slot.tolist(), t_local.tolist())], np.uint64)
