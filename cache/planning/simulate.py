"""Bytes a node's cache fetches over a plan: exact, by simulation (the one cache simulator).

A plan is pure, so the shards a node reads, in order, are known before the
job starts. Replaying that sequence through a cache of ``limit_bytes`` gives
the bytes the node fetches:

- ``Policy.BELADY``: whole shards, evict the cached shard whose next use is
  farthest away (clairvoyant). With shards of different sizes this is the
  usual heuristic, not a proven optimum.
- ``Policy.LRU``: whole shards, evict the least recently used (what a cache
  without a future does).
- ``simulate_ranged``: what ShardCache does for the global order
  (ranged_reads.py): a miss brings its whole shard while the budget has room
  beyond the reserve, and those stay; any other miss brings the byte ranges
  of the samples it reads.

Model: a node's ranks step together, so its sequence is, step by step, each
rank's batch in rank order; consecutive reads of one shard are one access
(run-length compressed: a hit changes nothing but recency). For whole-shard
policies every read shard enters the cache (a reader needs it local); one
larger than the whole budget is fetched and not kept. Plans are taken by
their methods (``positions``, ``offsets``, ``steps``), so this module needs
nothing of shardfeed.shuffling; the loader calls it at start-up to warn of a
plan that will thrash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from shardfeed.cache.sample_ranges.cost_model import mean_span
from shardfeed.formats.compiler.jit import njit

MAX_ACCESSES = 1 << 27  # runs one simulation may hold (1 GiB of int64): bounds memory and time


class Policy(str, Enum):
    BELADY = "belady"
    LRU = "lru"

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            for member in cls:
                if member.value == value.strip().lower():
                    return member
        raise ValueError(f"unknown cache policy {value!r}; choose 'belady' or 'lru'")


@dataclass(frozen=True)
class Accesses:
    """A run-length-compressed shard sequence: ``shards[i]`` read ``samples[i]``
    times in a row; epoch ``e`` of the sequence is runs ``bounds[e]:bounds[e+1]``."""

    shards: np.ndarray
    samples: np.ndarray
    bounds: np.ndarray

    @property
    def epochs(self) -> int:
        return len(self.bounds) - 1

    @classmethod
    def of(cls, shards, bounds=None) -> Accesses:
        """From plain shard ids (one per read), one epoch unless ``bounds`` says otherwise."""
        shards = np.asarray(shards, np.int64)
        if bounds is None:
            bounds = [0, shards.shape[0]]
        parts = [run_length(shards[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        return _join(parts)


def run_length(shards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard of each run, reads in each run) of consecutive equal ids."""
    shards = np.asarray(shards, np.int64)
    if shards.shape[0] == 0:
        return shards, np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], shards[1:] != shards[:-1])))
    return shards[starts], np.diff(np.append(starts, shards.shape[0]))


def _join(parts) -> Accesses:
    bounds = np.zeros(len(parts) + 1, np.int64)
    bounds[1:] = np.cumsum([p[0].shape[0] for p in parts])
    if not parts:
        return Accesses(np.empty(0, np.int64), np.empty(0, np.int64), bounds)
    return Accesses(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), bounds)


def _merge_runs(shards, samples):
    """Join runs that became adjacent after concatenating pieces."""
    if shards.shape[0] == 0:
        return shards, samples
    starts = np.flatnonzero(np.concatenate(([True], shards[1:] != shards[:-1])))
    return shards[starts], np.add.reduceat(samples, starts)


def node_accesses(plans: Sequence, batch_sizes: Sequence[int], chunk_steps: int = 4096,
                  max_accesses: int = MAX_ACCESSES) -> tuple[np.ndarray, np.ndarray]:
    """The runs one node reads in one epoch: ``plans`` are its ranks' EpochPlans
    (same epoch), ``batch_sizes`` their batch sizes; step by step, rank by rank."""
    if len(plans) != len(batch_sizes):
        raise ValueError(f"{len(plans)} plans but {len(batch_sizes)} batch sizes; give one per rank of the node")
    steps = max(p.steps(b) for p, b in zip(plans, batch_sizes))
    out_s, out_n, held = [], [], 0
    for s0 in range(0, steps, chunk_steps):
        s1 = min(steps, s0 + chunk_steps)
        ids, keys = [], []
        for r, (p, b) in enumerate(zip(plans, batch_sizes)):
            a, z = min(p.num_samples, s0 * b), min(p.num_samples, s1 * b)
            x = p.positions(a, z)
            ids.append(np.searchsorted(p.offsets, x, side="right") - 1)
            keys.append((np.arange(a, z, dtype=np.int64) // b) * len(plans) + r)
        order = np.argsort(np.concatenate(keys), kind="stable")
        s, n = run_length(np.concatenate(ids)[order])
        held += s.shape[0]
        if held > max_accesses:
            raise ValueError(f"the node's shard sequence passed {max_accesses:,} runs at step {s1:,} of {steps:,}; "
                             "too long to simulate exactly: simulate fewer epochs or ranks, or pass a larger "
                             "max_accesses")
        out_s.append(s)
        out_n.append(n)
    if not out_s:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return _merge_runs(np.concatenate(out_s), np.concatenate(out_n))


def plan_accesses(spec, job, node: int = 0, epochs: Sequence[int] = (0,),
                  max_accesses: int = MAX_ACCESSES) -> Accesses:
    """Runs read by ``node`` of ``job`` (ranks ``node*ranks_per_node ...``) over ``epochs``,
    for a shuffling.spec.PlanSpec. Without batch sizes in the job, each rank is one step of all its samples."""
    rpn = job.ranks_per_node or job.world_size
    ranks = [r for r in range(node * rpn, min(job.world_size, (node + 1) * rpn))]
    if not ranks:
        raise ValueError(f"node {node} has no ranks: the job has {job.world_size} ranks, {rpn} per node")
    parts = []
    left = max_accesses
    for e in epochs:
        plans = [spec.plan(e, job, r) for r in ranks]
        bs = [job.batch_size(r) or max(1, p.num_samples) for r, p in zip(ranks, plans)]
        s, n = node_accesses(plans, bs, max_accesses=left)
        left -= s.shape[0]
        parts.append((s, n))
    return _join(parts)


@njit
def _next_use(shards, num_shards):
    n = shards.shape[0]
    nxt = np.empty(n, np.int64)
    last = np.full(num_shards, n, np.int64)  # n: never used again within the sequence
    for i in range(n - 1, -1, -1):
        nxt[i] = last[shards[i]]
        last[shards[i]] = i
    return nxt


@njit
def _simulate(shards, keys, sizes, limit):
    """Per access: bytes fetched. Evicts the cached shard with the largest key
    (Belady: next use; LRU: minus last use); a lazy max-heap of (key, shard)."""
    n = shards.shape[0]
    fetched = np.zeros(n, np.int64)
    cur = np.full(sizes.shape[0], -(1 << 62), np.int64)  # current key of a cached shard
    cached = np.zeros(sizes.shape[0], np.bool_)
    hk = np.empty(n + 1, np.int64)
    hs = np.empty(n + 1, np.int64)
    size = 0
    used = 0
    for i in range(n):
        x = shards[i]
        if not cached[x]:
            fetched[i] = sizes[x]
            if sizes[x] > limit:
                continue  # read through: it can never be kept
            while used + sizes[x] > limit:
                # pop until a live entry (its key is the shard's current one)
                while True:
                    k, s = hk[0], hs[0]
                    size -= 1
                    # sift down the last element from the root
                    lk, ls = hk[size], hs[size]
                    j = 0
                    while True:
                        c = 2 * j + 1
                        if c >= size:
                            break
                        if c + 1 < size and hk[c + 1] > hk[c]:
                            c += 1
                        if hk[c] <= lk:
                            break
                        hk[j], hs[j] = hk[c], hs[c]
                        j = c
                    if size > 0:
                        hk[j], hs[j] = lk, ls
                    if cached[s] and cur[s] == k:
                        break
                cached[s] = False
                used -= sizes[s]
            cached[x] = True
            used += sizes[x]
        cur[x] = keys[i]
        # push (keys[i], x); the shard's older entries go stale
        j = size
        size += 1
        while j > 0:
            p = (j - 1) // 2
            if hk[p] >= keys[i]:
                break
            hk[j], hs[j] = hk[p], hs[p]
            j = p
        hk[j], hs[j] = keys[i], x
    return fetched


def simulate(sizes, accesses, limit_bytes: int, policy="belady") -> np.ndarray:
    """Bytes fetched in each epoch of ``accesses`` (an Accesses, or shard ids
    as one epoch) by a cache of ``limit_bytes`` that starts empty."""
    policy = Policy(policy)
    sizes = np.asarray(sizes, np.int64)
    if not isinstance(accesses, Accesses):
        accesses = Accesses.of(accesses)
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, (int, np.integer)) or limit_bytes < 0:
        raise ValueError(f"limit_bytes={limit_bytes!r} must be an int >= 0 (the cache's byte budget)")
    shards = accesses.shards
    if shards.shape[0] and (shards.min() < 0 or shards.max() >= sizes.shape[0]):
        raise ValueError(f"shard ids run {shards.min()}..{shards.max()} but sizes lists {sizes.shape[0]} shards")
    if policy is Policy.BELADY:
        keys = _next_use(shards, sizes.shape[0])
    else:
        keys = -np.arange(shards.shape[0], dtype=np.int64)
    fetched = _simulate(shards, keys, sizes, int(limit_bytes))
    return np.array([int(fetched[a:b].sum()) for a, b in zip(accesses.bounds[:-1], accesses.bounds[1:])], np.int64)


def _is_sequence(seq) -> bool:
    """Whether ``seq`` is shards in read order (an Accesses, an array or a list of ids), not plans."""
    if isinstance(seq, (Accesses, np.ndarray)):
        return True
    return isinstance(seq, (list, tuple)) and all(isinstance(x, (int, np.integer)) for x in seq)


def expected_fetch(counts, sizes, plan_or_sequence, limit_bytes: int, policy="belady") -> int:
    """Bytes a whole-shard cache of ``limit_bytes`` fetches, starting empty.

    ``plan_or_sequence``: an EpochPlan (one rank reading alone), a list of
    the EpochPlans of one node's ranks (interleaved step by step with their
    own ``batch_size``, or one step each without one), an Accesses, or shard
    ids in read order. ``counts`` (samples per shard) must match the plans'.
    """
    seq = plan_or_sequence
    if not _is_sequence(seq):  # plans: one rank's, or a node's ranks'
        seq = list(seq) if isinstance(seq, (list, tuple)) else [seq]
        counts = np.asarray(counts, np.int64)
        for p in seq:
            if p.counts.shape != counts.shape or not np.array_equal(p.counts, counts):
                raise ValueError("the plans were built over other shard counts than `counts`; pass the "
                                 "dataset's counts (index.counts) that the plans were made from")
        bs = [p.batch_size or max(1, p.num_samples) for p in seq]
        s, n = node_accesses(seq, bs)
        seq = Accesses(s, n, np.array([0, s.shape[0]], np.int64))
    return int(simulate(sizes, seq, limit_bytes, policy).sum())


def block_window(sizes, limit_bytes: int, ranks_per_node: int = 1, margin_bytes: int | None = None) -> int:
    """The largest ``block`` window (shards) whose shards fit the budget.

    Each rank of a node keeps one window resident, so ``ranks_per_node``
    windows of the largest shards, plus ``margin_bytes`` for the prefetch
    window (default: one largest shard per rank, fetched ahead while the
    window is read), must fit ``limit_bytes``. Raises ValueError when not
    even a one-shard window fits, naming the budget that would.
    """
    sizes = np.sort(np.asarray(sizes, np.int64))[::-1]
    if sizes.shape[0] == 0:
        raise ValueError("no shards: a dataset with no shards has no block window")
    rpn = max(1, int(ranks_per_node))
    margin = rpn * int(sizes[0]) if margin_bytes is None else int(margin_bytes)
    room = (int(limit_bytes) - margin) // rpn
    w = int(np.searchsorted(np.cumsum(sizes), room, side="right"))
    if w < 1:
        raise ValueError(f"cache limit {int(limit_bytes):,} bytes holds no block window: one shard per rank "
                         f"({rpn} x {int(sizes[0]):,}) plus the prefetch margin {margin:,} needs "
                         f"{rpn * int(sizes[0]) + margin:,} bytes; raise the limit")
    return w




@njit
def _ranged(shards, samples, sizes, span, kept, limit, reserve, floor, window, claim):
    used = 0.0
    resident = np.zeros(sizes.shape[0], np.bool_)
    seen = np.zeros(sizes.shape[0], np.bool_)  # its sidecar is known: the cost model can price its ranges
    fetched = np.zeros(shards.shape[0], np.float64)
    n = shards.shape[0]
    for i in range(n):
        s = shards[i]
        if resident[s]:
            continue
        admit = used + kept[s] + claim + reserve <= limit
        if not admit and seen[s] and used + kept[s] + claim + floor <= limit:
            # into the reserve's part beyond the worst case when two or more of its samples
            # are read soon: one request for the shard is then cheaper than theirs
            k, r, j = 0.0, 0.0, i
            while j < n and r < window:
                if shards[j] == s:
                    k += samples[j]
                r += samples[j]
                j += 1
            admit = k >= 2
        if admit:
            resident[s] = True
            used += kept[s]
            fetched[i] = sizes[s]
        else:
            seen[s] = True
            fetched[i] = samples[i] * span[s]
    return fetched


def simulate_ranged(sizes, counts, accesses, limit_bytes: int, reserve_bytes: int, sidecar_share: float = 0.0,
                    span_bytes=None, floor_bytes: int | None = None, window: int = 0, kept_bytes=None,
                    claim_bytes: int = 0) -> np.ndarray:
    """Bytes of shards and sample ranges fetched in each epoch of ``accesses`` by the
    cache's policy for the global order (module docstring): a shard admitted whole
    costs its size once and keeps ``kept_bytes[s]`` of the budget (what the cache's budget
    charges it: cost_model.whole_charge, in the disk's blocks; default ``size * (1 +
    sidecar_share)``), its admission asking ``claim_bytes`` more (admission.claim's placeholder);
    any other read costs its sample's range, ``span_bytes[s]`` (default: the mean
    sample of the shard less the tar bytes no range reads). Sidecar bytes fetched
    are not counted (metadata).

    A shard is admitted while the whole shards leave ``reserve_bytes`` free; or, as
    RangePolicy.choose, while they leave ``floor_bytes`` (the worst case of the pins,
    at most the reserve) when it was read as ranges before and two or more of its
    samples are read within the next ``window`` reads (the prefetch window: the whole
    shard then costs one request, its ranges one each)."""
    sizes = np.asarray(sizes, np.float64)
    counts = np.maximum(np.asarray(counts, np.float64), 1)
    if not isinstance(accesses, Accesses):
        accesses = Accesses.of(accesses)
    if span_bytes is None:
        span_bytes = np.array([mean_span(a, n) for a, n in zip(sizes, counts)], np.float64)
    kept = sizes * (1 + float(sidecar_share)) if kept_bytes is None else np.asarray(kept_bytes, np.float64)
    floor = float(reserve_bytes if floor_bytes is None else min(floor_bytes, reserve_bytes))
    fetched = _ranged(accesses.shards, accesses.samples.astype(np.float64), sizes,
                      np.asarray(span_bytes, np.float64), kept, float(limit_bytes), float(reserve_bytes), floor,
                      float(window), float(claim_bytes))
    return np.array([int(fetched[a:b].sum()) for a, b in zip(accesses.bounds[:-1], accesses.bounds[1:])], np.int64)


def belady_bytes(reads, sizes, limit_bytes: int) -> int:
    """Bytes fetched by a cold cache of ``limit_bytes`` serving ``reads`` (shard
    numbers in order; a shard read by one step appears once per step) when
    shard ``s`` weighs ``sizes[s]`` bytes, evicting by Belady's rule (``simulate``).
    A shard larger than the limit is fetched at each read."""
    reads = np.asarray(reads, np.int64)
    each = Accesses(reads, np.ones(reads.shape[0], np.int64), np.array([0, reads.shape[0]], np.int64))
    return int(simulate(sizes, each, int(limit_bytes), Policy.BELADY).sum())  # each read its own run
