"""Mixture: several datasets read as one, with exact per-epoch counts.

``Mixture(sources, weights=None, counts=None, epoch_samples=None, seed=0)``
is accepted by ``Loader`` like a ShardDataset. Per epoch it takes an exact
number of samples from each source (largest-remainder apportionment of
``epoch_samples`` by the weights, or the ``counts`` given), repeats a source
with fewer samples than its count and sub-samples one with more (each source
walks its own permutation over its own epochs, so nothing repeats before
every sample came once), and interleaves the sources evenly in every batch.
How positions become samples is in shuffling/mixture_plans.py and loader/feeds/mixture_epochs.py.

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

import os
from collections.abc import Callable

import numpy as np

from shardfeed.formats.index import DatasetIndex
from shardfeed.loader import placement as _placement
from shardfeed.loader import state as _state
from shardfeed.loader.batcher import BatchMaker
from shardfeed.loader.dataset import ShardDataset
from shardfeed.loader.error_policy import ErrorPolicy
from shardfeed.loader.feeds.combined_index import combined_index
from shardfeed.loader.feeds.mixture_epochs import MixtureFeed
from shardfeed.loader.feeds.mixture_stream import MixtureStreamFeed
from shardfeed.loader.feeds.stream_log import RegrowMaker
from shardfeed.loader.schedule import BatchSchedule
from shardfeed.shuffling.mixture_counts import MixtureCounts, stages


class Mixture(_placement.Placed):
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
    epoch_steps and counts do not apply (loader/feeds/mixture_stream.py).
    """

    # what the Loader asks a dataset, as ShardDataset declares it: a mixture's batches are made by
    # one BatchMaker over its combined index, never through the node cache
    cache = None

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
                if s.__dict__.get("_mirror") is not None:
                    raise NotImplementedError(f"source {i} ({s.source}) follows a URL: a Mixture follows a local "
                                              "folder only (its combined index reads the stream in place); "
                                              "follow the URL alone, or mix a local growing folder")
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
        self.epoch_samples = sum(self.sizes) if epoch_samples is None else epoch_samples
        by_weight, by_count = stages(weights, "weights"), stages(counts, "counts")
        if by_weight is None and by_count is None:
            by_weight = stages(self.sizes, "weights")
        self.mixing = MixtureCounts(tuple(self.names), by_weight, by_count, self.epoch_samples, epoch_steps)
        self.decode, self.transform, self.read_mode = bool(decode), transform, read_mode
        self.drop_last = bool(drop_last)
        self.on_error = on_error
        self.policy = ErrorPolicy(on_error)
        self.policy.left_out = sum(s.policy.left_out for s in self.sources)  # logged by each source already
        self.topology = _placement.detect(rank, world_size)
        self.follow = self.stream is not None
        self.epoch = 0
        self.image_size: int | None = None
        self.index = combined_index(self.sources, self.layout())
        if epoch_steps is None and self.stream is None:
            self.counts_at(0)
        elif self.stream is not None:
            self.weights_at(0)  # check the first epoch's counts now

    # -- topology and epochs ------------------------------------------
    # -- counts (shuffling.mixture_counts) -----------------------------------
    def counts_at(self, epoch: int) -> list[int]:
        """Samples of each source in ``epoch`` (exact, the same on every rank and run). With
        epoch_steps they depend on the reading job's batch size: its Loader's feed knows them."""
        return self.mixing.at(epoch)

    def weights_at(self, epoch: int) -> list:
        return self.mixing.weights_at(epoch)

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
            return MixtureStreamFeed(self, schedule, t.rank, t.world_size, t.ranks_per_node)
        return MixtureFeed(self, schedule, t.rank, t.world_size, t.ranks_per_node, epoch=self.epoch)

    def maker(self, collate_fn: Callable | None = None, decode: bool | None = None) -> BatchMaker:
        maker = BatchMaker(self.index, decode=self.decode if decode is None else decode, transform=self.transform,
                           collate_fn=collate_fn, policy=self.policy, read_mode=self.read_mode)
        if self.stream is None:
            return maker
        return RegrowMaker(maker, self.grown_index, self.sources[self.stream].index.root,
                           "combined sample {id} is not published ({n} samples in the mixture's index): "
                           "the stream's log lost commits?")

    def grown_index(self) -> DatasetIndex:
        """The combined index with the followed source's shards published since it was opened."""
        from shardfeed.formats.commit_log import open_stream_index

        src = self.sources[self.stream]
        return combined_index(self.sources, self.layout(), {self.stream: open_stream_index(src.index.root)[0]})

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
        n, w = self.mixing.total(self.epoch), self.world_size
        return n // w if self.drop_last else -(-n // w)

    def __repr__(self) -> str:
        what = (f"weights={self.weights_at(0)}, follows source {self.stream}" if self.stream is not None
                else f"epoch_steps={self.epoch_steps}, weights(epoch {self.epoch})={self.weights_at(self.epoch)}"
                if self.epoch_steps is not None  # the counts are its Loaders' (they depend on the batch size)
                else f"counts(epoch {self.epoch})={self.counts_at(self.epoch)}")
        return f"Mixture({self.names!r}, {what}, rank={self.rank}/{self.world_size})"
