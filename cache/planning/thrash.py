"""Will a plan thrash the node's cache: Belady's estimate of the bytes a warm epoch fetches.

The start check's warning (loader/caching.py) asks this of the node's plans:
``step_reads`` turns each rank's plan into the shards the node reads, one
per step that reads them (over a bounded prefix of the epoch: the cost stays
about 0.3 s whatever the dataset), and ``warm_epoch`` replays an epoch behind
the one before it through the one cache simulator (simulate.py), so what the
cache keeps from the first is not counted as fetched by the second.
"""

from __future__ import annotations

import numpy as np

from shardfeed.cache.planning.simulate import belady_bytes

THRASH_RATIO = 2.0  # a plan thrashes when Belady fetches more than this times the bytes the node reads


def step_reads(offsets, plans, max_positions: int) -> tuple[np.ndarray, float]:
    """(shards read in order, one per step that reads them, over the node's ranks; the fraction of
    the epoch covered). ``plans``: (plan, batch size) of each rank of the node, each plan read over
    at most its share of ``max_positions`` (and at least one batch)."""
    offsets = np.asarray(offsets)
    n_shards = offsets.shape[0] - 1
    keys, frac = [], 1.0
    for plan, bs in plans:
        n = plan.num_samples
        m = min(n, max(bs, max_positions // len(plans)))
        if n:
            frac = min(frac, m / n)
        shard = np.searchsorted(offsets, plan.positions(0, m), side="right") - 1
        keys.append((np.arange(m, dtype=np.int64) // bs) * n_shards + shard)
    uniq = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)  # step-major, each (step, shard) once
    return uniq % n_shards, frac


def warm_epoch(reads, after, frac_after: float, sizes, charge, room: int) -> dict:
    """Bytes the node reads and fetches in the epoch whose reads are ``after`` once the cache is warm:
    simulated behind ``reads`` (the epoch before it), in a cache of ``room`` bytes that charges shard
    ``s`` ``charge[s]`` (its blocks and sidecar); both scaled up from the ``frac_after`` simulated."""
    sizes, charge = np.asarray(sizes, np.int64), np.asarray(charge, np.int64)
    node_bytes = int(sizes[np.unique(after)].sum())
    if frac_after < 1.0:
        node_bytes = min(int(sizes.sum()), int(node_bytes / frac_after))
    warm = (belady_bytes(np.concatenate([reads, after]), charge, room) - belady_bytes(reads, charge, room)) \
        * int(sizes.sum()) / max(1, int(charge.sum()))
    return {"node_bytes": node_bytes, "fetched_bytes": int(warm / max(frac_after, 1e-9)),
            "fraction_simulated": frac_after}


def thrash_ratio(est: dict, limit: int) -> float | None:
    """Bytes fetched per byte the node reads, of a ``warm_epoch`` estimate that thrashes a cache of
    ``limit`` bytes (the node reads more than it holds and fetches over THRASH_RATIO times that); None
    when it does not."""
    if est["node_bytes"] <= limit or est["fetched_bytes"] <= THRASH_RATIO * est["node_bytes"]:
        return None
    return est["fetched_bytes"] / max(1, est["node_bytes"])
