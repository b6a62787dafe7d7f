"""Plans of a mixture: several sources' own orders interleaved into one stream.

- Epoch ``e`` takes ``counts[i]`` samples of source ``i``. Source ``i`` is
  read as an endless stream: its own permutation of source-epoch 0, then of
  source-epoch 1, ... (the source's PlanSpec at world size 1); mixture epoch
  ``e`` takes the stream's positions ``[C_i(e), C_i(e) + counts[i])`` where
  ``C_i(e)`` sums the counts of the earlier epochs (mixture_counts.py).
- The epoch's global stream of ``N = sum(counts)`` positions interleaves the
  sources by Webster / Sainte-Lague apportionment: the k-th item of source
  ``i`` sorts at ``(2k+1) / counts[i]`` (ties: lower source first). Every
  prefix of length ``t`` holds ``t * counts[i] / N`` items of source ``i``
  within +-1 per source, so no source comes in runs. An item's position has
  a closed form (``_ranks``), so a range of positions is computed without
  materialising the epoch.
- ``MixturePlan`` deals that stream to ranks with a ``StreamPlan`` (global
  batches, a proportional tail); ``StreamMixPlan`` mixes a followed stream
  with fixed sources, ``counts[i]`` of each per global batch.

Ids are ids of the mixture's combined index (the sources' shards one after
another). Pure arithmetic, pickled to workers.
"""

from __future__ import annotations

import numpy as np

from shardfeed.shuffling.apportion import tail_shares
from shardfeed.shuffling.spec import Job
from shardfeed.shuffling.stream_plans import StreamPlan


def _ranks(counts: list[int], i: int, k: np.ndarray) -> np.ndarray:
    """Global positions of items ``k`` of source ``i`` in the interleaved epoch."""
    ci = counts[i]
    two_k1 = 2 * k + 1
    pos = k.copy()
    for j, cj in enumerate(counts):
        if j == i or cj == 0:
            continue
        num = two_k1 * cj - ci
        if j < i:  # items of j with key <= ours come first
            c = num // (2 * ci) + 1
        else:      # strictly smaller keys only
            c = -((-num) // (2 * ci))
        pos += np.clip(c, 0, cj)
    return pos


def interleave(counts: list[int], a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, k) of the epoch's positions [a, b): position t is item k of source[t]."""
    n = sum(counts)
    m = len(counts)
    src = np.full(b - a, -1, np.int64)
    kk = np.empty(b - a, np.int64)
    for i, ci in enumerate(counts):
        if ci == 0:
            continue
        lo = max(0, a * ci // n - m - 2)
        hi = min(ci, -(-b * ci // n) + m + 2)
        if lo >= hi:
            continue
        k = np.arange(lo, hi, dtype=np.int64)
        pos = _ranks(counts, i, k)
        sel = (pos >= a) & (pos < b)
        src[pos[sel] - a] = i
        kk[pos[sel] - a] = k[sel]
    if (src < 0).any():  # the window bound is a theorem; a guard, never silent
        raise RuntimeError(f"interleave of counts {counts} left positions of [{a}, {b}) unfilled")
    return src, kk


class MixturePlan:
    """One rank's positions of one job of a mixed epoch -> combined sample ids.
    Plain data (pickled once to each worker)."""

    def __init__(self, specs, offsets, counts, starts, deal: StreamPlan):
        self.specs = specs            # PlanSpec per source (its own order and seed)
        self.offsets = list(offsets)  # first combined id of each source
        self.counts = list(counts)    # samples of each source this epoch
        self.starts = list(starts)    # each source's stream position at the epoch's start
        self.deal = deal
        self.num_samples = sum(self.counts)
        self._plans: dict = {}

    def _source_plan(self, i: int, q: int):
        key = (i, q)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 2 * len(self.specs):
                self._plans.clear()
            plan = self._plans[key] = self.specs[i].plan(q, Job(1), 0)
        return plan

    def source_ids(self, i: int, p0: int, p1: int) -> np.ndarray:
        """Ids (in source i) of its stream positions [p0, p1)."""
        n = self.specs[i].num_samples
        out = []
        p = p0
        while p < p1:
            q, r = divmod(p, n)
            m = min(p1 - p, n - r)
            out.append(self._source_plan(i, q).positions(r, r + m))
            p += m
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def stream(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, id in source) of the epoch's stream positions ``t``."""
        if t.size == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        lo, hi = int(t.min()), int(t.max()) + 1
        src_all, k_all = interleave(self.counts, lo, hi)
        src, k = src_all[t - lo], k_all[t - lo]
        ids = np.empty(t.size, np.int64)
        for i in np.unique(src).tolist():
            sel = src == i
            p = self.starts[i] + k[sel]
            p0 = int(p.min())
            ids[sel] = self.source_ids(i, p0, int(p.max()) + 1)[p - p0]
        return src, ids

    def positions(self, start: int, stop: int) -> np.ndarray:
        src, ids = self.stream(self.deal.positions(start, stop))
        return ids + np.asarray(self.offsets, np.int64)[src]

    def __getstate__(self):
        return {**self.__dict__, "_plans": {}}


class StreamMixPlan:
    """One rank's positions of one job -> combined ids. Plain data (pickled to workers)."""

    def __init__(self, specs, offsets, counts, stream: int, base: int, fixed, batch_sizes, rank: int, seed: int,
                 shuffle: bool, full: int | None = None, tail: int = 0):
        self.offsets, self.counts, self.stream = list(offsets), list(counts), int(stream)
        self.base, self.fixed = int(base), list(fixed)
        self.batch_sizes, self.rank = tuple(batch_sizes), int(rank)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.G, self.bs, self.pre = sum(self.batch_sizes), self.batch_sizes[rank], sum(self.batch_sizes[:rank])
        self.per = self.counts[self.stream]
        self.full, self.tail = full, int(tail)
        self.shares = tail_shares(self.tail, self.batch_sizes) if self.tail else None
        self._walk = MixturePlan(specs, offsets, counts, [0] * len(counts), None)  # fixed sources' own orders
        self._layout = interleave(self.counts, 0, self.G)
        self._last: tuple[int, np.ndarray] | None = None

    def _perm(self, first: int, n: int) -> np.ndarray | None:
        if not self.shuffle or n <= 1:
            return None
        return np.random.default_rng([self.seed, first]).permutation(n)

    def global_batch(self, g: int) -> np.ndarray:
        """The ``G`` combined ids of full global batch ``g`` of this job, in deal order."""
        if self._last is not None and self._last[0] == g:
            return self._last[1]
        src, k = self._layout
        ids = np.empty(self.G, np.int64)
        for i, c in enumerate(self.counts):
            if c == 0:
                continue
            sel = src == i
            if i == self.stream:
                first = self.base + g * c
                perm = self._perm(first, c)
                ids[sel] = self.offsets[i] + first + (perm[k[sel]] if perm is not None else k[sel])
            else:
                p0 = self.fixed[i] + g * c
                ids[sel] = self.offsets[i] + self._walk.source_ids(i, p0, p0 + c)[k[sel]]
        self._last = (g, ids)
        return ids

    def positions(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(max(0, stop - start), np.int64)
        k, i = start, 0
        while k < stop:
            g, j = divmod(k, self.bs)
            if self.full is not None and g >= self.full:  # the tail: stream samples only
                first = self.base + self.full * self.per
                lo, n = self.shares[self.rank]
                m = min(stop - k, max(n, 1) - j)
                q = np.arange(lo + j, lo + j + m, dtype=np.int64) if n else np.full(m, self.rank % self.tail, np.int64)
                perm = self._perm(first, self.tail)
                out[i:i + m] = self.offsets[self.stream] + first + (perm[q] if perm is not None else q)
            else:
                m = min(stop - k, self.bs - j)
                out[i:i + m] = self.global_batch(g)[self.pre + j:self.pre + j + m]
            k += m
            i += m
        return out

    def __getstate__(self):
        return {**self.__dict__, "_last": None}
