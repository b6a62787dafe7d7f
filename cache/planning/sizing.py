"""Budget sizing: the bytes a node's readers need of the cache, as pure functions of sizes and counts.

The start check (loader/caching.py) asks these, and its messages name their figures:
what the node's readers pin at worst with whole shards (``whole_need``) and the
smallest limit that holds it (``whole_least``), the prefetch window the rest
leaves (``prefetch_window``), the shards a reader keeps open between reads, the
room Belady's estimate evicts in (``belady_room``), how many shards a plan
names, the shards one step reads (``most_per_step``), a plain reader's shards
per read (``read_slots``) and the limits one shard needs (``one_shard_limits``).
"""

from __future__ import annotations

import numpy as np

from shardfeed.cache.storage.budget import CacheLimitError
from shardfeed.cache.storage.eviction import plan_bytes

LOOKAHEAD_SHARDS = 4096  # shards one plan holds (the cache's lookahead)


def reader_max_open(limit_bytes: int, max_shard: int, readers: int) -> int:
    """Shards a reader keeps open (pinned) between reads, ``readers`` being
    every reader of the node: together at most a quarter of the budget, 0 when
    the budget is tight (each read then reopens its shards)."""
    return max(0, min(256, limit_bytes // max(1, 4 * readers * max_shard)))


def node_need(limit_bytes: int, max_shard: int, per_step: list[int]) -> int:
    """Bytes the node's readers pin at worst (``per_step``: shards one read of
    each reader of the node touches), each also keeping its open shards, plus
    one shard being fetched. Below this two readers can wait on each other."""
    kept = reader_max_open(limit_bytes, max_shard, len(per_step))
    return (sum(per_step) + kept * len(per_step) + 1) * max_shard


def smallest_limit(max_shard: int, per_step: list[int]) -> int:
    """The smallest budget ``node_need`` accepts (kept-open shards grow with it)."""
    limit = (sum(per_step) + 1) * max_shard
    while node_need(limit, max_shard, per_step) > limit:
        limit = node_need(limit, max_shard, per_step)
    return limit


def per_reader(per_rank: list[int], readers: int) -> list[int]:
    """Shards one read touches, for each reader of the node (``readers`` per rank)."""
    return [n for n in per_rank for _ in range(readers)]


def whole_terms(budget_fixed: int, ranks: int, n_shards: int, entries_total: int) -> tuple[int, int]:
    """The whole-shard check's (bytes eviction cannot free: ``budget_fixed``, the mirrored index and
    log, and the plans of the node's ``ranks``; those and every shard's ``entries_total``: a budget
    that evicts nothing)."""
    fixed = budget_fixed + ranks * plan_bytes(min(n_shards, LOOKAHEAD_SHARDS), False)
    return fixed, fixed + entries_total


def whole_need(limit: int, fixed: int, whole: int, max_shard: int, per_step: list[int]) -> int:
    """Bytes the whole-shard check asks of ``limit``: what eviction cannot free and what the readers
    pin (``node_need`` of the rest), or all of it (``whole``) when that is less."""
    return min(whole, fixed + node_need(limit - fixed, max_shard, per_step))


def whole_least(fixed: int, whole: int, max_shard: int, per_step: list[int]) -> int:
    """The smallest limit the whole-shard check passes (the figure its error names)."""
    return min(whole, fixed + smallest_limit(max_shard, per_step))


def fits(max_shard: int, per_rank: list[int], readers: int, limit: int, fixed: int, whole: int) -> bool:
    """Whether the whole-shard start check passes with ``per_rank`` shards a step and ``readers``
    per rank (``fixed``: bytes eviction cannot free; ``whole``: with every shard, all of it)."""
    return whole_need(limit, fixed, whole, max_shard, per_reader(per_rank, readers)) <= limit


def prefetch_window(limit: int, needed: int, max_shard: int) -> int:
    """The whole-shard prefetcher's window in bytes: what the readers' need leaves, and one shard."""
    return max(max_shard, limit - needed + max_shard)


def ranged_need(fixed: int, entries_total: int, working: int) -> int:
    """Bytes the node's sample ranges pin at worst (``working``: the policy's working set), with
    ``fixed`` bytes eviction cannot free; every shard's ``entries_total`` when that is less."""
    return fixed + min(entries_total, working)


def plan_shards(n_shards: int, limit: int, min_size: int, ranged: bool) -> int:
    """Upcoming shards the prefetcher's plan names. Eviction follows the plan (Belady's) only among the
    shards it names; a cached shard it leaves out is evicted first. Whole shards: twice what the cache
    holds (cut at what it holds, a 50% cache fetched 5.5x the data per epoch; named twice, 4.5x, what
    Belady fetches in the room the open shards leave). Sample ranges: every shard (partial copies
    hold a sidecar and a few blocks each, and one left out of the plan is evicted first)."""
    if ranged:
        return int(min(n_shards, LOOKAHEAD_SHARDS))
    held = limit // max(1, min_size)
    return int(min(n_shards, LOOKAHEAD_SHARDS, 2 * held + 2))


def most_per_step(offsets, plan, bs: int, max_positions: int) -> int:
    """Most shards one step of ``plan`` (``bs`` samples a step) reads, over its first
    ``max_positions`` samples (at least one step); 1 for an empty plan."""
    m = min(plan.num_samples, max(bs, max_positions))
    if m == 0 or bs <= 0:
        return 1
    n_shards = len(offsets) - 1
    shard = np.searchsorted(offsets, plan.positions(0, m), side="right") - 1
    steps = np.unique((np.arange(m, dtype=np.int64) // bs) * n_shards + shard) // n_shards
    return int(np.bincount(steps).max())


def belady_room(limit: int, max_shard: int, readers: int, fixed: int) -> int:
    """The budget eviction chooses from: less ``fixed`` (what eviction cannot free: the mirrored index)
    and the shards each of the node's ``readers`` keeps open between reads (pinned, so never the
    farthest one evicted). Measured (whole shards, 128 of 156 KB, cache 50%, one reader keeping 15
    open): 4.88x / 4.55x / 4.36x the data in epochs 0-2; Belady over the whole budget says 3.43x for
    a warm epoch, over this room 4.77x."""
    kept = reader_max_open(limit, max_shard, readers) * readers * max_shard
    return max(max_shard, limit - fixed - kept)


def read_slots(limit_bytes: int, entries, readers: int, where: str, fixed: int = 0) -> int:
    """Shards one read of a plain iteration may touch (a torch DataLoader's worker splits its blocks
    to stay within it), ``entries`` being each shard's bytes as the budget counts them, ``readers``
    every reader of the node and ``fixed`` the budget's bytes eviction cannot free (the mirrored
    index); CacheLimitError when not even one shard each fits."""
    entries = np.asarray(entries, np.int64)
    if int(entries.sum()) + fixed <= limit_bytes:
        return max(1, len(entries))  # all of it fits: nothing is ever evicted or waited for
    max_shard = int(entries.max()) if len(entries) else 1
    limit_bytes -= fixed
    slots = limit_bytes // max(1, readers * max_shard)
    if slots < 1:
        need = readers * max_shard + fixed
        raise CacheLimitError(where, f"cache_limit_bytes={limit_bytes:,} is below the working set: {readers} "
                              f"reader(s) on this node (LOCAL_WORLD_SIZE x DataLoader workers) each hold a shard "
                              f"of up to {max_shard:,} bytes (and {fixed:,} bytes of index and plans stay); raise "
                              f"cache_limit_bytes to at least {need:,} or use fewer workers", need)
    return max(1, slots - reader_max_open(limit_bytes, max_shard, readers))


def split_by_shards(ids: np.ndarray, offsets: np.ndarray, most: int) -> list[np.ndarray]:
    """``ids`` cut, in order, into runs touching at most ``most`` distinct shards each."""
    if len(ids) == 0:
        return [ids]
    shard = (np.searchsorted(offsets, ids, side="right") - 1).tolist()
    out, start, seen = [], 0, set()
    for j, s in enumerate(shard):
        if s not in seen and len(seen) == most:
            out.append(ids[start:j])
            start, seen = j, set()
        seen.add(s)
    out.append(ids[start:])
    return out


def one_shard_limits(fixed: int, entry: int, shards: int) -> tuple[int, int]:
    """(the smallest limit that holds ``fixed`` bytes of mirrored metadata beside the largest shard's
    ``entry``; what a Loader reading whole shards one at a time needs: that, its plan, and the next
    shard fetched while one is held) for a dataset of ``shards``."""
    return fixed + entry, fixed + plan_bytes(min(shards, LOOKAHEAD_SHARDS), False) + smallest_limit(entry, [1])
