"""Mixture: several datasets read as one, with exact per-epoch counts.

``Mixture(sources, weights=None, counts=None, epoch_samples=None, seed=0)``
is accepted by ``Loader`` like a ShardDataset. Per epoch it takes an exact
number of samples from each source (largest-remainder apportionment of
``epoch_samples`` by the weights, or the ``counts`` given), repeats a source
with fewer samples than its count and sub-samples one with more (each source
walks its own permutation over its own epochs, so nothing repeats before
every sample came once), and interleaves the sources evenly in every batch.
How positions become samples is in mixture_feed.py.

Curriculum: ``weights`` (or ``counts``) may change by epoch: a callable
``epoch -> list``, or a list of stages ``[(epochs, list), ...]`` where the last
stage lasts forever. Counts are a pure function of the epoch, so a resumed
run takes exactly the same ones (the state carries them and refuses a
mismatch).

All sources are read through one combined index (their shards one after
another), so one BatchMaker in each worker reads every source with the
Mixture's decode / transform / on_error / read_mode; a source's own
transform is not used. A source's order and seed are its own (a
ShardDataset given as a source keeps them; a path gets ``shuffle`` and a
seed derived from ``seed`` and its position).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from shardfeed.formats.index import DatasetIndex
from shardfeed.loader import state as _state
from shardfeed.loader import topology as _topology
from shardfeed.loader.batcher import BatchMaker
from shardfeed.loader.dataset import ShardDataset
from shardfeed.loader.errors import ErrorPolicy
from shardfeed.loader.mixture_feed import MAX_EPOCH_SAMPLES, MixtureFeed
from shardfeed.loader.schedule import BatchSchedule


def apportion(total: int, weights) -> list[int]:
    """``total`` split by ``weights`` exactly (Hamilton's largest remainder; ties to the lower index)."""
    w = [Fraction(x) for x in weights]
    s = sum(w)
    quotas = [total * x / s for x in w]
    out = [int(q) for q in quotas]
    order = sorted(range(len(w)), key=lambda i: (-(quotas[i] - out[i]), i))
    for i in order[:total - sum(out)]:
        out[i] += 1
    return out


def _stages(value, name: str) -> Callable[[int], list] | None:
    """A per-epoch rule from a fixed list, a callable, or [(epochs, list), ...]."""
    if value is None:
        return None
    if callable(value):
        return value
    value = list(value)
    if value and all(isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[1], (tuple, list))
                     for v in value):
        stages = [(int(e), list(v)) for e, v in value]
        if any(e < 1 for e, _ in stages):
            raise ValueError(f"{name}={value!r}: every stage needs epochs >= 1")

        def at(epoch: int) -> list:
            for e, v in stages:
                if epoch < e:
                    return v
                epoch -= e
            return stages[-1][1]

        return at
    return lambda epoch: value


class Mixture:
    """Several datasets mixed with exact per-epoch counts (see the module docstring).

    sources: paths / URLs or ShardDataset objects. weights: one number >= 0
    per source (default: the sources' sizes), or a schedule of them. counts:
    samples per source per epoch (or a schedule), instead of weights.
    epoch_samples: samples per epoch with weights (default: all sources'
    samples). epoch_steps: the epoch length in steps instead: each epoch
    mixes ``epoch_steps * G`` samples, G being the global batch (all ranks'
    batch sizes summed) of that epoch's stage, so every epoch is exactly
    ``epoch_steps`` steps (known once a Loader made the feed).

    One source may be a ShardDataset(follow=True) (a growing dataset): the
    mixture is then one stream that ends with it, each global batch taking
    ``apportion(G, weights)`` samples per source (the followed source's
    samples each exactly once); ``weights`` is required, epoch_samples,
    epoch_steps and counts do not apply (mixture_stream.py).
    """

    def __init__(self, sources, weights=None, counts=None, epoch_samples: int | None = None,
                 epoch_steps: int | None = None, seed: int = 0,
                 shuffle: str = "global", decode: bool = True, transform: Callable | None = None,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 on_error: str = "raise", read_mode: str = "pread"):
        if isinstance(sources, (str, os.PathLike, ShardDataset)) or not sources:
            raise ValueError(f"sources={sources!r} must be a non-empty list of dataset paths or ShardDatasets")
        if weights is not None and counts is not None:
            raise ValueError("give weights or counts, not both")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.seed = int(seed)
        self.sources: list[ShardDataset] = []
        self.stream: int | None = None  # the followed source, if any
        for i, s in enumerate(sources):
            if not isinstance(s, ShardDataset):
                s = ShardDataset(s, shuffle=shuffle, seed=self.seed * 1_000_003 + i, rank=0, world_size=1)
            if s.follow:
                if self.stream is not None:
                    raise NotImplementedError(f"sources {self.stream} and {i} both have follow=True: one followed "
                                              "source per Mixture (write both streams into one growing dataset)")
                if s.replay:
                    raise ValueError(f"source {i} ({s.source}) has replay={s.replay}: in a Mixture the fixed "
                                     "sources are the replay; drop replay= from the followed source")
                self.stream = i
            self.sources.append(s)
        if self.stream is not None:
            if len(self.sources) < 2:
                raise ValueError("a Mixture with a followed source needs at least one fixed source beside it")
            if weights is None or counts is not None or epoch_samples is not None or epoch_steps is not None:
                raise ValueError(f"source {self.stream} follows a growing dataset: give weights= (each global batch "
                                 "takes apportion(G, weights) samples per source); counts, epoch_samples and "
                                 "epoch_steps have no meaning for a stream")
            if callable(weights) or (list(weights) and isinstance(list(weights)[0], (tuple, list))):
                raise ValueError("a Mixture with a followed source is one stream: give one fixed list of weights, "
                                 "not a curriculum")
        self.names = [s.source for s in self.sources]
        self.sizes = [int(s.index.num_samples) for s in self.sources]
        if epoch_samples is not None and (isinstance(epoch_samples, bool) or not isinstance(epoch_samples, int)
                                          or epoch_samples < 1):
            raise ValueError(f"epoch_samples={epoch_samples!r} must be an int >= 1")
        if epoch_steps is not None and (isinstance(epoch_steps, bool) or not isinstance(epoch_steps, int)
                                        or epoch_steps < 1):
            raise ValueError(f"epoch_steps={epoch_steps!r} must be an int >= 1")
        if epoch_steps is not None and (epoch_samples is not None or counts is not None):
            raise ValueError("give the epoch length once: epoch_steps (with weights), epoch_samples, or counts")
        self.epoch_steps = epoch_steps
        self._global_batch: Callable[[int], int] | None = None  # epoch -> G, set by feed() for epoch_steps
        self.epoch_samples = sum(self.sizes) if epoch_samples is None else epoch_samples
        self._weights = _stages(weights, "weights")
        self._counts = _stages(counts, "counts")
        if self._weights is None and self._counts is None:
            self._weights = _stages(self.sizes, "weights")
        self.decode, self.transform, self.read_mode = bool(decode), transform, read_mode
        self.drop_last = bool(drop_last)
        self.on_error = on_error
        self.policy = ErrorPolicy(on_error)
        self.topology = _topology.detect(rank, world_size)
        self.follow = self.stream is not None
        self.epoch = 0
        self.image_size: int | None = None
        self._memo: dict[int, list[int]] = {}
        self._starts: list[tuple[int, list[int]]] = [(0, [0] * len(self.sources))]
        self.index = self._combined_index()
        if epoch_steps is None and self.stream is None:
            self.counts_at(0)
        elif self.stream is not None:
            self.weights_at(0)  # check the first epoch's counts now

    # -- topology and epochs ------------------------------------------
    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        self.epoch = int(epoch)

    # -- counts ------------------------------------------------------------
    def counts_at(self, epoch: int) -> list[int]:
        """Samples of each source in ``epoch`` (exact, the same on every rank and run)."""
        got = self._memo.get(epoch)
        if got is not None:
            return got
        if self._counts is not None:
            raw = list(self._counts(epoch))
            what = "counts"
        else:
            raw = list(self._weights(epoch))
            what = "weights"
        self._check_numbers(raw, what, epoch)
        if what == "counts":
            if any(int(v) != v for v in raw):
                raise ValueError(f"counts of epoch {epoch} = {raw!r} must be whole numbers of samples")
            out = [int(v) for v in raw]
        else:
            out = apportion(self._epoch_length(epoch), raw)
        if sum(out) >= MAX_EPOCH_SAMPLES:
            raise ValueError(f"epoch {epoch} mixes {sum(out)} samples; at most {MAX_EPOCH_SAMPLES - 1} per epoch "
                             "(split it into shorter epochs)")
        self._memo[epoch] = out
        return out

    def weights_at(self, epoch: int) -> list:
        raw = list(self._weights(epoch))
        self._check_numbers(raw, "weights", epoch)
        return raw

    def _check_numbers(self, raw: list, what: str, epoch: int) -> None:
        """One finite number >= 0 per source, not all zero (NaN and inf have no share of a count)."""
        m = len(self.sources)
        bad = [i for i, v in enumerate(raw) if isinstance(v, bool)
               or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) or v < 0]
        if len(raw) != m or bad or sum(raw) <= 0:
            why = (f"{what}[{bad[0]}]={raw[bad[0]]!r} is not a finite number >= 0" if bad and len(raw) == m
                   else f"{len(raw)} given" if len(raw) != m else "all are zero")
            raise ValueError(f"{what} of epoch {epoch} = {raw!r}: {why}; give one number >= 0 per source, "
                             f"finite ({m} sources: {self.names}), not all zero")

    def batch_counts(self, G: int) -> list[int]:
        """A stream mixture's samples per source in each global batch of ``G``."""
        return apportion(G, self.weights_at(0))

    def _epoch_length(self, epoch: int) -> int:
        if self.epoch_steps is None:
            return self.epoch_samples
        if self._global_batch is None:
            raise TypeError(f"Mixture(epoch_steps={self.epoch_steps}): the epoch's samples depend on the batch "
                            "size; create the Loader first (it sets the batch sizes), or give epoch_samples")
        return self.epoch_steps * self._global_batch(epoch)

    def pin_epoch(self, epoch: int, counts: list[int], starts: list[int]) -> None:
        """Take ``epoch``'s counts and start positions from a saved state (epoch_steps: a job of
        another global batch size mixes what the saving job mixed, not what its own G gives)."""
        self._memo = {epoch: list(counts)}
        self._starts = [(epoch, list(starts))]

    def epoch_total(self, epoch: int) -> int:
        return sum(self.counts_at(epoch))

    def starts_at(self, epoch: int) -> list[int]:
        """Each source's stream position at the start of ``epoch`` (the counts of earlier epochs summed)."""
        e, acc = self._starts[-1]
        if e > epoch:
            e, acc = self._starts[0]
        if e > epoch:  # before a pinned epoch (epoch_steps resume): recount from the start
            self._starts = [(0, [0] * len(self.sources))]
            e, acc = self._starts[0]
        acc = list(acc)
        while e < epoch:
            acc = [a + c for a, c in zip(acc, self.counts_at(e))]
            e += 1
        if e > self._starts[-1][0]:
            self._starts.append((e, acc))
            del self._starts[1:-1]
        return acc

    # -- what a Loader needs -----------------------------------------------
    def specs(self):
        return [None if i == self.stream else s.spec for i, s in enumerate(self.sources)]

    def layout(self) -> list[int]:
        """Sources in combined-index order: a followed source last, so it grows at the end."""
        m = len(self.sources)
        return [i for i in range(m) if i != self.stream] + ([self.stream] if self.stream is not None else [])

    def offsets(self) -> list[int]:
        out, acc = [0] * len(self.sources), 0
        for i in self.layout():
            out[i] = acc
            acc += self.sizes[i]
        return out

    def fingerprint(self) -> dict:
        if self.stream is not None:  # the stream's size changes; what it is dealt by does not
            return {"mixture": [["follow", s.order.value, s.seed] if i == self.stream else
                                [s.index.num_samples, len(s.index), s.order.value, s.seed]
                                for i, s in enumerate(self.sources)],
                    "weights": [float(w) for w in self.weights_at(0)], "drop_last": self.drop_last}
        fp = {"mixture": [[s.index.num_samples, len(s.index), s.order.value, s.seed] for s in self.sources],
              "epoch_samples": self.epoch_samples, "drop_last": self.drop_last}
        if self.epoch_steps is not None:
            fp["epoch_steps"] = self.epoch_steps
        return fp

    def identity(self) -> dict:
        """Each source's content digest (None for a followed source: its feed names the stream)."""
        if self.__dict__.get("_digests") is None:
            self._digests = [None if i == self.stream else _state.index_digest(s.index)
                             for i, s in enumerate(self.sources)]
        return {"digests": list(self._digests)}

    def feed(self, schedule: BatchSchedule) -> MixtureFeed:
        t = self.topology
        if self.stream is not None:
            from shardfeed.loader.mixture_stream import MixtureStreamFeed

            return MixtureStreamFeed(self, schedule, t.rank, t.world_size, t.ranks_per_node)
        feed = MixtureFeed(self, schedule, t.rank, t.world_size, t.ranks_per_node, epoch=self.epoch)
        if self.epoch_steps is not None:
            self._global_batch = lambda epoch: sum(feed.job(epoch).batch_sizes)
            self._memo.clear()
            self._starts = [(0, [0] * len(self.sources))]
            self.counts_at(self.epoch)
        return feed

    def maker(self, collate_fn: Callable | None = None, decode: bool | None = None) -> BatchMaker:
        maker = BatchMaker(self.index, decode=self.decode if decode is None else decode, transform=self.transform,
                           collate_fn=collate_fn, policy=self.policy, read_mode=self.read_mode)
        if self.stream is None:
            return maker
        from shardfeed.loader.mixture_stream import MixtureFollowMaker

        return MixtureFollowMaker(maker, self)

    def grown_index(self) -> DatasetIndex:
        """The combined index with the followed source's shards published since it was opened."""
        from shardfeed.formats.commit_log import open_stream_index

        src = self.sources[self.stream]
        return self._combined_index({self.stream: open_stream_index(src.index.root)[0]})

    def unbatched_plan(self, epoch: int | None = None):
        """This rank's plan dealt one sample per rank per step (warms a worker's jitted code)."""
        if self.stream is not None:
            raise TypeError("a Mixture with a followed source has no fixed plan (it grows until its end commit)")
        feed = self.feed(BatchSchedule.of(1))
        return feed.plan(self.epoch if epoch is None else epoch)

    def source_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Combined ids -> (source, id inside the source)."""
        order = np.asarray(self.layout(), np.int64)
        off = np.asarray(self.offsets(), np.int64)
        src = order[np.searchsorted(off[order], ids, side="right") - 1]
        return src, ids - off[src]

    def __len__(self) -> int:
        """This rank's samples of the current epoch (equal shares; padding included)."""
        if self.stream is not None:
            raise TypeError("a Mixture with a followed source has no length (it grows until its end commit)")
        n, w = self.epoch_total(self.epoch), self.world_size
        return n // w if self.drop_last else -(-n // w)

    def _combined_index(self, grown: dict | None = None) -> DatasetIndex:
        roots = [os.path.abspath(s.index.root.removeprefix("file://")) for s in self.sources]
        root = os.path.commonpath(roots) if len(set(roots)) > 1 else roots[0]
        names, formats, counts, sizes, hashes, fields, tables = [], [], [], [], [], [], {}
        for i in self.layout():
            s, r = self.sources[i], roots[i]
            index = (grown or {}).get(i, s.index)
            if "://" in s.index.root and not s.index.root.startswith("file://"):
                raise NotImplementedError(f"{s.index.root}: remote sources are not mixed yet")
            rel = os.path.relpath(r, root)
            prefix = "" if rel in ("", ".") else rel.replace(os.sep, "/") + "/"
            for row, table in index.tables.items():
                tables[len(names) + row] = table
            names += [prefix + n for n in index.names]
            formats += index.formats
            counts += index.counts.tolist()
            sizes += index.sizes.tolist()
            hashes += index.hashes
            fields += [f for f in index.fields if f not in fields]
        idx = DatasetIndex(root, names, formats, counts, sizes, hashes, fields, {"mixture": True})
        idx.tables = tables
        return idx

    def __repr__(self) -> str:
        what = (f"weights={self.weights_at(0)}, follows source {self.stream}" if self.stream is not None
                else f"counts(epoch {self.epoch})={self.counts_at(self.epoch)}")
        return f"Mixture({self.names!r}, {what}, rank={self.rank}/{self.world_size})"
