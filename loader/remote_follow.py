"""``follow=True`` on a remote dataset (``http(s)://``, ``s3://``) through the node cache.

The follow feed is the local one (feeds/follow.py): its StreamLog reads the
dataset's mirror in the cache folder, which a ``cache.log_mirror.LogMirror``
brings up to date before each poll (conditional requests; one request per
poll while nothing is committed). So delivery, the end, waiting and saved
states follow the local rules exactly; only where the commits come from
differs. Shards of new commits are fetched by the readers through the cache
as they first read them, each checked against the hash its commit records.

Readers in worker processes take the grown index from the mirror
(``followed_index``), never from the source: the feed deals only commits
the mirror holds. The readers keep no shard open between reads
(``FollowedShards.keep_open``): a stream's shard sizes are not known when
the budget is sized, so pins last one read.

A follower runs as long as its writer, so a server's bad minute must not end
it: its fetches (shards, sidecars, log entries) retry faults for
``FOLLOW_RETRY_S`` seconds, not only five tries (cache/fetch.py), unless
``SHARDFEED_FETCH_RETRY_S`` says otherwise; never longer than its
``idle_timeout_s``, the wait its docs promise (a poll that retried a 503 storm
for a minute held back the idle timeout of 6 s for that minute).
"""

from __future__ import annotations

import dataclasses
import os

from shardfeed.cache.readers.reads import CachedShards

FOLLOW_RETRY_S = 60.0  # a follower's fetches ride out faults this long (a 503 storm, a restarting server)


def open_followed(url: str, cache_dir, limit_bytes, storage_options, idle_timeout_s: float = FOLLOW_RETRY_S):
    """(CacheSpec, index of what the stream has published so far, mirror folder) of a followed
    URL. The dataset need not exist yet: its index is then empty, and the feed waits for it."""
    from shardfeed.cache.remote.log_mirror import LogMirror
    from shardfeed.loader.caching import cache_spec

    url = url.rstrip("/")
    spec = cache_spec(url, cache_dir, limit_bytes, storage_options)
    if not os.environ.get("SHARDFEED_FETCH_RETRY_S"):
        window = min(FOLLOW_RETRY_S, idle_timeout_s) if idle_timeout_s > 0 else FOLLOW_RETRY_S  # the feed refuses <= 0
        spec = dataclasses.replace(spec, fetch=dataclasses.replace(spec.fetch, retry_s=window))
    mirror = LogMirror(url, spec.open())
    mirror.sync()
    return spec, _index(mirror.folder, url, mirror.have if mirror.exists else None, mirror.exists), mirror.folder


def log_source(url: str, spec):
    """A feed's own LogMirror of ``url`` (each feed polls for itself; the mirror folder is shared)."""
    from shardfeed.cache.remote.log_mirror import LogMirror

    return LogMirror(url.rstrip("/"), spec.open())


def followed_index(folder: str, url: str):
    """Every shard the mirror at ``folder`` holds, named by ``url`` (a picklable regrow)."""
    return _index(folder, url, None, True)


def _index(folder: str, url: str, upto, exists: bool):
    from shardfeed.formats.commit_log import open_stream_index
    from shardfeed.formats.index import DatasetIndex

    if not exists:
        index = DatasetIndex(folder, [], [], [], [], [], (), {"folded_seq": 0, "seen_seq": 0})
    else:
        index = open_stream_index(folder, upto=upto)[0]
    index.root = url  # shard paths and messages name the source, not the mirror
    return index


class FollowedShards(CachedShards):
    """CachedShards over an index that grows (``update_index``), each shard fetched at its URL."""

    keep_open = False

    def __init__(self, index, spec):
        super().__init__(index, spec, None)
        self.url_of = self._url

    def _url(self, i: int) -> str:
        return self.index.path(i)

    def update_index(self, index) -> None:
        self.index = index
