"""A mixture's counts per epoch: weights or counts (or a curriculum of them) -> exact ints.

Counts are a pure function of the epoch (largest-remainder apportionment of
the epoch's length by the weights) and, with ``epoch_steps``, of the global
batch of the job reading it, so every rank and a resumed run take the same;
``starts_from`` sums the earlier epochs' counts (where each source's own
stream stands at an epoch's start). A ``MixtureCounts`` is a frozen value:
what a feed has taken from a saved state, and what it remembers of earlier
epochs, is the feed's own (loader/feeds/mixture_epochs.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardfeed.shuffling.apportion import apportion

MAX_EPOCH_SAMPLES = 1 << 32  # keeps the exact rank arithmetic inside int64


def stages(value, name: str) -> Callable[[int], list] | None:
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


@dataclass(frozen=True)
class MixtureCounts:
    """Samples of each of ``names``' sources per epoch (see the module docstring).

    weights / counts: per-epoch rules from ``stages`` (one of them). epoch_samples:
    the epoch's length with weights; epoch_steps: the length in steps instead,
    ``epoch_steps * global_batch`` with the global batch of the job reading the
    epoch (the caller passes it: one Mixture may be read by jobs of several sizes)."""

    names: tuple[str, ...]
    weights: Callable | None
    counts: Callable | None
    epoch_samples: int
    epoch_steps: int | None = None

    def at(self, epoch: int, global_batch: int | None = None) -> list[int]:
        """Samples of each source in ``epoch`` (exact, the same on every rank and run); with
        epoch_steps, for a job of ``global_batch`` samples per step."""
        if self.counts is not None:
            raw = list(self.counts(epoch))
            what = "counts"
        else:
            raw = list(self.weights(epoch))
            what = "weights"
        self.check(raw, what, epoch)
        if what == "counts":
            if any(int(v) != v for v in raw):
                raise ValueError(f"counts of epoch {epoch} = {raw!r} must be whole numbers of samples")
            out = [int(v) for v in raw]
        else:
            out = apportion(self.epoch_length(epoch, global_batch), raw)
        if sum(out) >= MAX_EPOCH_SAMPLES:
            raise ValueError(f"epoch {epoch} mixes {sum(out)} samples; at most {MAX_EPOCH_SAMPLES - 1} per epoch "
                             "(split it into shorter epochs)")
        return out

    def weights_at(self, epoch: int) -> list:
        raw = list(self.weights(epoch))
        self.check(raw, "weights", epoch)
        return raw

    def check(self, raw: list, what: str, epoch: int) -> None:
        """One finite number >= 0 per source, not all zero (NaN and inf have no share of a count)."""
        m = len(self.names)
        bad = [i for i, v in enumerate(raw) if isinstance(v, bool)
               or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) or v < 0]
        if len(raw) != m or bad or sum(raw) <= 0:
            why = (f"{what}[{bad[0]}]={raw[bad[0]]!r} is not a finite number >= 0" if bad and len(raw) == m
                   else f"{len(raw)} given" if len(raw) != m else "all are zero")
            raise ValueError(f"{what} of epoch {epoch} = {raw!r}: {why}; give one number >= 0 per source, "
                             f"finite ({m} sources: {list(self.names)}), not all zero")

    def per_batch(self, G: int) -> list[int]:
        """A stream mixture's samples per source in each global batch of ``G``."""
        return apportion(G, self.weights_at(0))

    def epoch_length(self, epoch: int, global_batch: int | None = None) -> int:
        if self.epoch_steps is None:
            return self.epoch_samples
        if global_batch is None:
            raise TypeError(f"Mixture(epoch_steps={self.epoch_steps}): the epoch's samples depend on the batch "
                            "size of the Loader that reads it; ask the Loader (len(loader) is the epoch's steps), "
                            "or give epoch_samples")
        return self.epoch_steps * global_batch

    def split_of(self, epoch: int, total: int) -> list[int]:
        """The weights' split of ``total`` samples in ``epoch`` (what ``at`` gives for that length)."""
        return apportion(total, list(self.weights(epoch)))

    def total(self, epoch: int, global_batch: int | None = None) -> int:
        return sum(self.at(epoch, global_batch))


def starts_from(counts_of: Callable[[int], list[int]], epoch: int, since: int, starts: list[int]) -> list[int]:
    """Each source's stream position at the start of ``epoch``: ``starts`` (the positions at the start
    of epoch ``since`` <= ``epoch``) plus the counts of the epochs between, ``counts_of(e)`` each."""
    acc = list(starts)
    for e in range(since, epoch):
        acc = [a + c for a, c in zip(acc, counts_of(e))]
    return acc
