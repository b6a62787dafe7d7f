"""The shard-access contract: what a batch maker reads of a reader's shards through the node cache.

A batch maker (loader/batcher.py) reads shards through one of these when they
come through the node-local cache. Every member the loader uses is declared
here, with a default where one holds for a plain whole-shard cache, so the
loader calls members and never probes for them:

    access.path_of(s)         # the local file of shard s, fetched if need be, pinned
    access.release(s)         # unpin it (the reader closed the file)
    access.refetch(s)         # discard a copy found damaged: the next open fetches again
    access.shard_of_path(p)   # the shard whose cached file (or source) is p, if any
    access.take()             # counters since the last take()
    access.close()            # release every pin
    access.keep_open          # may the reader keep shards open between reads (a stream's: no)
    access.ranged             # may misses come as sample ranges now
    token = access.prepare(ids); ...; access.finish(token)   # around each batch read
    access.forget_view        # set by the maker: closes its open view of a shard
    access.batch_step         # set by the maker: the plan's step of the batch read now
    access.update_index(ix)   # the index grew (a followed stream's)

Implementations: cache/reads.py ``CachedShards`` (whole shards),
cache/ranged_reads.py ``RangedShards`` (sample ranges), loader/remote_follow.py
``FollowedShards`` (a growing index at its URLs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable


class ShardAccess(ABC):
    """A reader's shards through the node cache (see the module docstring)."""

    index: object  # the DatasetIndex the shard numbers refer to
    spec: object  # the CacheSpec (cache/reads.py): where the cache lives and its budget

    # pins may outlast a read (the reader keeps shards open up to its max_open); False:
    # a stream's shard sizes are unknown when its budget is sized, so it keeps none
    keep_open: bool = True
    # (shard) -> None, set by the batch maker: closes its open view of a shard between reads
    forget_view: Callable[[int], None] | None = None
    # the plan's step of the batch read now, set by the batch maker before prepare (None: unknown)
    batch_step: int | None = None

    @property
    def ranged(self) -> bool:
        """Whether misses may come as sample ranges now (a whole-shard cache: never)."""
        return False

    @abstractmethod
    def path_of(self, i: int) -> str: ...

    @abstractmethod
    def release(self, i: int) -> None: ...

    @abstractmethod
    def refetch(self, i: int) -> bool: ...

    @abstractmethod
    def shard_of_path(self, path: str) -> int | None: ...

    @abstractmethod
    def take(self) -> dict: ...

    @abstractmethod
    def close(self) -> None: ...

    def prepare(self, ids) -> list:
        """Before a batch read of ``ids``: what it needs present and pinned; the token for
        finish(). A whole-shard cache brings each shard at path_of: nothing to do."""
        return []

    def finish(self, token) -> None:
        """After the batch read that ``prepare`` returned ``token`` for (a whole-shard cache: nothing)."""
        return None

    def update_index(self, index) -> None:
        """The index grew (shards published since it was opened): resolve them too."""
        raise TypeError(f"{type(self).__name__} reads a fixed index and cannot take a grown one "
                        "(only a followed dataset's shards grow: FollowedShards)")
