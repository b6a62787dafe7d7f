"""How a Loader reads through the node-local shard cache (shardfeed.cache).

Who does what:

- Readers (the Loader's workers, or the main process with ``num_workers=0``,
  or a plain torch DataLoader's workers) open shards through
  ``cache.readers.reads.CachedShards``: a shard's verified local copy, pinned while
  the reader holds it open, fetched by the reader itself on a miss.
- One prefetcher per Loader, in the main process (``LoaderCache``): a
  ``cache.planning.loader_prefetch.PlanPrefetcher`` fed by the feed's lookahead (a private
  copy of the feed, so the lookahead runs in the prefetch thread, never on
  the training loop's path). It fetches the shards in order of next use and
  publishes their steps as the cache's lookahead, so eviction is Belady's
  over every rank of the node. Workers then mostly hit. A plain torch
  DataLoader gets no prefetch: misses are fetched as read, eviction is LRU.
- At the first iteration: a budget below the working set (the shards one
  step reads, times the readers, plus one being fetched) raises
  CacheLimitError with the bytes needed; a plan that will thrash (the node
  reads more than the cache holds, in an order that refetches) warns once,
  on the node's first rank, with Belady's estimate of the bytes fetched per
  epoch (cache/planning/thrash.py, over a bounded prefix of the epoch) and the fixes.
  The bytes each figure counts are pure functions in cache/planning/sizing.py;
  here they are asked of this dataset, node and feed.

Global step numbers for the cache's lookahead are ``epoch * 10**9 + step``:
the same on every rank, since all ranks take the same steps.
"""

from __future__ import annotations

import warnings

import numpy as np

from shardfeed.cache import CacheLimitError
from shardfeed.cache.planning import sizing
from shardfeed.cache.planning.loader_prefetch import PlanPrefetcher
from shardfeed.cache.planning.thrash import step_reads, thrash_ratio, warm_epoch
from shardfeed.cache.readers.ranged_reads import NEAR_STEPS, RANGE_THREADS
from shardfeed.cache.readers.reads import CachedShards, entry_bytes, max_entry_bytes
from shardfeed.cache.storage.eviction import plan_bytes
from shardfeed.loader.cache_limits import below_one_shard, order_name, passing, ranged_passing

STEP_KEY = 10 ** 9
SIM_POSITIONS = 1 << 18  # samples of the epoch the thrash estimate simulates (bounds its cost, ~0.3 s)
PREFETCH_THREADS = 2


def step_key(epoch: int, step: int) -> int:
    return int(epoch) * STEP_KEY + int(step)


def node_ranks(topology) -> int:
    """Ranks sharing this node's cache: LOCAL_WORLD_SIZE, else every rank of the job
    (one node; an overcount on several nodes only makes the check stricter)."""
    return int(topology.ranks_per_node or topology.world_size)


def plain_read_shards(limit_bytes: int, index, readers: int, where: str, fixed: int = 0) -> int:
    """Shards one read of a plain iteration may touch (cache/planning/sizing.py, ``read_slots``)."""
    return sizing.read_slots(limit_bytes, entry_bytes(index), readers, where, fixed)


class LoaderCache:
    """The main-process side of a Loader over a cached dataset (see the module docstring)."""

    def __init__(self, dataset, schedule, readers: int):
        self.ds = dataset
        self.spec = dataset.cache
        self.readers = max(1, readers)
        self.shards = CachedShards(dataset.index, self.spec, dataset.shard_url)
        self.feed = dataset.feed(schedule)  # private: used by the prefetch thread only, once started
        sizes = dataset.index.sizes
        self.max_shard = max_entry_bytes(dataset.index)  # with its sidecar: what the budget counts
        self.min_size = int(sizes.min()) if len(sizes) else 1
        self.plan_len = sizing.plan_shards(len(sizes), self.spec.limit_bytes, self.min_size, ranged=False)
        self.prefetcher: PlanPrefetcher | None = None
        self.busy = 0  # steps past the consumer's the workers read already: sample prefetches start after them
        self.policy = None
        self.estimate: dict | None = None

    def start(self, pos: dict) -> None:
        """Before the first batch of an iteration: checks (once), then the prefetcher."""
        if self.prefetcher is None:
            self.feed.reset(pos)
            if self._ranged():
                from shardfeed.cache.planning.loader_prefetch import SamplePrefetcher
                from shardfeed.cache.readers.ranged_reads import RangePolicy

                self.policy = RangePolicy.of(self.spec.open(), self.ds.index)
                self._check_ranged_budget()
                self.plan_len = sizing.plan_shards(len(self.ds.index), self.spec.limit_bytes, self.min_size,
                                                   ranged=True)
                self.spec.open().lookahead.max_bytes = plan_bytes(len(self.ds.index), True)  # as counted
                self.prefetcher = SamplePrefetcher(self.spec.open(), self._plan_samples, self.policy,
                                                   RANGE_THREADS)
            else:
                window = self._check_budget()
                self.spec.open().lookahead.max_bytes = plan_bytes(min(len(self.ds.index), sizing.LOOKAHEAD_SHARDS),
                                                                  False)
                if self._first_of_node():
                    self._warn_if_thrashing(self.feed.epoch)
                self.prefetcher = PlanPrefetcher(self.spec.open(), self._plan, window, PREFETCH_THREADS)
        self.moved(pos)

    def moved(self, pos: dict) -> None:
        self.prefetcher.moved(pos, step_key(pos["epoch"], pos["step"] + (self.busy if self.policy else 0)))

    def _plan(self, pos: dict):
        self.feed.reset(pos)
        return [(self.shards.ref(u.shard), step_key(u.epoch, u.step), self.shards.needs_sidecar(u.shard))
                for u in self.feed.lookahead(self.plan_len)]

    def _ranged(self) -> bool:
        """Misses may be fetched as sample ranges: plain tar shards with sidecars, an
        epoch feed (whose plan says which samples come next, feed.near), a budget below the data."""
        from shardfeed.cache.readers.ranged_reads import rangeable, use_ranges

        index = self.ds.index
        return bool(use_ranges(index) and self.ds.order.value == "global" and self.feed.knows_near
                    and len(index)
                    and all(rangeable(index, i) for i in range(len(index))))

    def ranged_need(self, policy, readers: int | None = None, batch: int | None = None) -> int:
        """Bytes the node's sample ranges pin at worst, with what eviction cannot free
        (``_check_ranged_budget``), at this Loader's readers and batch size unless given."""
        ranks = node_ranks(self.ds.topology)
        working = policy.working_set(self.ds.index, batch or self.feed.batch_size(self.feed.epoch),
                                     (readers or self.readers) * ranks, ranks)
        return sizing.ranged_need(policy.fixed, int(entry_bytes(self.ds.index).sum()), working)

    def _check_ranged_budget(self) -> None:
        """CacheLimitError now if the node's ranges cannot all be pinned at once (every rank
        and reader of the node counted, as in ``_check_budget``); what they need is then
        the policy's reserve, kept free of whole shards (RangePolicy.working_set)."""
        bs = self.feed.batch_size(self.feed.epoch)
        limit = self.spec.limit_bytes
        ranks = node_ranks(self.ds.topology)
        needed = self.ranged_need(self.policy)
        fixed = self.policy.fixed
        if needed > limit:
            raise CacheLimitError(self.spec.cache_dir, f"cache_limit_bytes={limit:,} is below the working set of "
                                  f"this node: {ranks} rank(s) x {self.readers} reader(s), {bs} samples a step "
                                  f"each and {NEAR_STEPS} steps prefetched per rank, read as sample ranges (in the "
                                  f"disk blocks they touch) with their sidecars, plus {fixed:,} bytes of index and "
                                  f"plans; raise cache_limit_bytes to at least {needed:,}"
                                  + "".join(f", or {a}" for a in ranged_passing(self, limit)), needed)

    def _plan_samples(self, pos: dict):
        """(upcoming shards, near samples by shard) for SamplePrefetcher: the near samples are those
        of this rank's NEAR_STEPS steps after the ``busy`` ones its workers read already (bringing those
        would race the readers), into the next epoch at the end of this one (feed.near)."""
        upcoming = [(ref, step) for ref, step, _ in self._plan(pos)]
        index = self.ds.index
        near: dict[int, list] = {}  # shard -> [ref, first step, [local ids], [their steps]], in order of first use
        for epoch, step, bs, ids in self.feed.near(NEAR_STEPS, self.busy):
            shard, local = index.locate(ids)
            steps_of = step_key(epoch, step) + np.arange(len(ids), dtype=np.int64) // bs
            uniq, first = np.unique(shard, return_index=True)
            for j in np.argsort(first, kind="stable").tolist():
                s = int(uniq[j])
                mine = shard == s
                got = near.get(s)
                if got is None:
                    got = near[s] = [self.shards.ref(s), int(steps_of[first[j]]), [], []]
                got[2].append(local[mine])
                got[3].append(steps_of[mine])
        return upcoming, [(ref, first, (np.concatenate(ls), np.concatenate(ss)), int(index.counts[s]))
                          for s, (ref, first, ls, ss) in near.items()]

    def _check_budget(self) -> int:
        """The prefetch window in bytes; CacheLimitError if the node's working set cannot fit.

        Every rank of the node shares the cache, so the check counts every
        reader of the node (ranks x readers per rank), each pinning the shards
        of its read plus those it keeps open: with less, two readers could
        each wait for room the other's pins hold."""
        ranks = self.node_per_step(self.feed.epoch)
        per_step = sizing.per_reader(ranks, self.readers)
        limit = self.spec.limit_bytes
        fixed, whole = self.whole_terms()
        needed = sizing.whole_need(limit, fixed, whole, self.max_shard, per_step)
        if needed > limit:
            least = sizing.whole_least(fixed, whole, self.max_shard, per_step)
            others = "".join(f", or {a}" for a in passing(self, limit, fixed, whole, ranks))
            raise CacheLimitError(self.spec.cache_dir, f"cache_limit_bytes={limit:,} is below the working set of "
                                  f"this node: {len(ranks)} rank(s) x {self.readers} reader(s), up to {max(ranks)} "
                                  f"shard(s) per step each ({order_name(self.ds)}), plus one being fetched, of up "
                                  f"to {self.max_shard:,} bytes each, and {fixed:,} bytes of index and plans; raise "
                                  f"cache_limit_bytes to at least {least:,}{others}", least)
        return sizing.prefetch_window(limit, needed, self.max_shard)

    def whole_terms(self) -> tuple[int, int]:
        """The whole-shard check's (bytes eviction cannot free: mirrored index and log, the node's plans
        at most; those and every shard: a budget that evicts nothing)."""
        return sizing.whole_terms(self.spec.open().budget.fixed_bytes(plans=False), node_ranks(self.ds.topology),
                                  len(self.ds.index), int(entry_bytes(self.ds.index).sum()))

    def node_per_step(self, epoch: int, max_positions: int = SIM_POSITIONS) -> list[int]:
        """Most shards one step reads, for each rank of this node, over a bounded prefix of ``epoch``."""
        rank = self.ds.topology.rank
        return self.node_per_step_of(epoch, lambda job, r: self.feed.plan(epoch) if r == rank else
                                   self.ds.spec.plan(epoch, job, r), max_positions)

    def node_per_step_of(self, epoch: int, plan_of, max_positions: int = SIM_POSITIONS) -> list[int]:
        """Most shards one step reads, for each rank of this node (``plan_of(job, rank)``: its plan)."""
        job, rank = self.feed.job(epoch), self.ds.topology.rank
        rpn = job.ranks_per_node or job.world_size
        node = rank // rpn
        ranks = range(node * rpn, min(job.world_size, (node + 1) * rpn))
        return [self._per_step(plan_of(job, r), job.batch_size(r), max_positions) for r in ranks]

    def _per_step(self, plan, bs: int, max_positions: int) -> int:
        return sizing.most_per_step(self.ds.index.offsets, plan, bs, max_positions)

    def _first_of_node(self) -> bool:
        t = self.ds.topology
        return t.rank % (t.ranks_per_node or t.world_size) == 0

    # -- will the plan thrash? ------------------------------------------
    def node_reads(self, epoch: int, max_positions: int = SIM_POSITIONS):
        """(shards read in order, one per step that reads them, over this node's
        ranks; the fraction of the epoch covered) for a prefix of ``epoch``."""
        job, t = self.feed.job(epoch), self.ds.topology
        rpn = job.ranks_per_node or t.world_size
        node = t.rank // rpn
        ranks = range(node * rpn, min(t.world_size, (node + 1) * rpn))
        plans = [(self.ds.spec.plan(epoch, job, r), job.batch_size(r)) for r in ranks]
        return step_reads(self.ds.index.offsets, plans, max_positions)

    def estimate_epoch(self, epoch: int) -> dict:
        """Bytes the node reads and fetches in an epoch like ``epoch`` once the cache is warm: the epoch after
        it simulated behind it (a cold one also fetches what the cache keeps), each over half the positions."""
        reads, _ = self.node_reads(epoch, SIM_POSITIONS // 2)
        after, frac_after = self.node_reads(epoch + 1, SIM_POSITIONS // 2)
        # the room holds shards' blocks and sidecars
        return warm_epoch(reads, after, frac_after, self.ds.index.sizes, entry_bytes(self.ds.index),
                          self.belady_room())

    def belady_room(self) -> int:
        """The room Belady's estimate evicts in (cache/planning/sizing.py), every reader of the node counted."""
        return sizing.belady_room(self.spec.limit_bytes, self.max_shard, node_ranks(self.ds.topology) * self.readers,
                                  self.spec.open().budget.fixed_bytes(plans=False))

    def _warn_if_thrashing(self, epoch: int) -> None:
        index, limit = self.ds.index, self.spec.limit_bytes
        if int(index.sizes.sum()) <= limit:
            return  # everything fits: each shard is fetched once, ever
        est = self.estimate = self.estimate_epoch(epoch)
        ratio = thrash_ratio(est, limit)
        if ratio is None:
            return
        part = "" if est["fraction_simulated"] >= 1 else f", estimated from {est['fraction_simulated']:.0%} of it"
        warnings.warn(
            f"shardfeed: the cache at {self.spec.cache_dir} ({_gb(limit)}) is smaller than the "
            f"{_gb(est['node_bytes'])} this node reads per epoch, and shuffle={self.ds.order.value!r} reads them "
            f"in an order that refetches: about {_gb(est['fetched_bytes'])} will be fetched per epoch "
            f"({ratio:.1f}x, evicting by the plan in the room its open shards leave{part}). Fixes: locality=True (with several nodes, each "
            f"caches only its own share), shuffle='block' (a window of shards at a time), or "
            f"cache_limit_bytes >= {est['node_bytes']:,}.", RuntimeWarning, stacklevel=4)

    def take(self) -> dict:
        """The main process's cache counters since the last take (bytes fetched, evictions)."""
        return self.spec.take()

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None


def _gb(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n):,} B"


def cache_spec(source, cache_dir, limit_bytes, storage_options):
    """The CacheSpec of a dataset read through the cache (the folder and limit checked, defaults applied)."""
    import os

    from shardfeed.cache.readers.reads import CacheSpec, default_cache_dir, default_limit

    if cache_dir is None:
        cache_dir = default_cache_dir()
        warnings.warn(f"shardfeed: {source} is read through a node-local cache and no cache_dir was given: "
                      f"using {cache_dir} (set cache_dir= or $SHARDFEED_CACHE_DIR to choose)", RuntimeWarning,
                      stacklevel=5)
    cache_dir = os.path.abspath(os.fspath(cache_dir))
    if limit_bytes is None:
        limit_bytes = default_limit(cache_dir)
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, (int, np.integer)) or limit_bytes <= 0:
        raise ValueError(f"cache_limit_bytes={limit_bytes!r} must be a positive int (bytes), or None for 80% of "
                         f"the disk space at {cache_dir}")
    return CacheSpec(cache_dir, int(limit_bytes), dict(storage_options or {}))


def open_cached(source, cache_dir, limit_bytes, storage_options):
    """(CacheSpec, index) of a dataset read through the cache: a URL's index is
    mirrored into the cache folder (and named by its URL); a local one is read
    in place. CacheLimitError now if the biggest shard cannot fit."""
    from shardfeed.cache import mirror_index
    from shardfeed.cache.fetching.url_schemes import is_remote
    from shardfeed.formats import open_index

    spec = cache_spec(source, cache_dir, limit_bytes, storage_options)
    cache = spec.open()
    if isinstance(source, str) and is_remote(source):
        url = source.rstrip("/")
        try:
            index = open_index(mirror_index(url, cache))
        except CacheLimitError as e:  # the index itself does not fit: name what would, shards included
            raise below_one_shard(spec, url, e) from e
        index.root = url  # shard paths and error messages name the source, not the mirror
    else:
        index = open_index(source)
    if len(index):
        if max_entry_bytes(index) > spec.limit_bytes:  # (the start check counts the metadata beside it)
            fixed = cache.budget.fixed_bytes(plans=False)
            raise below_one_shard(spec, str(source), None, fixed, max_entry_bytes(index), len(index))
    return spec, index
