"""Samples this process's readers consumed, by the step they were read at.

A prefetch for the readers' next step races the readers for its samples. A
prefetch that took a partial copy's fetch lock after a reader had read a
sample and punched it out (ranges.py) found it missing and fetched it again,
for nothing: on a loaded machine, 10-28 samples per epoch of a 1,024-sample
dataset (test_cache_ranges: the epoch's bytes past its bound). A reader notes
what it consumed before punching, under no lock; a prefetch for that step
checks the note under the copy's lock, so it sees every punch before its own.

Only this process's readers are seen (a Loader without workers). Workers
read the steps the prefetcher leaves to them (loader/caching.py, ``busy``).
Only the last few steps are kept: the prefetcher never fetches for a step
the readers passed.
"""

from __future__ import annotations

import threading

import numpy as np

KEEP_STEPS = 4  # the readers' step, the one before, and room for a batch read twice (batcher._read_again)


class Consumed:
    def __init__(self):
        self._by_step: dict[int, dict[str, set[int]]] = {}
        self._mu = threading.Lock()

    def note(self, step: int, url: str, local) -> None:
        """Samples ``local`` of ``url`` were read at ``step`` and may be punched out now."""
        with self._mu:
            got = self._by_step.setdefault(int(step), {}).setdefault(url, set())
            got.update(np.asarray(local, np.int64).tolist())
            while len(self._by_step) > KEEP_STEPS:
                del self._by_step[min(self._by_step)]

    def at(self, step: int, url: str, local: np.ndarray) -> np.ndarray:
        """Which of ``local`` (of ``url``) were read at ``step`` already (a bool mask)."""
        with self._mu:
            got = self._by_step.get(int(step), {}).get(url)
            if not got:
                return np.zeros(len(local), np.bool_)
            return np.fromiter((int(i) in got for i in local), np.bool_, len(local))
