"""Per-batch randomness for a transform and a collate_fn.

Before a batch's samples are transformed, the process that runs the
transform (the main one at ``num_workers=0``, a worker otherwise) seeds
torch's CPU generator, numpy's global RNG and ``random`` from one key,
``(seed, epoch, step, rank)`` (plus the number of world-size changes of the
epoch after an elastic resume, which restarts the step count). ``step`` is
the batch's step in the epoch's plan, so the draws do not depend on
``num_workers`` or on where a run was resumed, and forked workers no longer
share one inherited RNG state. A transform that takes an ``rng`` keyword
gets a ``numpy.random.Generator`` seeded from the same key (one per batch,
drawn from sample by sample in batch order).

In the main process (``num_workers=0``) the previous global states are put
back after the batch, so a training loop's own randomness is untouched
(saving and restoring numpy's state costs ~0.4 ms a batch); a worker's
globals are the loader's own and are left seeded. Only the CPU torch
generator is touched (``torch.manual_seed`` would also reseed CUDA's).
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import numpy as np
import torch

_MASK = (1 << 64) - 1


def _words(key: tuple[int, ...]) -> np.ndarray:
    # SeedSequence takes non-negative ints: a negative seed maps to its 64-bit two's complement
    return np.random.SeedSequence([int(k) & _MASK for k in key]).generate_state(8, np.uint32)


def generator(key: tuple[int, ...]) -> np.random.Generator:
    """The ``rng`` handed to a transform for the batch of ``key``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) & _MASK for k in key] + [1])))


@contextmanager
def seeded(key: tuple[int, ...], restore: bool = True):
    """Global RNGs (torch CPU, numpy, random) seeded from ``key`` inside; restored after if ``restore``."""
    w = _words(key)
    gen = torch.default_generator
    saved = (gen.get_state(), np.random.get_state(), random.getstate()) if restore else None
    gen.manual_seed(int(w[0]) | int(w[1]) << 32)
    np.random.seed(w[2:6])
    random.seed(int(w[6]) | int(w[7]) << 32)
    try:
        yield
    finally:
        if saved is not None:
            gen.set_state(saved[0])
            np.random.set_state(saved[1])
            random.setstate(saved[2])


def in_worker(maker) -> None:
    """``maker`` runs in a loader worker: its seeded globals need not be put back."""
    maker.inner().restore_rng = False


def set_batch(maker, key: tuple[int, ...] | None) -> None:
    """The key of the batch ``maker.make()`` makes next."""
    maker.inner().batch_key = key
