"""The start check's advice: the settings that pass, and the limit one shard needs.

loader/caching.py runs the check, on the arithmetic of cache/planning/sizing.py;
here are the search for settings that pass (each tried through the check:
``largest`` of a setting), and the CacheLimitError of a limit that cannot hold a
dataset's mirrored index beside its largest shard, naming the smallest one that
can (for an index the cache cannot hold, read into memory to size its shards).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from shardfeed.cache import CacheLimitError
from shardfeed.cache.fetching.fetch import with_retries
from shardfeed.cache.fetching.url_sources import open_source
from shardfeed.cache.planning.sizing import fits, one_shard_limits
from shardfeed.cache.readers import ranged_reads
from shardfeed.cache.readers.ranged_reads import RangePolicy
from shardfeed.cache.readers.reads import entry_bytes
from shardfeed.formats import ShardError
from shardfeed.formats.index import INDEX_NAME
from shardfeed.formats.own_tables import parse_index_bytes
from shardfeed.shuffling import Order
from shardfeed.shuffling.plan import DEFAULT_BUFFER_SIZE
from shardfeed.shuffling.spec import PlanSpec


def below_one_shard(spec, url: str, err: CacheLimitError | None, fixed: int = 0, entry: int = 0,
                     shards: int = 1) -> CacheLimitError:
    """The CacheLimitError of a limit that cannot hold the dataset's mirrored metadata and its
    largest shard at once, naming the smallest limit that can, and what a Loader reading one whole
    shard at a time needs (the start check's figure for one reader and one shard a step). ``err``:
    the index itself did not fit; its bytes are then read once more, into memory, to size the shards."""
    cache = spec.open()
    if err is not None:
        sized = sizes_unmirrored(url, cache)
        if sized is None:  # no index.arrow (a log-only dataset): what the mirror asked for
            return CacheLimitError(spec.cache_dir, f"cache_limit_bytes={spec.limit_bytes:,} cannot hold the "
                                   f"mirrored commit log of {url} ({err.reason}); raise cache_limit_bytes",
                                   err.needed_bytes)
        index_bytes, entry, shards = sized
        fixed = cache.budget.fixed_bytes(plans=False) + index_bytes + len(url) + 16  # its folder's source.txt
    least, loader = one_shard_limits(fixed, entry, shards)
    return CacheLimitError(spec.cache_dir, f"cache_limit_bytes={spec.limit_bytes:,} cannot hold one shard of "
                           f"{url}: its largest takes {entry:,} bytes with its sidecar, beside {fixed:,} bytes of "
                           f"mirrored index that stay in the cache; raise cache_limit_bytes to at least {least:,} "
                           f"(a Loader reading whole shards one at a time holds one and fetches the next: "
                           f"{loader:,}; its start check counts more workers, ranks or shards a step)", least)


def sizes_unmirrored(url: str, cache) -> tuple[int, int, int] | None:
    """(bytes of ``url``'s index.arrow, its largest shard entry as entry_bytes counts it, shards), read into
    memory (the cache cannot hold it); None without an index.arrow."""
    src = open_source(f"{url}/{INDEX_NAME}", cache.storage_options, cache.fetch_options.stall_s)
    try:
        size = with_retries(src.url, "asking its size", src.size, cache.fetch_options)
        raw = with_retries(src.url, "reading it", lambda: src.read_range(0, size), cache.fetch_options)
    except (ShardError, OSError):
        return None
    meta, (_, formats, counts, sizes, hashes) = parse_index_bytes(raw, src.url)
    shards = SimpleNamespace(sizes=np.asarray(sizes, np.int64), counts=np.asarray(counts, np.int64),
                             formats=list(formats), fields=list(meta.get("fields") or []), tables={},
                             hashes=list(hashes))
    return len(raw), int(entry_bytes(shards).max()) if len(shards.sizes) else 0, len(shards.sizes)


def largest(passes, below: int) -> int | None:
    """The largest n in [1, below) with passes(n) (taken as monotone; the n returned was tried); None
    if not even 1 passes."""
    if below <= 1 or not passes(1):
        return None
    lo, hi = 1, below
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def order_name(ds) -> str:
    """How ``ds`` orders its samples, as its keywords name it (for messages)."""
    if ds.order is Order.BLOCK:
        return f"shuffle='block', block_shards={ds.block_shards}"
    if ds.order is Order.SHARD:
        return f"shuffle='shard', shuffle_buffer={ds.shuffle_buffer}"
    if ds.order is Order.GLOBAL and ranged_reads.ENABLED is False:
        return "shuffle='global' read as whole shards: SHARDFEED_CACHE_RANGES=0"
    return f"shuffle={ds.order.value!r}"


def passing(lc, limit: int, fixed: int, whole: int, per_rank: list[int]) -> list[str]:
    """Settings other than the ones in use that pass the whole-shard start check for this dataset
    and node at ``limit``, each tried through the check itself: a smaller block window, a smaller
    shuffle buffer, fewer workers, the global order read as sample ranges. ``lc``: the
    LoaderCache whose check refused (its ``node_per_step_of`` and ``ranged_need``)."""
    out = orders_passing(lc, limit, fixed, whole)
    r = largest(lambda r: fits(lc.max_shard, per_rank, r, limit, fixed, whole), lc.readers)
    if r is not None:
        out.append(f"num_workers={0 if r == 1 else r}")  # one reader: the main process's, or one worker's
    if ranges_possible(lc.ds, lc.feed) and lc.ranged_need(_policy(lc)) <= limit:
        unset = " (unset SHARDFEED_CACHE_RANGES)" if ranged_reads.ENABLED is False else ""
        out.append(f"shuffle='global' read as sample ranges{unset}")
    return out


def ranged_passing(lc, limit: int) -> list[str]:
    """Settings that pass for a Loader whose sample-range check refused at ``limit``: fewer
    workers or a smaller batch (through the same check), or an order read as whole shards
    (through the whole-shard check)."""
    out = []
    r = largest(lambda r: lc.ranged_need(_policy(lc), readers=r) <= limit, lc.readers)
    if r is not None:
        out.append(f"num_workers={0 if r == 1 else r}")  # one reader: the main process's, or one worker's
    batch = lc.feed.batch_size(lc.feed.epoch)
    b = largest(lambda b: lc.ranged_need(_policy(lc), batch=b) <= limit, batch)
    if b is not None:
        out.append(f"batch_size={b}")
    return out + orders_passing(lc, limit, *lc.whole_terms())


def _policy(lc) -> RangePolicy:
    """A RangePolicy of its own (the process's one keeps the largest working set it was shown)."""
    index = lc.ds.index
    return RangePolicy(lc.spec.open(), int(np.asarray(index.sizes).sum()), int(index.num_samples))


def orders_passing(lc, limit: int, fixed: int, whole: int) -> list[str]:
    """The largest block window and shuffle buffer (below the ones in use) with which the
    whole-shard check passes at ``limit``."""
    ds, epoch = lc.ds, lc.feed.epoch

    def passes(**options) -> bool:
        spec = PlanSpec(ds.index.counts, options.pop("order"), ds.seed, drop_last=ds.drop_last, **options)
        per = lc.node_per_step_of(epoch, lambda job, r: spec.plan(epoch, job, r))
        return fits(lc.max_shard, per, lc.readers, limit, fixed, whole)

    out = []
    n_shards = len(ds.index)
    now = ds.block_shards if ds.order is Order.BLOCK else n_shards + 1
    w = largest(lambda w: passes(order=Order.BLOCK, block_shards=w), min(now, n_shards + 1))
    if w is not None:
        out.append(f"shuffle='block' with block_shards={w}")
    now = ds.shuffle_buffer if ds.order is Order.SHARD else DEFAULT_BUFFER_SIZE + 1
    b = largest(lambda b: passes(order=Order.SHARD, buffer_size=b), now)
    if b is not None:
        out.append(f"shuffle='shard' with shuffle_buffer={b}")
    return out


def ranges_possible(ds, feed) -> bool:
    """Whether the global order would be read as sample ranges here but is not now (another
    order, or SHARDFEED_CACHE_RANGES=0): plain tar shards of samples large enough."""
    index = ds.index
    if ds.order is Order.GLOBAL and ranged_reads.ENABLED is not False:
        return False  # read as ranges already, or too small for them
    n = int(index.num_samples)
    big = n > 0 and int(np.asarray(index.sizes).sum()) / n >= ranged_reads.RANGE_MIN_SAMPLE_BYTES
    return bool(feed.knows_near and len(index) and (big or ranged_reads.ENABLED)
                and all(ranged_reads.rangeable(index, i) for i in range(len(index))))
