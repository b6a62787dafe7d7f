"""The Loader's prefetchers: the cache kept filled with the shards (PlanPrefetcher) or samples
(SamplePrefetcher) a moving plan needs next.

Started by loader/caching.py, one per Loader (the user's prefetcher over a fixed
list of shards, which keeps each shard's error for its consumer, is
user_prefetch.py's ``Prefetcher``).

The consumer says where it stands (``moved(position)``, any value); a
background thread turns the position into the upcoming shards
(``plan_fn(position) -> [(ShardRef, step, sidecar)]`` in order of next use,
computed in the thread, so a feed's lookahead never runs on the training
loop's path), publishes them as the cache's lookahead (Belady eviction), and
fetches the first ones whose bytes add up to at most ``window_bytes``, at
most ``threads`` shards at a time (each with its own ranged concurrency).

The plan is recomputed whenever the consumer has moved (positions that
arrive while one is computed are coalesced into the latest): a stale plan
would keep consumed shards at their old, near steps and evict the shards
just fetched for the future. Keep ``plan_fn`` cheap by asking for no more
shards than the cache can hold (anything further is evicted first anyway).
Fetches run unpinned; readers pin what they open (reads.py).

A failed fetch is counted (``errors``) and forgotten: the reader that needs
the shard fetches it itself and raises the error there, in the training loop,
with the shard named. Threads are ``shardfeed-clairvoyant-<n>``, daemon;
``close()`` stops them (safe twice).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from shardfeed.cache.fetching.fetch import Cancelled
from shardfeed.cache.storage.budget import NoRoom
from shardfeed.cache.storage.store import ShardCache


class PlanPrefetcher:
    def __init__(self, cache: ShardCache, plan_fn, window_bytes: int, threads: int = 2):
        self.cache = cache
        self.plan_fn = plan_fn
        self.window_bytes = int(window_bytes)
        self._cv = threading.Condition()
        self._pos, self._step = None, 0
        self._version = 0
        self._stop = threading.Event()
        self._inflight: set[str] = set()
        self._wanted: set[str] = set()
        self.errors = 0
        self.passes = 0  # plans computed (for tests and benchmarks)
        self.lookahead = cache.lookahead.publisher()  # its plan under its own name (two Loaders, one cache)
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="shardfeed-clairvoyant")
        self._thread = threading.Thread(target=self._run, name="shardfeed-clairvoyant-plan", daemon=True)
        self._thread.start()

    def moved(self, position, step: int) -> None:
        """The consumer's next read is at ``position`` (its global step ``step``)."""
        with self._cv:
            self._pos, self._step = position, int(step)
            self._version += 1
            self._cv.notify_all()

    def _moved_since(self, seen: int):
        """Wait until the readers moved past version ``seen``: (version, position), or None once stopped."""
        with self._cv:
            while not self._stop.is_set() and self._version == seen:
                self._cv.wait(0.5)
            if self._stop.is_set():
                return None
            return self._version, self._pos

    def _run(self) -> None:
        seen = 0
        while (moved := self._moved_since(seen)) is not None:
            seen, pos = moved
            try:
                upcoming = list(self.plan_fn(pos))
            except Exception:  # noqa: BLE001 - advice only: the readers still fetch what they need
                self.errors += 1
                continue
            self.passes += 1
            self.cache.set_lookahead(((ref, s) for ref, s, _ in upcoming), self.lookahead)
            self._fill(upcoming)

    def _fill(self, upcoming) -> None:
        """Start fetches for the window's shards."""
        total, wanted, todo = 0, set(), []
        for ref, _step, sidecar in upcoming:
            total += ref.size or 0
            if total > self.window_bytes and wanted:
                break
            wanted.add(ref.url)
            if not self.cache.contains(ref.url, ref.hash, ref.version):
                todo.append((ref, sidecar))
        with self._cv:
            self._wanted = wanted
            for ref, sidecar in todo:
                if ref.url not in self._inflight:
                    self._inflight.add(ref.url)
                    self._submit(self._fetch, ref, sidecar)

    def _fetch(self, ref, sidecar) -> None:
        try:
            if self._stop.is_set() or ref.url not in self._wanted:
                self._count(prefetch_passed=1)
                return  # the consumer moved on before this fetch started
            if self.cache.contains(ref.url, ref.hash, ref.version):
                self._count(prefetch_present=1)
                return
            self.cache.get(ref.url, ref.hash, ref.size, sidecar=sidecar, cancel=self._stop, version=ref.version)
            self._count(prefetch_shards=1)
        except Cancelled:
            pass
        except Exception:  # noqa: BLE001 - see the module docstring
            self.errors += 1
            self._count(prefetch_errors=1)
        finally:
            with self._cv:
                self._inflight.discard(ref.url)

    def _count(self, **delta) -> None:
        self.cache._add(**delta)  # the cache's stats(): the Loader adds them to its own (loader/stats.py)

    def _submit(self, fn, *args) -> None:
        try:
            self._pool.submit(fn, *args)
        except RuntimeError:  # the pool is shut down (close() timed out on a long plan, or the interpreter exits)
            self._stop.set()  # nothing more to fetch: the plan thread ends at its next look

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.lookahead.close()  # its plan file goes; a pass still running publishes nothing more

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SamplePrefetcher(PlanPrefetcher):
    """PlanPrefetcher at sample granularity (ranged_reads.py): ``plan_fn(position)``
    returns ``(upcoming, near)``: ``upcoming`` as for PlanPrefetcher (published
    as the lookahead, for eviction), ``near``: ``[(ref, step, (local ids, their steps), sample
    count)]``, the samples of the next steps by shard in order of first use.
    Each near shard is fetched as ``policy`` decides (whole, or its samples as
    ranges into its partial copy), ``threads`` shards at a time.

    Room for ranges (the guaranteed window): the samples of the readers' next
    step are what the readers would fetch themselves, so they come on the
    readers' terms; the later steps' ranges come while the ranges this
    prefetcher brought for steps after the readers' next one add up to at most
    ``policy.window_bytes`` (the part of the reserve sized for them, cost_model.
    range_reserve). Either may evict a partial copy read after the step it
    fetches for (Belady at range granularity: the reader would evict the same
    one), never a whole shard. Beyond the window a range needs the readers'
    headroom free and evicts only copies no plan reads."""

    def __init__(self, cache: ShardCache, plan_fn, policy, threads: int = 2):
        self.policy = policy
        self.fetched_samples = 0  # samples this prefetcher brought (for tests and benchmarks)
        self.skipped = 0  # shards not prefetched: no room beyond what the readers may need
        self._window: dict[int, int] = {}  # step after the readers' next -> bytes brought for it
        self._brought: dict[str, dict[int, int]] = {}  # url -> {sample made present: the step it is read at}
        super().__init__(cache, plan_fn, 0, threads)

    def _window_room(self, step: int, nbytes: int) -> bool:
        """Claim ``nbytes`` of the window for samples of ``step`` (after the readers' next step)."""
        with self._cv:
            for s in [s for s in self._window if s <= self._step]:
                del self._window[s]  # the readers' next step, or read: on the readers' terms now
            if sum(self._window.values()) + nbytes > self.policy.window_bytes:
                return False
            self._window[step] = self._window.get(step, 0) + nbytes
            return True

    def _bring(self, ref, local, steps, count) -> int:
        """Samples ``local`` (read at ``steps``) of ``ref`` into its partial copy, on the terms of the
        class docstring, in at most three fetches (the readers' step, the window's steps, beyond
        them), so that each fetch has all its ranges in flight at once (ranges.py); samples brought
        (NoRoom once none came)."""
        import numpy as np

        fetcher, per_sample = self.policy.fetcher, self.policy.sample_bytes()
        n, now = 0, self._step
        later = np.unique(steps[steps > now]).tolist()
        claimed = []  # window steps whose room was claimed, in order (the first unclaimed ends them)
        for step in later:
            if not self._window_room(step, int((steps == step).sum()) * per_sample):
                break
            claimed.append(step)
        groups = [(steps <= now, dict(for_step=now)),
                  (np.isin(steps, claimed), dict(for_step=claimed[0] if claimed else now)),
                  ((steps > now) & ~np.isin(steps, claimed), dict(headroom=max(1, self.policy.headroom)))]
        try:
            for g, (mask, terms) in enumerate(groups):
                if not mask.any():
                    continue
                got = 0
                try:
                    got = fetcher.ensure(ref, local[mask], count, cancel=self._stop, **terms)[1]
                except NoRoom:
                    if not n:
                        raise
                    self.skipped += 1
                    self._count(prefetch_skipped=1)
                    break
                finally:
                    if g == 1:
                        self._settle(steps[mask], got, per_sample)
                        claimed = []
                n += got
                self._mark(ref.url, local[mask], steps[mask])
        finally:
            if claimed:
                self._settle(steps[np.isin(steps, claimed)], 0, per_sample)
        return n

    def _settle(self, steps, got: int, per_sample: int) -> None:
        """The window holds what came for ``steps`` (``got`` samples of them), not what was claimed."""
        import numpy as np

        uniq, counts = np.unique(steps, return_counts=True)
        share = got / max(1, len(steps))
        with self._cv:
            for step, c in zip(uniq.tolist(), counts.tolist()):
                if step in self._window:
                    self._window[step] += int(round(c * share)) * per_sample - c * per_sample

    def _mark(self, url: str, local, steps) -> None:
        """Samples ``local`` of ``url`` (read at ``steps``) are present: later passes leave them be."""
        with self._cv:
            done = self._brought.setdefault(url, {})
            done.update(zip(local.tolist(), steps.tolist()))

    def _new(self, ref, local, steps):
        """(local, steps) of a near shard less the samples this prefetcher made present already; all
        of them again when its copy is gone (evicted)."""
        import os

        import numpy as np

        with self._cv:
            done = self._brought.get(ref.url)
        if not done:
            return local, steps
        new = np.fromiter((done.get(i) != s for i, s in zip(local.tolist(), steps.tolist())), bool, len(local))
        if not new.all() and not (os.path.exists(self.policy.fetcher.path(ref))
                                  or self.cache.contains(ref.url, ref.hash, ref.version)):
            with self._cv:
                self._brought.pop(ref.url, None)
            return local, steps
        return local[new], steps[new]

    def _run(self) -> None:
        from shardfeed.cache.sample_ranges.ranges import partial_key

        seen = 0
        while (moved := self._moved_since(seen)) is not None:
            seen, pos = moved
            try:
                upcoming, near = self.plan_fn(pos)
            except Exception:  # noqa: BLE001 - advice only: the readers still fetch what they need
                self.errors += 1
                continue
            self.passes += 1
            plan: dict[str, int] = {}
            for ref, step, *_ in list(upcoming) + [(r, s) for r, s, _, _ in near]:
                key = self.cache.key_for(ref.url, ref.hash, ref.version)
                for k in (key, partial_key(key)):
                    if step < plan.get(k, step + 1):
                        plan[k] = step
            if self.policy.fits:
                self.lookahead.withdraw()  # every shard fits: nothing is evicted, a plan would only take room
            else:
                self.lookahead.publish(plan)
            with self._cv:
                for url in list(self._brought):  # steps the readers passed: read, or on their terms
                    left = {i: s for i, s in self._brought[url].items() if s >= self._step}
                    if left:
                        self._brought[url] = left
                    else:
                        del self._brought[url]
            todo = []
            for ref, _step, local, count in near:
                local = self._new(ref, *local)
                if len(local[0]):
                    todo.append((ref, local, count))
            with self._cv:
                self._wanted = {ref.url for ref, _, _, _ in near}
                for ref, local, count in todo:
                    if ref.url not in self._inflight:
                        self._inflight.add(ref.url)
                        self._submit(self._fetch_samples, ref, local, count)

    def _fetch_samples(self, ref, local, count) -> None:
        import os

        try:
            if self._stop.is_set() or ref.url not in self._wanted:
                self._count(prefetch_passed=1)
                return
            local, steps = local
            if self.cache.contains(ref.url, ref.hash, ref.version):
                self._mark(ref.url, local, steps)
                self._count(prefetch_present=1)
                return
            keep = steps >= self._step  # samples of steps the consumer passed: read already
            local, steps = local[keep], steps[keep]
            if not len(local):
                self._count(prefetch_passed=1)
                return
            fetcher = self.policy.fetcher
            if not os.path.exists(fetcher.path(ref)) and \
                    self.policy.choose(ref, len(local), count, self.policy.ranges_cost(ref, local)) == "whole":
                self.cache.get(ref.url, ref.hash, ref.size, sidecar=True, cancel=self._stop, version=ref.version)
                self._mark(ref.url, local, steps)
                self._count(prefetch_shards=1)
                return
            pin = fetcher.pin(ref)
            try:
                if self.cache.contains(ref.url, ref.hash, ref.version):
                    self._count(prefetch_present=1)  # admitted whole since the check above
                    return
                n = self._bring(ref, local, steps, count)
                self.fetched_samples += n
                self._count(**({"prefetch_samples": n} if n else {"prefetch_present": 1}))
            finally:
                pin.release()
                fetcher.drop_superseded(ref)  # admitted whole while this brought ranges into it
        except NoRoom:
            self.skipped += 1  # the readers fetch it themselves when they come to it
            self._count(prefetch_skipped=1)
        except Cancelled:
            pass
        except Exception:  # noqa: BLE001 - see the module docstring
            self.errors += 1
            self._count(prefetch_errors=1)
        finally:
            with self._cv:
                self._inflight.discard(ref.url)
