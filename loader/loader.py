"""Loader: batches of a ShardDataset, prefetched by worker processes, resumable.

The Loader only delivers. What comes next is the feed's business
(loader/feeds/: epochs, steps, stages, elastic history, streams); the Loader asks it for
work items, hands step ``s`` to worker ``s % num_workers`` (workers.py),
which reads, decodes and collates it into a shared-memory slot (shm.py),
and takes batches back in step order, so the sequence is the same for any
``num_workers``, including 0 (no processes at all).

Epochs: a finished epoch moves the loader to the next one; ``set_epoch(e)``
jumps to epoch ``e`` (and is a no-op when ``e`` is the current epoch, so a
training loop that calls it every epoch keeps a resumed mid-epoch position).

State (``state_dict()``): the feed's state after the last delivered batch,
under one versioned key, see state.py.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from shardfeed.formats.base.lazy import first_gc_paused
from shardfeed.loader import autotune
from shardfeed.loader import state as _state
from shardfeed.loader.dataset import ShardDataset
from shardfeed.loader.schedule import BatchSchedule, Stage
from shardfeed.loader.stats import LoaderStats
from shardfeed.loader.views import check_bytes_as
from shardfeed.shuffling.worker_split import worker_of

if TYPE_CHECKING:  # the worker processes' module (multiprocessing, pipes, shm): imported when workers start
    from shardfeed.loader.workers import WorkerPool


class Loader:
    """Iterates batches (dict of tensors and lists) of ``dataset`` for this rank.

    batch_size: an int; or a list with one batch size per rank, the same list
    on every rank (each rank's share of the epoch is proportional to its
    batch size and every rank takes the same number of steps); or a
    schedule over epochs: a ``BatchSchedule`` of ``Stage(batch_size,
    image_size, epochs)``, or a callable ``epoch -> int | list | Stage``.
    num_workers: worker processes (0: read in this process), or ``"auto"``:
    chosen at the first iteration from the measured time to make a batch, the
    consumer's step and the free cores (autotune.py; ``stats()["autotune"]``
    says what and why; the batches are the same whatever is chosen). prefetch:
    batches each worker may have ready ahead of the consumer (so up to
    ``prefetch * num_workers`` are in flight), or ``"auto"``: chosen from the
    same probe, deep enough to ride out the slowest probed batch where the
    workers keep up (``stats()["autotune"]["prefetch"]``). collate_fn: ``list of sample
    dicts -> batch`` (default: numbers and same-shaped arrays stacked into
    tensors, bytes and str as lists). pin_memory: pin tensors (only where an
    accelerator exists; otherwise a warning and no pinning, as in torch).
    multiprocessing_context: how workers start: ``"fork"`` (the default where
    it exists: fast, the index is inherited), ``"spawn"`` or
    ``"forkserver"`` (the dataset, transform and collate_fn are pickled to
    each worker, so they must be picklable, as with torch's DataLoader), or
    a multiprocessing context.
    bytes_as: undecoded byte fields as ``"bytes"`` (a list of bytes, copied;
    the default), ``"tensor"`` (a list of uint8 tensors viewing the batch
    buffer, no copy) or ``"jagged"`` (one torch.nested jagged tensor over that
    buffer); views are valid until the next batch is asked for, ``.clone()``
    one to keep it (views.py).
    """

    def __init__(self, dataset: ShardDataset, batch_size, num_workers: int | str = 0, prefetch: int | str = 2,
                 collate_fn: Callable | None = None, pin_memory: bool = False, multiprocessing_context=None,
                 audit: bool = False, bytes_as: str = "bytes"):
        # a Mixture exists only once its module is imported: a plain read never imports mixture.py
        mixture = sys.modules.get("shardfeed.loader.mixture")
        if not isinstance(dataset, (ShardDataset, mixture.Mixture) if mixture else ShardDataset):
            raise TypeError(f"dataset must be a shardfeed.loader.ShardDataset or Mixture, got {type(dataset).__name__}")
        # "auto": chosen from a probe of the first batches and the free cores (autotune.py)
        self._auto, num_workers, prefetch = autotune.requested(num_workers, prefetch)
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {collate_fn!r}")
        self.dataset = dataset
        self.schedule = BatchSchedule.of(batch_size)
        self.feed = dataset.feed(self.schedule)  # checks the batch size(s) against the world size now
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.collate_fn = collate_fn
        if pin_memory and not torch.cuda.is_available():
            warnings.warn("pin_memory=True but no accelerator is available: batches are not pinned", stacklevel=2)
            pin_memory = False
        self.pin_memory = pin_memory
        self.bytes_as = check_bytes_as(bytes_as)
        # Remote datasets fork workers too (a script without a __main__ guard works as with a
        # local path): fsspec's event-loop thread does not come along, so each worker makes its
        # own filesystems after the fork (cache/sources.py), and the pool forks before the
        # prefetch threads start (_iterate).
        self.mp_context = multiprocessing_context
        self.policy = dataset.policy
        # The feed runs ahead of the consumer (prefetch); this is the feed's
        # state after the last batch the consumer actually received.
        self._pos = self.feed.get_state()
        self._pool: WorkerPool | None = None
        self._maker = None
        self._read_ahead = False  # a batch read on a thread while the last is out (_allow_threads decides)
        self._stats = LoaderStats()
        self._cache = None  # the prefetcher of a dataset read through the node-local cache (caching.py)
        # a followed URL has no prefetcher: its readers fetch each new shard on first read (remote_follow.py)
        if dataset.cache is not None and not dataset.follow:
            from shardfeed.loader.caching import LoaderCache

            if self._auto is not None:  # the cache's budget is checked for its readers before any batch
                autotune.from_cores(self)
            self._cache = LoaderCache(dataset, self.schedule, self.num_workers)
            index = dataset.index  # fetched_ratio is per byte of the dataset, as `shardfeed plan` says it
            self._stats.sample_bytes = int(index.num_bytes) / max(1, int(index.num_samples))
        self._closed = False
        self._gen = 0  # iteration generation: an older iterator stops when a new one starts
        self._rebalances, self._balance_log = 0, None  # rebalances and their log (balancer.py)
        # audit=True records what this rank delivered, a bit per sample (audit.py)
        self._audit = None
        if audit:
            from shardfeed.loader.audit import AuditRecorder

            self._audit = AuditRecorder(self.feed)

    # -- epochs and stages ---------------------------------------------
    def stage(self, epoch: int | None = None) -> Stage:
        """The schedule's stage of ``epoch`` (default: the current one), checked against the world size."""
        epoch = self.epoch if epoch is None else epoch
        self.feed.job(epoch)
        return self.feed.stage(epoch)

    @property
    def epoch(self) -> int:
        return self._pos["epoch"]

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; a no-op for the current epoch (keeps a resumed position)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        self.feed.reset(self._pos)
        self.feed.set_epoch(epoch)
        self._pos = self.feed.get_state()
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Steps per epoch (the current epoch, from its start)."""
        return self.steps_in_epoch(self.epoch)

    def steps_in_epoch(self, epoch: int) -> int:
        """Steps of ``epoch`` from its start, without going there: a schedule's
        stages may differ per epoch, so an LR schedule sums these. TypeError
        for a followed stream (it has no length)."""
        return self.feed.steps(epoch, history=())

    # -- iteration -------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("Loader is closed; create a new one (state_dict/load_state_dict to resume)")
        self._gen += 1
        return self._iterate(self._gen)

    def _iterate(self, gen: int):
        from shardfeed.loader.collate import materialize  # the read path: at the first iteration (issue #24)

        feed = self.feed
        feed.reset(self._pos)
        self.dataset.image_size = feed.stage().image_size
        if self._cache is not None:
            if self.num_workers and self._cache.prefetcher is None:
                self._start_pool()  # fork while no prefetch thread runs (one could hold a lock the child needs)
            # steps after the consumer's that workers read (prefetch x workers in flight); none without workers
            self._cache.busy = max(0, min(self.num_workers, self.num_workers * self.prefetch - 1))
            try:
                self._cache.start(self._pos)
            except BaseException:
                self._shutdown_pool()
                raise
        st = self._stats
        st.readers = max(1, self.num_workers)  # whose fetch waits are summed (cache_wait_s is their mean)
        st.start_epoch(self.epoch, fresh=self._pos["step"] == 0)
        if self._pos["step"] == 0 and self.policy.left_out:
            st.errors_skipped += self.policy.left_out  # shards or samples left out when the index was made
        st.started = time.perf_counter()
        try:
            from shardfeed.loader.balancer import redealt  # made again from the consumer's step on a rebalance

            source = redealt(self, feed, self._source)
            resumed = time.perf_counter()
            for item, cols, info in source:
                t1 = time.perf_counter()
                batch = materialize(cols, self.pin_memory, self.bytes_as)
                self._account(info, resumed, t1)
                if self._audit is not None:
                    self._audit.record(item)
                self._pos = item.state
                if self._cache is not None:
                    self._cache.moved(self._pos)
                yield batch
                resumed = time.perf_counter()
                if gen != self._gen:
                    return
        except GeneratorExit:
            raise  # the consumer left the loop (or the interpreter exits): the pool stays for the next one
        except BaseException as e:
            if self._pool is not None:
                self._shutdown_pool()
            self.policy.explain(e)
            raise
        finally:
            if st.started is not None:
                st.elapsed_s += time.perf_counter() - st.started
                st.started = None
        # the epoch is complete: move on to the next one
        if self._audit is not None:
            self._audit.end_epoch(self.epoch)
        feed.reset(self._pos)
        feed.next_epoch()
        self._pos = feed.get_state()
        self.dataset.set_epoch(feed.epoch)

    def _source(self, feed):
        """(item, columns, info) of the feed's steps from its position: probed (autotune), made here or by the workers."""
        if autotune.pending(self._auto):
            source = autotune.probed_batches(self, feed)
        else:
            source = self._local_batches(feed) if self.num_workers == 0 else self._worker_batches(feed)
        # the first batch made here (start-up, formats/base/lazy.py); not one waited for from workers or a
        # remote fetch, where this process allocates little and the wait may be long
        if not self._stats.total.batches and self.num_workers == 0 and self._cache is None:
            source = first_gc_paused(source)
        return source

    def _local_batches(self, feed, threads: bool = True):
        """(item, columns, info) made in this process, one step at a time."""
        if self._maker is None:
            self._maker = self.dataset.maker(self.collate_fn)
            if self.bytes_as == "bytes":
                self._maker.inner().gather_into_bytes()  # this process hands the bytes out: read into them
            if threads:
                self._allow_threads(ahead=True)
        from shardfeed.loader.read_ahead import batches  # the next batch read on a thread where it may be

        ahead = threads and self._read_ahead
        yield from batches(self._maker, feed, self._batch_key, self.pin_memory, self.bytes_as, ahead)
        self._maker.inner().let_go()  # the epoch is read: its open shards would pin the node cache's room

    def _allow_threads(self, ahead: bool = False) -> None:
        from shardfeed.loader import read_ahead  # this process reads alone: threads on a free core

        self._read_ahead = ahead and read_ahead.wanted(self, self._maker)
        read_ahead.allow_split(self._maker)

    def _worker_batches(self, feed):
        """(item, columns, info) from the workers, in step order: step s is made by
        worker s % W in its slot (s // W) % P, at most P steps ahead per worker."""
        pool = self._start_pool()
        pool.drain()
        W, P = self.num_workers, self.prefetch
        pending: deque = deque()
        sent_plan = None
        items = iter(feed)
        while True:
            while len(pending) < P * W:
                if pending and not feed.ready():
                    break  # a followed stream: hand out what is made rather than wait for new data
                item = next(items, None)
                if item is None:
                    break
                if item.plan is not sent_plan:  # workers compute a step's ids from the plan themselves
                    pool.set_plan(item.plan)
                    sent_plan = item.plan
                pool.submit(worker_of(item.step, W), item.step, item.start, item.stop, (item.step // W) % P,
                            item.image_size, self._batch_key(item))
                pending.append(item)
            if not pending:
                return
            item = pending.popleft()
            cols, info = pool.receive(worker_of(item.step, W), item.step, (item.step // W) % P)
            yield item, cols, info

    def _batch_key(self, item) -> tuple[int, ...]:
        """What seeds this step's transform draws (batch_seeds.py): (seed, epoch, step, rank),
        plus the epoch's resizes when an elastic resume restarted its step count."""
        key = (self.dataset.seed, item.epoch, item.step, self.feed.rank)
        resizes = len(item.state.get("history") or ())
        return key + (resizes,) if resizes else key

    def _account(self, info: dict, resumed: float, t1: float) -> None:
        st = self._stats
        now = time.perf_counter()
        # wait: from the consumer asking for a batch to having it
        st.add_batch(info, now - resumed, now - t1, self.policy.report(info["errors"]) if info["errors"] else 0)
        if self._cache is not None:
            st.add_cache(self._cache.take())  # this process's fetches (the prefetcher's)

    def _start_pool(self) -> WorkerPool:
        if self._pool is None:
            from shardfeed.loader.workers import MakerFactory, WorkerPool

            self._pool = WorkerPool(self.num_workers, MakerFactory(self.dataset, self.collate_fn, self.num_workers),
                                    slots=self.prefetch,
                                    context=self.mp_context)
        return self._pool

    def _shutdown_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def worker_pids(self) -> list[int]:
        """Pids of the running worker processes (empty before the first iteration)."""
        return self._pool.pids() if self._pool is not None else []

    # -- per-rank batch sizes mid-run (balancer.py) ------------------------
    def rebalance(self, batch_sizes, why: dict | None = None) -> None:
        """Per-rank batch sizes from the next batch on: every rank passes the same list after the same
        number of batches (None: the schedule's again); the rest of the epoch is dealt again as an
        elastic resume deals it (balance.rebalance). ``why``: JSON data kept in stats()["balance"] and the state."""
        from shardfeed.loader.balancer import rebalance

        rebalance(self, batch_sizes, why)

    def batch_sizes(self) -> tuple[int, ...]:
        """The per-rank batch sizes in force now (the stage's, or a rebalance's)."""
        return self.feed.job(self.epoch).batch_sizes

    def progress(self) -> tuple[int, float]:
        """(samples delivered, seconds the consumer waited for them) over the Loader's life, cheaply."""
        return self._stats.total.samples, self._stats.total.wait_s

    # -- state -----------------------------------------------------------
    def state_dict(self) -> dict:
        """Where the job stands: ``{"version", "epoch", "step", "feed": the feed's state}`` (small, JSON-able),
        and ``"balance"``: the last rebalances and why, where there were any."""
        return _state.make(self._pos) | ({"balance": self._balance_log.state()} if self._balance_log else {})

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: exactly, or (another world size or per-rank
        batch sizes) with the samples the saved job had not yet consumed."""
        self._gen += 1  # any live iterator of the old position stops
        self.feed.reset(_state.feed_state(state))
        if "balance" in state or self._balance_log:
            from shardfeed.loader.balancer import BalanceLog

            self._balance_log = BalanceLog.of(state)
        self._pos = self.feed.get_state()
        self.dataset.set_epoch(self.epoch)

    def audit_state(self) -> dict:
        """What this rank delivered so far (``audit=True``): bitmaps per epoch and source, for
        ``shardfeed audit``; save it beside a checkpoint with ``shardfeed.loader.audit.save``."""
        if self._audit is None:
            raise RuntimeError("this Loader records no audit; create it with audit=True")
        return self._audit.state()

    # -- stats and lifecycle ---------------------------------------------
    def stats(self) -> dict:
        """Counters of this epoch (``["epoch"]``) and of the Loader's life
        (``["total"]``, also the flat keys): samples, batches, samples_per_s,
        wait_s (data stall), stall_fraction, read_s/decode_s/collate_s (summed
        over workers), transfer_s, bytes_read, errors_skipped. Prints as two
        readable lines."""
        snap = self._stats.snapshot()
        if self._balance_log:  # rebalances: when, from what to what, and the measurements behind them
            snap["balance"] = self._balance_log.all()
        if self._auto is not None:  # num_workers or prefetch "auto": what was chosen and why
            snap["autotune"] = {k: dict(v) if isinstance(v, dict) else v for k, v in self._auto.items()}
        return snap

    def close(self) -> None:
        """Stop the workers and free shared memory; safe to call twice."""
        self._closed = True
        self._gen += 1
        self._shutdown_pool()
        if self._cache is not None:
            self._cache.close()
        if self._maker is not None:
            self._maker.close()
            self._maker = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"Loader({self.dataset!r}, schedule={self.schedule!r}, num_workers={self.num_workers}, "
                f"epoch={self.epoch}, step={self._pos['step']})")


