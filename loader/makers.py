"""The batch-maker contract: what the Loader, its workers and the read-ahead call on a maker.

A maker turns a step's sample ids into a batch in one process (the main one at
``num_workers=0``, or a worker). Every member they use is declared here, with
a default where one holds, so they call members and never probe for them:

    maker.make(ids, image_size, alloc)  # -> (columns, info)
    maker.hint(plan, start, stop)       # this batch's positions; its next ones are stride apart
    maker.stride                        # steps between this maker's batches (its Loader's workers)
    maker.inner()                       # the maker that reads (a wrapper's wrapped one)
    maker.batch_key / restore_rng       # the next batch's seed key; put the global RNGs back after it
    maker.gather_into_bytes()           # read large byte fields straight into the bytes handed out
    maker.reader                        # its Reader (below)
    maker.cached                        # its cache.shard_access.ShardAccess, or None (local shards)
    maker.close()

Makers: loader/batcher.py ``BatchMaker`` (reads), loader/feeds/stream_log.py
``RegrowMaker`` (a BatchMaker over data that grows).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Reader(Protocol):
    """What a maker's reader (formats/engine/batch.py ``BatchReader``) is asked by the loader."""

    @property
    def index(self): ...

    def read(self, ids, alloc: Callable[[int], np.ndarray] | None = None): ...

    def update_index(self, index) -> None: ...

    def warm(self) -> None: ...

    def allow_threads(self, n: int) -> None: ...

    def close(self) -> None: ...


class Maker(ABC):
    """A batch maker (see the module docstring)."""

    stride: int = 1  # steps between this maker's batches (a worker reads every num_workers-th)
    # (seed, epoch, step, rank) of the next make(), set by the Loader (loader/batch_seeds.py); None: unseeded
    batch_key: tuple[int, ...] | None = None
    restore_rng: bool = True  # put the process's global RNG states back after a batch (False in a worker)
    cached = None  # a cache.shard_access.ShardAccess when shards come through the node cache
    reader: Reader  # an attribute or a property of each maker (tests/cache/test_reader_contract.py checks it)

    @abstractmethod
    def make(self, ids: np.ndarray, image_size: int | None = None,
             alloc: Callable[[int], np.ndarray] | None = None) -> tuple[Any, dict]: ...

    @abstractmethod
    def close(self) -> None: ...

    def inner(self) -> Maker:
        """The maker that reads: itself, or the one a wrapper wraps (whose seed key and RNG it sets)."""
        return self

    def let_go(self) -> None:
        """Close the shards kept open between reads that no read holds now (a finished epoch: through
        the node cache their pins would hold room another Loader of the node waits for, as an evaluation
        read through the cache of a training Loader left open did, 300 s a fetch). Default: none."""
        return None

    def hint(self, plan, start: int, stop: int) -> None:
        """This maker's batch is positions ``[start, stop)`` of ``plan`` (its next ones
        ``stride`` apart): a maker may start on them. Default: nothing to start."""
        return None

    def gather_into_bytes(self) -> bool:
        """Read large undecoded byte fields straight into the ``bytes`` handed out, if it can
        (True); for the process that hands them out. Default: it cannot."""
        return False
