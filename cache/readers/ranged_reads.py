"""Readers' shards through the cache, whole or as the sample ranges a batch needs.

``RangePolicy`` decides, per shard and per batch (or prefetch), how a miss
is fetched (cost_model.py for the cost):

1. Admission: while the budget has room for the whole shard beyond a
   reserve (partial copies and sidecars of the shards it cannot hold), the
   whole shard is fetched: it serves every later read of it, this epoch
   and the next ones, and is the only way what the cache holds grows.
2. Dense reuse: when the samples needed soon are at least half the shard
   (stored, shard and block orders), the whole shard.
3. Otherwise the cheaper of: the whole shard, which also displaces as many
   cached bytes that will be read again (``cost(1, size) + size / bw``), and
   the coalesced ranges of the samples needed (``cost(ranges, bytes)``).

Only plain (uncompressed) tar shards with sidecars have sample ranges;
others are always whole. Ranges are on by default for the global order when
samples average at least a disk block (``RANGE_MIN_SAMPLE_BYTES``: below it a
sample's range holds more budget in blocks than its own bytes, and its request
moves less than a block); ``SHARDFEED_CACHE_RANGES=0`` turns them off, ``=1``
forces them for any sample size. Once a shard is open as a partial copy, its later
batches keep reading that copy until the reader closes it.

``RangedShards`` is CachedShards with ``prepare(ids)`` / ``finish(token)``
around each batch read: prepare fetches the batch's ranges (pinned until
finish; the shards the prefetcher did not bring all at once, late_ranges.py)
and counts hits and misses per shard of the batch; ``path_of`` then
hands out the partial copy. Consumed samples are punched out of the copy at
finish when the order reads each sample once per epoch.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from shardfeed.cache.readers.reads import CachedShards
from shardfeed.cache.sample_ranges import cost_model as cm
from shardfeed.cache.sample_ranges.cost_model import RANGE_MIN_SAMPLE_BYTES, CostModel, range_reserve, range_working
from shardfeed.cache.sample_ranges.late_ranges import ensure_all
from shardfeed.cache.sample_ranges.ranges import RangeFetcher, coalesce, spans
from shardfeed.cache.storage.eviction import plan_bytes
from shardfeed.cache.storage.store import ShardRef

WHOLE, RANGES = "whole", "ranges"
# SHARDFEED_CACHE_RANGES: "0" whole shards only, "1" ranges whatever the sample size, unset: use_ranges decides
ENABLED: bool | None = {"0": False, "1": True}.get(os.environ.get("SHARDFEED_CACHE_RANGES", "").strip())
SIDECAR_SHARE = 0.03  # sidecar bytes per shard byte assumed where none was measured (shardfeed plan)
NEAR_STEPS = 2  # steps (the current one first) a rank's prefetcher brings ahead as ranges
# a rank's prefetch threads, one shard each (its ranges then go out side by side, range_room.RANGE_REQUESTS): a
# request is a round trip, not bandwidth; with 4, at most 8 requests were in flight and a warm epoch at 20 ms
# a request took the round trips' sum (bench remote: 98.7% of it waiting)
RANGE_THREADS = 32
RANGED_MAX_OPEN = 64  # whole shards a ranged reader keeps open between reads (its partial copies: none, see finish)
# a budget scan lists the cache folder (about 1 ms at 1,500 entries): its answer is reused this long; at 20 ms,
# 3,700 scans a warm epoch were most of the CPU of bench remote's 4,300 range requests
_USED_TTL_S = 0.1

_policies: dict[tuple, RangePolicy] = {}
_mu = threading.Lock()


def rangeable(index, i: int) -> bool:
    return index.formats[i] == "tar" and i not in index.tables


def use_ranges(index) -> bool:
    """Whether misses of ``index``'s shards may come as sample ranges (see the module docstring);
    a pure function of the index, so the main process and every worker agree."""
    if ENABLED is not None:
        return ENABLED
    n = int(index.num_samples)
    return n > 0 and int(np.asarray(index.sizes).sum()) / n >= RANGE_MIN_SAMPLE_BYTES


class RangePolicy:
    """Whole shard or sample ranges, per miss (see the module docstring); one per process and cache."""

    def __init__(self, cache, total_bytes: int, samples: int = 1, sidecar_bytes: int | None = None,
                 total_blocks: int | None = None):
        self.cache = cache
        self.total_blocks = total_bytes if total_blocks is None else total_blocks  # the shards in the disk's blocks
        self.samples = max(1, int(samples))
        self.cost = CostModel()
        self.fetcher = RangeFetcher(cache, self.cost, self.observe_sidecar)
        self.total_bytes = total_bytes
        self._seen_sidecars: dict[str, tuple[int, int]] = {}  # url -> (sidecar bytes, shard bytes)
        self.sidecar_share = SIDECAR_SHARE
        self._sidecars_est = sidecar_bytes  # the index's upper estimate, in blocks, until one is measured
        self.working = 0  # bytes the node's ranges pin at once at worst (working_set)
        self.fixed = 0  # bytes eviction cannot free (mirrored index, plans)
        self.meta = 0  # of them, all but the plans: a cache that holds every shard publishes no plan
        self.shards = 0  # the dataset's shards (their names grow the cache's folders: cost_model.folder_growth)
        self.expected = 0  # bytes the node's ranges hold on average (cost_model.expected_working)
        self.headroom = 0  # bytes a prefetch leaves free: what the readers' batches may still need
        self.batch, self.held = 0, 0  # samples a step, batches the node's ranges hold at once (working_set)
        self.window_bytes = 0  # what a rank's prefetcher may hold for the steps after the readers' next
        self.sample_blocks, self.ranks = cm.BLOCK, 1  # most budget bytes of a sample's range; the node's ranks
        self._sized()
        self._used = (-_USED_TTL_S, 0)
        self._scanning = threading.Lock()
        self.decisions = {WHOLE: 0, RANGES: 0}

    def _sized(self) -> None:
        # the reserve holds what ranges pin at worst (working_set) and what eviction cannot free
        limit, total = self.cache.limit_bytes, self.total_bytes
        seen = list(self._seen_sidecars.values())
        sidecars = total * sum(cm.rounded_blocks(a) for a, _ in seen) / max(1, sum(b for _, b in seen)) if seen \
            else self._sidecars_est if self._sidecars_est is not None else total * self.sidecar_share
        # all of it at once in the disk's blocks, with what eviction cannot free (taken for fitting on less, whole
        # shards were admitted unclaimed and readers waited for room only their own pins held)
        # when every shard fits nothing is evicted, so no plan is published (loader_prefetch.SamplePrefetcher):
        # the data fits beside the metadata and the names its shards add to the cache's folders; counting
        # the plans' worst case (48 KiB for 128 shards, 192 KiB for 500) made a cache with room for all of
        # it (+96 KiB here) read 3 of 128 shards (bench remote's: 10 of 125) as ranges every epoch
        self.fits = self.total_blocks + sidecars + self.meta + cm.folder_growth(self.shards) <= limit
        self.reserve = 0 if self.fits else range_reserve(limit, total, self.sidecar_share, self.samples, self.batch,
                                                         self.held, self.working, self.fixed, self.headroom)
        self.expected = cm.window_held(limit, total, self.sidecar_share, self.samples, self.batch, self.held,
                                       self.reserve)
        # a rank's prefetcher's share of it: the steps it brings beyond the readers' next (loader_prefetch.py);
        # what it brings into a copy a reader pins stays pinned, so the node's windows get only the room
        # beyond the readers' worst case (at the figure the start check names: none)
        window = 0 if self.fits else int(self.expected * (NEAR_STEPS - 1) / max(1, self.held))
        if self.working:
            spare = max(0, limit - self.fixed - self.working) // self.ranks
            window = min(window, spare // self.sample_blocks * self.sample_bytes())
        self.window_bytes = window

    def sample_bytes(self) -> int:
        """Budget bytes one sample's range holds on average (cost_model.expected_working's unit)."""
        return int(cm.mean_span(self.total_bytes, self.samples) + cm.BLOCK)

    def working_set(self, index, batch: int, readers: int, ranks: int) -> int:
        """Most bytes the node's ranges hold pinned at once (cost_model.range_working), ``readers``
        being every reader of the node and ``ranks`` its ranks (each with a prefetcher); kept
        free of whole shards from now on (the reserve), with the bytes eviction cannot free."""
        from shardfeed.cache.readers.reads import entry_bytes

        sizes = np.asarray(index.sizes, np.int64)
        side = int((entry_bytes(index) - sizes).max()) if len(index) else 0
        need = range_working(sizes, index.counts, side, batch, readers)
        held = cm.batches_held(ranks, readers, NEAR_STEPS)
        if need > self.working or not self.fixed or batch > self.batch or held > self.held:  # not every batch
            stride = -(-sizes // np.maximum(np.asarray(index.counts, np.int64), 1))
            self.sample_blocks, self.ranks = cm.range_blocks(int(stride.max(initial=0))), max(ranks, self.ranks)
            meta = self.cache.budget.fixed_bytes(plans=False)
            fixed = meta + ranks * plan_bytes(len(index), True)
            self.working, self.fixed, self.meta = max(need, self.working), max(fixed, self.fixed), max(meta, self.meta)
            self.shards = len(index)
            self.headroom = range_working(sizes, index.counts, side, batch, readers, batch_only=True)
            # on average: the prefetchers' windows (NEAR_STEPS a rank) and the workers' batches
            self.batch, self.held = max(batch, self.batch), max(held, self.held)
            self._sized()
        return need

    def observe_sidecar(self, nbytes: int, shard_bytes: int, url: str = "") -> None:
        if url in self._seen_sidecars:
            return
        self._seen_sidecars[url or str(len(self._seen_sidecars))] = (int(nbytes), int(shard_bytes))
        seen = self._seen_sidecars.values()
        self.sidecar_share = sum(a for a, _ in seen) / max(1, sum(b for _, b in seen))
        self._sized()

    @classmethod
    def of(cls, cache, index) -> RangePolicy:
        key = (os.getpid(), id(cache))
        with _mu:
            p = _policies.get(key)
            if p is None or p.cache is not cache:
                from shardfeed.cache.readers.reads import entry_bytes

                sizes = np.asarray(index.sizes, np.int64)
                blocks = int(cm.rounded_blocks_array(sizes).sum())
                p = _policies[key] = cls(cache, int(sizes.sum()), int(index.num_samples),
                                         int(entry_bytes(index).sum()) - blocks, blocks)
            return p

    def used(self) -> int:
        """Budget bytes of whole shards (Budget.whole_bytes), at most ``_USED_TTL_S`` old: one thread
        lists the folder while the others take the last answer (admission.claim decides, under the lock)."""
        t, used = self._used
        now = time.monotonic()
        if now - t > _USED_TTL_S and self._scanning.acquire(blocking=False):
            try:
                used = self.cache.budget.whole_bytes()
                self._used = (time.monotonic(), used)
            finally:
                self._scanning.release()
        return used

    def slack(self) -> int:
        """The part of the reserve dense reuse may take: never what the readers pin at worst
        (a whole shard a reader keeps open is pinned: room a waiting reader would need), nor
        the prefetchers' windows (whole shards there would leave the prefetch no room)."""
        return max(0, self.reserve - self.working - self.fixed - self.expected)

    def admit(self, size: int, pending: int = 0) -> bool:
        return self.used() + pending + size + self.reserve <= self.cache.limit_bytes

    def choose(self, ref: ShardRef, needed: int, count: int, ranges_cost=None, pending: int = 0) -> str:
        """How to fetch shard ``ref`` (``count`` samples) when ``needed`` of them are wanted soon;
        ``pending``: bytes of whole shards chosen for the same read and not fetched yet."""
        size = int(ref.size or 0)
        if self.fits:
            way = WHOLE
        elif self.admit(size, pending) or (needed * 2 >= count and self.admit(size, pending - self.slack())):
            way = WHOLE if self._claim(ref, size, pending - (self.slack() if needed * 2 >= count else 0)) else RANGES
        elif ranges_cost is None or not self.admit(size, pending - self.slack()):
            way = RANGES  # a whole shard here would take room the readers may need (it stays pinned while open)
        elif self.cost.cost(1, size) + size / self.cost.bandwidth <= ranges_cost():
            way = WHOLE if self._claim(ref, size, pending - self.slack()) else RANGES
        else:
            way = RANGES
        if way == WHOLE:
            self._used = (time.monotonic(), self._used[1] + size)  # until the next scan sees it
        self.decisions[way] += 1
        return way

    def _claim(self, ref: ShardRef, size: int, pending: int) -> bool:
        """Admit a whole shard for good, its room held (admission.claim)."""
        from shardfeed.cache.storage.admission import claim

        key = self.cache.key_for(ref.url, ref.hash, ref.version)
        ok, used = claim(self.cache, key, size, self.sidecar_share, self.cache.limit_bytes - pending - self.reserve)
        self._used = (time.monotonic(), used)
        return ok

    def ranges_cost(self, ref: ShardRef, local):
        """() -> cost of fetching samples ``local`` of ``ref`` as ranges, or None when its
        sidecar is not known here yet (then ranges: fetching the sidecar to decide costs as much)."""
        memo = self.fetcher._tables.get(self.fetcher.path(ref) + ".idx")
        if memo is None:
            return None

        def cost() -> float:
            start, end = spans(memo[2], np.asarray(local, np.int64))
            rs = coalesce(start, end, self.cost.gap_bytes())
            return self.cost.cost(len(rs), sum(b - a for a, b in rs))
        return cost

    def stats(self) -> dict:
        return {**self.fetcher.counters, **self.cost.describe(), "whole_decisions": self.decisions[WHOLE],
                "range_decisions": self.decisions[RANGES], "reserve_bytes": self.reserve,
                "window_bytes": self.window_bytes}


class RangedShards(CachedShards):
    """CachedShards whose misses may be fetched as sample ranges (see the module docstring).

    ``ranges``: False reads whole shards only (orders that read a shard's
    samples together: none, shard, block); consumed samples' blocks are
    given back (orders that read each sample once per epoch)."""

    def __init__(self, index, spec, url_of=None, ranges: bool = True, readers: int = 1, ranks: int = 1):
        super().__init__(index, spec, url_of)
        self.ranges = ranges
        self.punch_consumed = ranges
        self.readers = max(1, int(readers))  # every reader of the node
        self.ranks = max(1, int(ranks))  # the node's ranks (each with a prefetcher)
        self._unpunched: list = []  # consumed samples whose punch met a fetch in progress: tried again
        self._giving = threading.Lock()
        self._partial: set[int] = set()  # shards whose next path_of is their partial copy
        # (shard) -> None: close the reader's open view of a shard between reads (loader/batcher.py sets it)
        self.forget_view = None
        self._kind: dict[int, str] = {}  # shard -> what its open view reads (WHOLE / RANGES)
        self.batch_step: int | None = None  # the plan's step of the batch read now (loader/batcher.py sets it)

    @property
    def ranged(self) -> bool:
        """Whether misses may come as sample ranges now."""
        return self.ranges and use_ranges(self.index)

    def policy(self) -> RangePolicy:
        return RangePolicy.of(self.spec.open(), self.index)

    def prepare(self, ids) -> list:
        """Before a batch read: its samples' ranges present and pinned; returns the token for finish()."""
        if not self.ranged:
            return []
        cache = self.spec.open()
        policy = self.policy()
        shard, local = self.index.locate(np.asarray(ids, np.int64))
        policy.working_set(self.index, len(ids), self.readers, self.ranks)
        token, todo = [], []  # todo: (shard, ref, its samples, its count, pin), pinned
        t0 = time.monotonic()
        try:
            self._sort_out(cache, policy, shard, local, todo)
            fetched = ensure_all(policy.fetcher, [(ref, mine, count) for _, ref, mine, count, _ in todo],
                                 self.on_wait)
        except BaseException:
            for *_, pin in todo:
                pin.release()
            raise
        for (s, ref, mine, _, pin), n in zip(todo, fetched):
            self._c["misses" if n else "hits"] += 1
            self._c["late_samples"] += n
            self._partial.add(s)
            token.append((s, ref, mine, pin))
        self._c["wait_s"] += time.monotonic() - t0
        return token

    def _sort_out(self, cache, policy, shard, local, todo: list) -> None:
        """The batch's shards (``shard``, ``local``) needing ranges, pinned into ``todo`` (whole ones: path_of)."""
        pending = 0  # whole shards this read will fetch in path_of
        for s in np.unique(shard).tolist():
            if not rangeable(self.index, s):
                continue
            ref = self.ref(s)
            kind = self._kind.get(s)
            if kind == RANGES and self.forget_view is not None and cache.contains(ref.url, ref.hash, ref.version):
                self.forget_view(s)  # admitted whole since its partial copy was opened: read the whole copy
                kind = self._kind.get(s)  # None once closed (its pins released)
            if kind is None and s not in self._partial and os.path.exists(policy.fetcher.path(ref)):
                if not cache.contains(ref.url, ref.hash, ref.version):
                    self._partial.add(s)  # a partial copy is here (the prefetcher's, or another rank's): use it
                else:
                    policy.fetcher.drop_superseded(ref)
            if kind == WHOLE or (kind is None and s not in self._partial and cache.contains(ref.url, ref.hash, ref.version)):
                # path_of opens the whole copy and counts it; one kept open is a hit of this read: hits and
                # misses count each shard of each batch, however long the reader keeps its shards open
                self._c["hits"] += kind == WHOLE
                continue
            mine = local[shard == s]
            count = int(self.index.counts[s])
            # a shard not open here may be admitted whole at any read (cache/simulate.py models the same)
            if kind is None and \
                    policy.choose(ref, len(np.unique(mine)), count, policy.ranges_cost(ref, mine), pending) == WHOLE:
                self._partial.discard(s)  # its partial copy, if any, is removed once the whole copy is here
                pending += int(ref.size or 0)
                continue
            pin = policy.fetcher.pin(ref)
            todo.append((s, ref, mine, count, pin))
            pin.claim(np.unique(mine).tolist())  # before ensure_all checks them: no punch removes them now

    def finish(self, token) -> None:
        policy = self.policy() if token or self._unpunched else None
        self._give_back()
        for _s, ref, mine, pin in token:
            try:
                if self.batch_step is not None:
                    policy.fetcher.consumed.note(self.batch_step, ref.url, mine)  # before the punch
                pin.unclaim()  # read: this reader's own claims keep nothing from the punch
                if self.punch_consumed and not policy.fetcher.punch_consumed(ref, mine):
                    self._unpunched.append((ref, mine))
            finally:
                pin.release()
        if self.forget_view is not None:
            # closed after each read, so never pinned between reads: the worst case counts no kept-open
            # copy (their sidecars), and the next read sees a shard admitted whole since
            for s, *_ in token:
                self.forget_view(s)
        for _s, ref, *_ in token:
            policy.fetcher.drop_superseded(ref)  # admitted whole (here or by another rank) while pinned

    def on_wait(self) -> None:
        self._give_back(let_go=True)

    def _give_back(self, let_go: bool = False) -> None:
        """Consumed samples a fetch kept from being punched, again (at finish; while a fetch waits for
        room, ``let_go``, with the shards this reader keeps open idle closed: CachedShards.let_go)."""
        if (self._unpunched or let_go) and self._giving.acquire(blocking=False):  # late_ranges' threads wait at once
            try:
                fetcher = self.policy().fetcher
                self._unpunched = [(r, m) for r, m in self._unpunched if not fetcher.punch_consumed(r, m)]
                if let_go and self.let_go is not None:
                    self.let_go()
            finally:
                self._giving.release()

    def path_of(self, i: int) -> str:
        if i in self._partial and self._kind.get(i) != WHOLE:
            ref = self.ref(i)
            fetcher = self.policy().fetcher
            pin = fetcher.pin(ref)
            path = fetcher.path(ref)
            self._held.setdefault(i, []).append(pin)
            self._paths[path] = i
            self._kind[i] = RANGES
            return path
        self._kind[i] = WHOLE
        had = self._c["hits"], self._c["misses"]
        path = super().path_of(i)
        if not self.ranges:
            return path
        ref = self.ref(i)
        policy = self.policy()
        if ref.url not in policy._seen_sidecars and os.path.exists(path + ".idx"):
            policy.observe_sidecar(os.path.getsize(path + ".idx"), int(ref.size or 0), ref.url)
        if self.index.formats[i] == "tar" and i in self._partial:
            self._c["hits"], self._c["misses"] = had  # counted by prepare
        if rangeable(self.index, i):
            policy.fetcher.drop_superseded(ref)  # a partial copy left from before its whole admission
        return path

    def release(self, i: int) -> None:
        super().release(i)
        if i not in self._held:
            self._kind.pop(i, None)
            self._partial.discard(i)

    def refetch(self, i: int) -> bool:
        """Discard shard ``i``'s copy found damaged: its partial copy if the reader had
        that open (the next prepare starts a fresh one), else the whole copy."""
        if self._kind.get(i) == RANGES or i in self._partial:
            self.policy().fetcher.discard(self.ref(i))  # open views keep their inode and check what they read
            self._partial.discard(i)
            return True
        return super().refetch(i)

