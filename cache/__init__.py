"""Node-local shard cache, sources by URL scheme, and clairvoyant prefetch.

Stands on shardfeed.formats only (no torch, no loader). See store.py for the
life of a cache entry (REMOTE -> FETCHING -> LOCAL -> PINNED -> EVICTED).
"""

from typing import TYPE_CHECKING

from shardfeed.formats.base.lazy import exports

if TYPE_CHECKING:  # what the names are, for type checkers; at run time each is imported on first use
    from shardfeed.cache.fetching.fetch import Cancelled, FetchOptions
    from shardfeed.cache.fetching.source_contract import Source
    from shardfeed.cache.fetching.url_sources import open_source
    from shardfeed.cache.planning.user_prefetch import Prefetcher
    from shardfeed.cache.remote.remote_index import RemoteDataset, RemoteIndex, mirror_index, open_remote_index
    from shardfeed.cache.storage.store import CacheLimitError, ShardCache, ShardRef

# public name -> the submodule that defines it (formats/base/lazy.py: nothing is imported until asked for)
_EXPORTS = {
    "Cancelled": "fetching.fetch",
    "FetchOptions": "fetching.fetch",
    "Prefetcher": "planning.user_prefetch",
    "RemoteDataset": "remote.remote_index",
    "RemoteIndex": "remote.remote_index",
    "mirror_index": "remote.remote_index",
    "open_remote_index": "remote.remote_index",
    "Source": "fetching.source_contract",
    "open_source": "fetching.url_sources",
    "CacheLimitError": "storage.store",
    "ShardCache": "storage.store",
    "ShardRef": "storage.store",
}
__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "CacheLimitError", "Cancelled", "FetchOptions", "Prefetcher", "RemoteDataset", "ShardCache", "ShardRef",
    "RemoteIndex", "Source", "mirror_index", "open_remote_index", "open_source",
]
