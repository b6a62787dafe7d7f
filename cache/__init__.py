"""Node-local shard cache, sources by URL scheme, and clairvoyant prefetch.

Stands on shardfeed.formats only (no torch, no loader). See store.py for the
life of a cache entry (REMOTE -> FETCHING -> LOCAL -> PINNED -> EVICTED).
"""

from shardfeed.cache.fetch import Cancelled, FetchOptions
from shardfeed.cache.prefetch import Prefetcher
from shardfeed.cache.remote_index import RemoteDataset, RemoteIndex, mirror_index, open_remote_index
from shardfeed.cache.sources import Source, open_source
from shardfeed.cache.store import CacheLimitError, ShardCache, ShardRef

__all__ = [
    "CacheLimitError", "Cancelled", "FetchOptions", "Prefetcher", "RemoteDataset", "ShardCache", "ShardRef",
    "RemoteIndex", "Source", "mirror_index", "open_remote_index", "open_source",
]
