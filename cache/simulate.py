"""Bytes a cache fetches for a known sequence of shard reads (Belady's rule).

For warning at start when a plan and a budget will thrash: the plan is a pure
function, so the reads of an epoch are known, and evicting the shard whose
next read is farthest away is the best any cache can do: what this returns
is a lower bound for the real cache, which also holds pinned and prefetched
shards. Cost: O(reads log reads) in Python; callers bound ``reads`` (a prefix
of the epoch) and scale.
"""

from __future__ import annotations

import heapq

import numpy as np


def belady_bytes(reads, sizes, limit_bytes: int) -> int:
    """Bytes fetched by a cold cache of ``limit_bytes`` serving ``reads`` (shard
    numbers in order; a shard read by one step appears once per step) when
    shard ``s`` weighs ``sizes[s]`` bytes. A shard larger than the limit is
    fetched at each read."""
    reads = np.asarray(reads, np.int64)
    sizes = np.asarray(sizes, np.int64)
    n = len(reads)
    if n == 0:
        return 0
    never = n + 1
    nxt = np.full(n, never, np.int64)  # index of the next read of the same shard
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        s = int(reads[i])
        nxt[i] = last.get(s, never)
        last[s] = i
    held: dict[int, int] = {}  # shard -> its next read
    heap: list[tuple[int, int]] = []  # (-next read, shard); stale entries skipped
    used = fetched = 0
    for i in range(n):
        s, size, after = int(reads[i]), int(sizes[reads[i]]), int(nxt[i])
        if s in held:
            held[s] = after
            heapq.heappush(heap, (-after, s))
            continue
        fetched += size
        if size > limit_bytes:
            continue
        while used + size > limit_bytes and heap:
            neg, v = heapq.heappop(heap)
            if held.get(v) != -neg:
                continue
            del held[v]
            used -= int(sizes[v])
        held[s] = after
        used += size
        heapq.heappush(heap, (-after, s))
    return fetched
