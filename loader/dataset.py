"""ShardDataset: a torch IterableDataset over any dataset formats/ can read.

It owns what the data is (the index, decoding, transform, error policy) and
whose share of it this rank reads (order, seed, epoch, topology); plans come
from shardfeed.shuffling. Iterating it yields sample dicts, which is what a
plain ``torch.utils.data.DataLoader`` needs (its workers split the plan in
blocks, each sample once). ``Loader`` uses the same dataset but never builds
sample dicts unless a transform or collate_fn asks for them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.utils.data

from shardfeed.formats import ShardError, open_index
from shardfeed.formats.base.lazy import gc_paused
from shardfeed.formats.engine.read_modes import check_read_mode
from shardfeed.formats.errors import ReadError
from shardfeed.formats.index import INDEX_NAME, LOG_DIR, DatasetIndex
from shardfeed.loader import placement as _placement
from shardfeed.loader import state as _state
from shardfeed.loader.error_policy import ErrorPolicy
from shardfeed.loader.feeds import IDLE_TIMEOUT_S, POLL_S
from shardfeed.loader.feeds.epoch import EpochFeed
from shardfeed.loader.schedule import BatchSchedule
from shardfeed.shuffling import Order
from shardfeed.shuffling.spec import Job, PlanSpec
from shardfeed.shuffling.worker_split import steps_of

if TYPE_CHECKING:  # the read path and a followed stream's feed, imported when used (issue #24)
    from shardfeed.loader.batcher import BatchMaker
    from shardfeed.loader.feeds.follow import FollowFeed
    from shardfeed.loader.feeds.stream_log import RegrowMaker

_BLOCK = 64  # positions per block when a torch DataLoader's workers split a plan
# a followed dataset read sample by sample (a plain torch DataLoader): samples per rank in one step of its
# stream; a step forms once world x this many are published (or at the end commit), so it bounds the latency
_FOLLOW_STEP = 8


class ShardDataset(_placement.Placed, torch.utils.data.IterableDataset):
    """Samples ``{"__key__": str, FIELD: value}`` of this rank's share of an epoch.

    source: a dataset folder, a ``.tar`` file or a ``file://`` URL. shuffle:
    ``none``, ``shard``, ``block`` or ``global`` (shardfeed.shuffling.Order);
    ``True``/``False``, as in a torch DataLoader, are ``global``/``none``.
    decode: decode fields by extension (cls -> int, txt -> str, json, npy,
    images -> RGB uint8 HWC arrays; other extensions stay bytes); False keeps
    bytes. transform: a function of one sample (``transform(sample)`` or, if
    it has an ``image_size`` parameter, ``transform(sample, image_size=...)``
    with the loader's current stage). rank/world_size: default from
    torch.distributed, then RANK/WORLD_SIZE, then 0/1. on_error: ``raise``
    or ``skip`` (skip and count corrupt samples and shards).

    block_shards (``block`` only): shards per window (default 16); a step
    reads from at most one window's shards, so a smaller window needs a
    smaller cache and mixes less. shuffle_buffer (``shard`` only): samples in
    each rank's shuffle buffer (default 10,000); a step reads from the shards
    the buffer spans (about ``shuffle_buffer / samples per shard + 1``). Both
    are part of the order (a saved position applies only to the same values);
    the cache's start check names values that fit its limit when the defaults
    do not.

    locality (``global`` only): deal each global batch so that a rank reads
    mostly shards its own node owns (shard ``s`` is owned by node ``s %
    nodes``, the node whose cache holds it); every global batch still holds
    the same samples, only their split among ranks changes. Nodes are
    ``LOCAL_WORLD_SIZE`` consecutive ranks (torchrun sets it); with one node
    (or no LOCAL_WORLD_SIZE) it changes nothing. The dealing needs the batch
    size, so it applies to plans a ``Loader`` asks for; iterating the dataset
    directly (a plain torch DataLoader) deals without it.

    read_mode: how tar shards are read. ``"pread"`` (default) reads with
    preadv into the batch: RSS stays flat. ``"mmap"`` copies from each open
    shard's mapping: ~1.6x the samples/s for small (2 KiB) samples, but the
    page-cache pages read count in every reading process's RSS and grow with
    the shards touched, up to the open shards' total size (at most 256 open
    per process). Checksums are verified either way. Caveat of mmap: a shard
    truncated while a batch is being copied from it kills the process with
    SIGBUS (a shard found short before a batch is an error as in pread mode).

    follow: read a dataset that grows while it is read (a folder written by
    ``ShardWriter(append=True)``): a Loader delivers every published sample
    once across ranks, in commit order dealt in global batches (shuffled
    inside each unless ``shuffle="none"``), waits for new commits (polling
    every ``poll_s``; ShardError after ``idle_timeout_s`` without one) and
    ends at the end commit (``ShardWriter.end_stream()``); see
    loader/feeds/follow.py for the dealing and end rules. The whole stream is one
    epoch; ``len()`` is undefined. ``replay`` (a fraction in [0, 1)) fills
    that share of each global batch with older samples, drawn from the last
    ``window`` commits (None: all history), deterministically from the seed.

    Random access: ``ds[i]`` is sample ``i`` of the whole dataset in stored
    order and ``ds.get(key)`` finds a sample by key, both through the index
    and sidecars with checksums (loader/random_access.py).

    Remote sources and the node-local cache (shardfeed.cache; loader/caching.py):
    ``source`` may be a URL prefix of a dataset (``http(s)://``, ``s3://``,
    ``gs://`` and the other fsspec schemes; ``storage_options`` go to its
    fsspec filesystem). Its index is mirrored into the cache folder and its
    shards are read from verified copies there, at most ``cache_limit_bytes``
    on disk (an int, a size such as ``"50GB"``, or a float in (0, 1]: that share
    of the size of the cache folder's disk), fetched ahead of use by a Loader in
    order of next use. Without
    ``cache_dir`` a URL uses ``$SHARDFEED_CACHE_DIR``, else
    ``<tmp>/shardfeed-cache-<uid>`` (shared by every rank and job of the user
    on the node: entries are keyed by content hash), with a warning naming it.
    Without ``cache_limit_bytes`` the budget is 80% of what the cache folder's
    disk could hold. A local source with a ``cache_dir`` is read through the
    cache too (copies on local disk: useful when the dataset sits on NFS);
    without one it is read in place. ``follow=True`` on a URL follows its
    commit log through the cache (loader/remote_follow.py); on a local
    folder it reads in place (no cache_dir). Not available: ``ds[i]`` and
    ``ds.get(key)`` on a URL.
    """

    @gc_paused()
    def __init__(self, source, shuffle="global", seed: int = 0, cache_dir=None, cache_limit_bytes=None,
                 decode: bool = True, transform: Callable | None = None, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False, follow: bool = False,
                 on_error: str = "raise", locality: bool = False, read_mode: str = "pread",
                 poll_s: float = POLL_S, idle_timeout_s: float = IDLE_TIMEOUT_S, replay: float = 0.0,
                 window: int | None = None, storage_options: dict | None = None, block_shards: int | None = None,
                 shuffle_buffer: int | None = None):
        super().__init__()
        if not isinstance(source, (str, list, tuple)):
            source = os.fspath(source)
        from shardfeed.cache.fetching.url_schemes import check_url, is_remote

        remote = isinstance(source, str) and is_remote(source)
        if remote:  # a scheme without a reader fails here, before any cache is set up for it

            check_url(source)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {transform!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.source = source
        self.order = Order(shuffle)
        if locality and self.order is not Order.GLOBAL:
            raise ValueError(f"locality=True deals global batches by node and needs shuffle='global', got "
                             f"shuffle={self.order.value!r}; drop locality or use shuffle='global'")
        self.locality = bool(locality)
        self.block_shards, self.shuffle_buffer = _order_options(self.order, block_shards, shuffle_buffer)
        self.read_mode = check_read_mode(read_mode)
        self.seed = int(seed)
        self.decode = bool(decode)
        self.transform = transform
        self.drop_last = bool(drop_last)
        self.on_error = on_error
        self.policy = ErrorPolicy(on_error)
        self.topology = _placement.detect(rank, world_size)
        self.follow = bool(follow)
        self.poll_s, self.idle_timeout_s = poll_s, idle_timeout_s
        self.replay, self.window = replay, window
        if (replay or window is not None) and not self.follow:
            raise ValueError(f"replay={replay!r}/window={window!r} mix older samples into a followed stream; "
                             "pass follow=True or leave them at 0.0/None")
        if cache_limit_bytes is not None:  # an int, "50GB" or a share of the cache folder's disk
            from shardfeed.cache.readers.reads import default_cache_dir
            from shardfeed.formats.base.byte_sizes import parse_limit

            cache_limit_bytes = parse_limit(cache_limit_bytes, "cache_limit_bytes", lambda: cache_dir or default_cache_dir())
        self.cache = None  # a cache.reads.CacheSpec when shards are read through the node-local cache
        self._mirror = None  # a followed URL's mirror folder in the cache (loader/remote_follow.py)
        if self.follow and locality:
            raise ValueError("locality=True is not available with follow=True (a stream is dealt by "
                             "global batch in commit order); drop one of them")
        if self.follow and remote:
            from shardfeed.loader.remote_follow import open_followed

            self.cache, self.index, self._mirror = open_followed(source, cache_dir, cache_limit_bytes,
                                                                 storage_options, idle_timeout_s)
        elif remote or cache_dir is not None or cache_limit_bytes is not None:
            if self.follow:
                raise ValueError(f"{source}: follow=True on a local folder reads it in place, without the "
                                 "node-local cache (only a URL is followed through it); drop "
                                 "cache_dir/cache_limit_bytes or follow=True")
            from shardfeed.loader.caching import open_cached
            from shardfeed.loader.error_policy import with_credentials_hint

            try:
                self.cache, self.index = open_cached(source, cache_dir, cache_limit_bytes, storage_options)
            except ShardError as e:
                raise with_credentials_hint(e) from e.__cause__
        elif self.follow:
            self.index = _stream_index(_local_folder(source))  # may be empty: samples come later
        else:
            self.index = open_index(source, on_error=on_error)
            # a foreign tar that cannot be scanned, or a sample of one whose name is not UTF-8, is left
            # out under skip: logged once and counted each epoch, like any bad shard
            self.policy.leave_out([ReadError(path, reason, 0) for path, reason in self.index.skipped]
                                  + list(self.index.left_out))
        self.remote = remote
        if self.index.num_samples == 0 and not self.follow:
            raise ShardError(self.index.root, "dataset holds no samples")
        self.epoch = 0
        self.image_size: int | None = None  # set by a Loader's schedule
        self._spec: PlanSpec | None = None

    # -- plans ----------------------------------------------------------
    @property
    def spec(self) -> PlanSpec:
        """What this dataset shuffles and how (the input of every plan)."""
        if self._spec is None:
            self._spec = PlanSpec(self.index.counts, self.order, self.seed, drop_last=self.drop_last,
                                  locality=self.locality, block_shards=self.block_shards,
                                  buffer_size=self.shuffle_buffer)
        return self._spec

    def fingerprint(self) -> dict:
        """Plain data naming the data and the shuffle; a saved position applies only to the same."""
        if self.follow:  # a stream's size changes; what it is dealt by does not
            return {"follow": True, "order": self.order.value, "seed": self.seed, "drop_last": self.drop_last,
                    "replay": self.replay, "window": self.window}
        return _state.fingerprint(self)

    def identity(self) -> dict:
        """The data's content, named in a saved state beside the fingerprint: the index's
        content digest (a followed stream's identity is its first shard, known to its feed)."""
        if self.follow:
            return {}
        if self.__dict__.get("_digest") is None:
            self._digest = _state.index_digest(self.index)
        return {"digest": self._digest}

    def feed(self, schedule: BatchSchedule) -> EpochFeed | FollowFeed:
        """This rank's feed under ``schedule`` (what a Loader reads from):
        epochs of a fixed dataset, or the stream of a followed one."""
        t = self.topology
        if self.follow:
            from shardfeed.loader.feeds.follow import FollowFeed

            return FollowFeed(self.index.root, schedule, t.rank, t.world_size, seed=self.seed,
                              shuffle=self.order is not Order.NONE, drop_last=self.drop_last,
                              ranks_per_node=t.ranks_per_node, fingerprint=self.fingerprint(),
                              poll_s=self.poll_s, idle_timeout_s=self.idle_timeout_s, replay=self.replay,
                              window=self.window, source=self._log_source())
        return EpochFeed(self.spec, schedule, t.rank, t.world_size, t.ranks_per_node, self.fingerprint(),
                         epoch=self.epoch, identity=self.identity(), name=str(self.source))

    def _log_source(self):
        """A followed URL's LogMirror (each feed its own), None for a local folder."""
        if self.__dict__.get("_mirror") is None:
            return None
        from shardfeed.loader.remote_follow import log_source

        return log_source(str(self.source), self.cache)

    def unbatched_plan(self, epoch: int | None = None):
        """This rank's plan for reading sample by sample (a plain torch DataLoader, ``len()``)."""
        t = self.topology
        if self.follow:
            raise TypeError(f"{self.source}: a followed dataset has no fixed plan or length (it grows until its "
                            "end commit); read it through shardfeed.loader.Loader")
        return self.spec.plan(self.epoch if epoch is None else epoch, Job(t.world_size, None, t.ranks_per_node), t.rank)

    def __len__(self) -> int:
        return self.unbatched_plan().num_samples

    # -- random access --------------------------------------------------
    def _lookup(self):
        # built on first use; pickles to DataLoader workers without its open shards
        if self.remote:
            raise NotImplementedError(f"{self.source}: ds[i] and ds.get(key) read shards in place and are not "
                                      "available for a URL yet; iterate the dataset, or copy it locally")
        if self.__dict__.get("_random_access") is None:
            from shardfeed.loader.random_access import SampleLookup

            self._random_access = SampleLookup(self.index, decode=self.decode, transform=self.transform,
                                               on_error=self.on_error, image_size=self.image_size)
        return self._random_access

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Sample ``i`` of the whole dataset in stored order (``0 <= i < index.num_samples``,
        negative like a list), read through the index and sidecar with its checksum.
        Not this rank's epoch order: ``len(ds)`` is this rank's share of an epoch."""
        return self._lookup()[i]

    def get(self, key: str) -> dict[str, Any]:
        """The sample whose ``__key__`` is ``key`` (KeyError naming it if none)."""
        return self._lookup().get(key)

    def shard_url(self, i: int) -> str:
        """Where shard ``i`` is fetched from (a URL, or a local path)."""
        return self.index.path(i)

    def maker(self, collate_fn: Callable | None = None, decode: bool | None = None,
              readers: int = 1, ranges: bool = True) -> BatchMaker | RegrowMaker:
        """What reads this dataset's batches in one process; ``readers``: how many
        processes read at once (sizes what each keeps open in the cache)."""
        from shardfeed.loader.batcher import BatchMaker  # the read path: imported at the first read (issue #24)

        cached = None
        if self.cache is not None and self.follow:
            from shardfeed.loader.remote_follow import FollowedShards

            cached = FollowedShards(self.index, self.cache)
        elif self.cache is not None:
            from shardfeed.cache.readers.ranged_reads import RangedShards
            from shardfeed.loader.caching import node_ranks

            ranks = node_ranks(self.topology)  # every rank of the node shares the cache's budget
            # sample ranges for the global order only: the others read each shard's samples together
            cached = RangedShards(self.index, self.cache, self.shard_url, ranges=ranges and self.order is Order.GLOBAL,
                                  readers=readers * ranks, ranks=ranks)
            readers *= ranks
        maker = BatchMaker(self.index, decode=self.decode if decode is None else decode, transform=self.transform,
                           collate_fn=collate_fn, policy=self.policy, read_mode=self.read_mode, cached=cached,
                           readers=readers, in_order=self.order is Order.NONE)
        if not self.follow:
            return maker
        from shardfeed.loader.feeds.stream_log import RegrowMaker, stream_index  # a followed dataset only

        root = self.index.root
        regrow = functools.partial(stream_index, root)
        if self.__dict__.get("_mirror") is not None:
            from shardfeed.loader.remote_follow import followed_index

            regrow = functools.partial(followed_index, self._mirror, root)
        return RegrowMaker(maker, regrow, root,
                           "sample {id} is not published ({n} samples in the index and log): the log lost commits?")

    # -- iteration (sample dicts, for a plain torch DataLoader) ---------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.follow:
            yield from self._followed_samples(wid, nw)
            return
        plan = self.unbatched_plan()
        most = len(self.index) or 1  # shards one read may touch: bounded by a cache's budget
        if self.cache is not None:
            from shardfeed.cache.planning.sizing import split_by_shards
            from shardfeed.loader.caching import node_ranks, plain_read_shards

            most = plain_read_shards(self.cache.limit_bytes, self.index, nw * node_ranks(self.topology),
                                     self.cache.cache_dir, self.cache.open().budget.fixed_bytes())
        # a compressed shard is held decompressed while read: one at a time, so a block that crosses
        # several never holds them all at once (the budget of decoded_budget.py then bounds memory)
        compressed = any(f in ("tar.gz", "tar.zst") for f in self.index.formats)
        if compressed:
            most = 1
        # whole shards, in pieces sized to this reader's share: sample ranges need the Loader's plan and checks
        maker = self.maker(_as_samples, readers=nw, ranges=False)
        maker.stride = nw  # this reader's blocks are nw apart (compressed shards: hint)
        try:
            for b in steps_of(wid, nw, 0, -(-plan.num_samples // _BLOCK)):
                start, stop = b * _BLOCK, min(plan.num_samples, (b + 1) * _BLOCK)
                ids = plan.positions(start, stop)
                maker.hint(plan, start, stop)
                if self.cache is not None:
                    parts = split_by_shards(ids, self.index.offsets, most)
                else:
                    parts = _shard_runs(ids, self.index.offsets) if compressed else (ids,)
                for part in parts:
                    samples, info = maker.make(part, self.image_size)
                    self.policy.report(info["errors"])
                    yield from samples
                    samples = None  # not held while the next part is read (a block of large samples)
        finally:
            maker.close()

    def _followed_samples(self, wid: int, nw: int) -> Iterator[dict[str, Any]]:
        """A followed stream sample by sample: this rank's steps of the stream (a Loader's rule, steps of
        ``_FOLLOW_STEP`` samples a rank), step ``s`` read by DataLoader worker ``s % nw``; every worker
        walks the same steps (waiting for commits alike), so each published sample comes once."""
        feed = self.feed(BatchSchedule.of(_FOLLOW_STEP))
        maker = self.maker(_as_samples, readers=nw)
        try:
            for item in feed:
                if item.step % nw == wid:
                    samples, info = maker.make(item.ids(), self.image_size)
                    self.policy.report(info["errors"])
                    yield from samples
        finally:
            maker.close()

    def __repr__(self) -> str:
        return (f"ShardDataset({self.source!r}, shuffle={self.order.value!r}, seed={self.seed}, "
                f"{'locality=True, ' if self.locality else ''}"
                f"{'read_mode=' + repr(self.read_mode) + ', ' if self.read_mode != 'pread' else ''}"
                f"rank={self.rank}/{self.world_size}, samples={self.index.num_samples})")


def _order_options(order: Order, block_shards, shuffle_buffer) -> tuple[int, int]:
    """(block_shards, shuffle_buffer) checked: each belongs to one order; None is its default."""
    from shardfeed.shuffling.plan import DEFAULT_BLOCK_SHARDS, DEFAULT_BUFFER_SIZE

    for name, value, owner in (("block_shards", block_shards, Order.BLOCK), ("shuffle_buffer", shuffle_buffer, Order.SHARD)):
        if value is None:
            continue
        if order is not owner:
            raise ValueError(f"{name}={value!r} sets the {owner.value!r} order; it has no effect with "
                             f"shuffle={order.value!r}: drop it or use shuffle={owner.value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    return (DEFAULT_BLOCK_SHARDS if block_shards is None else int(block_shards),
            DEFAULT_BUFFER_SIZE if shuffle_buffer is None else int(shuffle_buffer))


def _local_folder(source: str) -> str:
    folder = source.removeprefix("file://")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ShardError(source, "follow=True needs the folder of a growing dataset (ShardWriter(append=True)); "
                                 "this is not a folder")
    return folder


def _stream_index(folder: str) -> DatasetIndex:
    """What a followed folder has published; empty while no dataset is there yet (a follower
    may start before its writer: its feed waits for the dataset under the idle timeout)."""
    if not (os.path.exists(os.path.join(folder, INDEX_NAME)) or os.path.isdir(os.path.join(folder, LOG_DIR))):
        return DatasetIndex(folder, [], [], [], [], [], (), {"folded_seq": 0, "seen_seq": 0})
    from shardfeed.formats.commit_log import open_stream_index  # a followed dataset only

    return open_stream_index(folder)[0]


def _shard_runs(ids: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """``ids`` cut, in order, into runs of one shard each."""
    shard = np.searchsorted(offsets, ids, side="right") - 1
    return np.split(ids, np.flatnonzero(np.diff(shard)) + 1)


def _as_samples(samples: list[dict]) -> list[dict]:
    return samples

