"""Plans of a stream dealt in global batches (a followed dataset, a mixed epoch).

``StreamPlan`` maps one rank's positions to stream sample ids: global batch
``g`` is the ``G = sum(batch sizes)`` ids ``[base + g*per, ...)``, shuffled
inside by (seed, first id), rank ``r`` takes its slice, and the stream's last
short batch is split by ``tail_shares``. ``IdsPlan`` is one step of explicit
ids; ``replay_ids`` draws a replay step's ids (new samples plus older ones
from a window of commits). Pure arithmetic over ints, pickled to workers.
"""

from __future__ import annotations

import numpy as np

from shardfeed.shuffling.apportion import tail_shares


class IdsPlan:
    """Explicit ids of one step (a replay step, whose old samples depend on the
    log): positions [0, len) of this step."""

    tail = 0  # never the stream's short last step (that one is a StreamPlan)

    def __init__(self, ids: np.ndarray):
        self.ids = np.asarray(ids, np.int64)

    def positions(self, start: int, stop: int) -> np.ndarray:
        return self.ids[start:stop]


class StreamPlan:
    """Rank ``rank``'s positions -> stream sample ids, for the job that starts
    at stream position ``base``. Pure arithmetic, pickled once to workers.
    ``tail``: the sample count of the stream's last short global batch (set
    only once the end is committed)."""

    def __init__(self, base: int, batch_sizes: tuple[int, ...], rank: int, seed: int, shuffle: bool,
                 full: int | None = None, tail: int = 0, per: int | None = None):
        self.base, self.batch_sizes, self.rank = int(base), tuple(batch_sizes), int(rank)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.G = sum(self.batch_sizes)
        self.bs = self.batch_sizes[rank]
        self.pre = sum(self.batch_sizes[:rank])
        self.full, self.tail = full, int(tail)  # full: global batches before the tail (known at the end)
        self.per = self.G if per is None else int(per)  # new stream samples per full global batch
        self.shares = tail_shares(self.tail, self.batch_sizes) if self.tail else None

    def _perm(self, start: int, n: int) -> np.ndarray | None:
        if not self.shuffle or n <= 1:
            return None
        return np.random.default_rng([self.seed, start]).permutation(n)

    def positions(self, start: int, stop: int) -> np.ndarray:
        """Ids of this rank's positions [start, stop) (whole steps or parts of them)."""
        out = np.empty(max(0, stop - start), np.int64)
        k, i = start, 0
        while k < stop:
            g, j = divmod(k, self.bs)
            if self.full is not None and g >= self.full:
                # the tail: this rank's share of the last short global batch
                first = self.base + self.full * self.per
                lo, n = self.shares[self.rank]
                m = min(stop - k, max(n, 1) - j)
                # a rank with no share repeats one tail sample (padding, only when tail < world size)
                q = np.arange(lo + j, lo + j + m, dtype=np.int64) if n else np.full(m, self.rank % self.tail, np.int64)
                perm = self._perm(first, self.tail)
                out[i:i + m] = first + (perm[q] if perm is not None else q)
            else:
                first = self.base + g * self.G
                m = min(stop - k, self.bs - j)
                q = np.arange(self.pre + j, self.pre + j + m, dtype=np.int64)
                perm = self._perm(first, self.G)
                out[i:i + m] = first + (perm[q] if perm is not None else q)
            k += m
            i += m
        return out

    def __repr__(self) -> str:
        return f"StreamPlan(base={self.base}, batch_sizes={self.batch_sizes}, rank={self.rank}, tail={self.tail})"


def replay_ids(base: int, g: int, per: int, sizes: tuple[int, ...], rank: int, seed: int, shuffle: bool,
               offsets: np.ndarray, window: int | None) -> np.ndarray:
    """This rank's ids of full global batch ``g`` of a job with replay:
    ``per`` new samples, then ``G - per`` old ones drawn (with repeats)
    from the samples before them in the last ``window`` commits (the
    newest commit being the one holding the batch's last new sample;
    ``offsets``: the published shards' cumulative sample counts), all from
    (seed, first new id); shuffled inside the batch like plain ones. At the
    stream's start, with nothing older, the batch's own new samples are drawn."""
    G = sum(sizes)
    hi = base + g * per
    new = np.arange(hi, hi + per, dtype=np.int64)
    lo = 0
    if window is not None:
        newest = int(np.searchsorted(offsets, hi + per - 1, side="right")) - 1
        lo = int(offsets[max(0, newest - window + 1)])
    rng = np.random.default_rng([seed, hi, 1])
    old = lo + rng.integers(0, hi - lo, G - per) if hi > lo else rng.choice(new, G - per)
    batch = np.concatenate([new, old.astype(np.int64)])
    if shuffle:
        batch = batch[np.random.default_rng([seed, hi]).permutation(G)]
    pre = sum(sizes[:rank])
    return batch[pre:pre + sizes[rank]]
