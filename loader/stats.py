"""Counters of a Loader: throughput, data stall, time per stage, errors.

Every counter is kept twice: for the epoch being read and over the Loader's
life. ``LoaderStats.snapshot()`` returns a ``StatsSnapshot``:

    {"epoch": {"number": 3, "samples": ..., "batches": ..., "elapsed_s": ...,
               "samples_per_s": ..., "wait_s": ..., "stall_fraction": ...,
               "read_s": ..., "decode_s": ..., "collate_s": ..., "transfer_s": ...,
               "bytes_read": ..., "errors_skipped": ...,
               "cache_hits": ..., "cache_misses": ..., "bytes_fetched": ...,
               "fetch_wait_s": ..., "evictions": ..., "requests": ...,
               "late_samples": ..., "prefetch_samples": ..., "prefetch_shards": ...,
               "prefetch_present": ..., "prefetch_skipped": ..., "prefetch_passed": ...,
               "prefetch_errors": ..., "fetched_ratio": ..., "cache_wait_s": ...,
               "cache_wait_fraction": ...},   # 0 unless read through the cache
     "total": {the same keys, no "number"},
     "samples": ..., ...}   # the totals again, flat, as stats() always returned them

``str(snapshot)`` is two human lines (``print(loader.stats())``).

Derived for the cache (docs/remote-and-cache.md explains each): ``fetched_ratio``,
bytes fetched from the source per byte of the dataset read (its stored bytes: tar
framing included, as ``shardfeed plan`` counts; 0.48: about half came over the
network, the rest from the cache; above 1: the plan refetches); ``cache_wait_s``, a
reader's time waiting for the cache, averaged over the readers (``fetch_wait_s`` is
their sum), so a part of ``elapsed_s``; ``cache_wait_fraction``, that part.
"""

from __future__ import annotations

import time

# what one span of reading (an epoch, or the Loader's life) adds up to: each counter and its zero
_ZEROS = {
    "samples": 0,
    "batches": 0,
    "wait_s": 0.0,  # time the consumer spent inside next(): the data stall
    "read_s": 0.0,  # summed over workers
    "decode_s": 0.0,
    "collate_s": 0.0,
    "transfer_s": 0.0,  # main process: rebuilding batches from shared memory
    "bytes_read": 0,
    "errors_skipped": 0,
    "elapsed_s": 0.0,  # time inside iteration, the consumer's own work included
    # node-local cache (datasets read through shardfeed.cache; summed over workers and the prefetcher)
    "cache_hits": 0,  # shards a reader found cached when it opened them
    "cache_misses": 0,  # shards a reader had to wait for
    "bytes_fetched": 0,  # from the source, by readers and the prefetcher
    "fetch_wait_s": 0.0,  # readers' time waiting for shards (summed over workers)
    "evictions": 0,
    "requests": 0,  # to the source (ranged GETs, HEADs, index and log revalidations)
    "late_samples": 0,  # sample ranges readers fetched themselves: the prefetcher had not brought them
    # the prefetcher's (cache/fetch.py PREFETCH_COUNTERS): samples and whole shards it brought, shards of its
    # window already there, given up for room (NoRoom), passed by the readers before it started, failed
    "prefetch_samples": 0,
    "prefetch_shards": 0,
    "prefetch_present": 0,
    "prefetch_skipped": 0,
    "prefetch_passed": 0,
    "prefetch_errors": 0,
}


class Counters:
    """What one span of reading (an epoch, or the Loader's life) adds up to."""

    # a plain class, not a dataclass (a dataclass compiles its methods at import, issue #24): counters
    # are given by keyword only; __eq__/__repr__ as a dataclass's, unhashable as one
    __slots__ = tuple(_ZEROS)
    __hash__ = None

    def __init__(self, **values):
        unknown = values.keys() - _ZEROS.keys()
        if unknown:
            raise TypeError(f"Counters has no counter {sorted(unknown)[0]!r}")
        for k, zero in _ZEROS.items():
            setattr(self, k, values.get(k, zero))

    def _values(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return "Counters(" + ", ".join(f"{k}={v!r}" for k, v in self._values().items()) + ")"

    def __eq__(self, other):
        return self._values() == other._values() if other.__class__ is self.__class__ else NotImplemented

    def view(self, running_s: float = 0.0, readers: int = 1, sample_bytes: float = 0.0) -> dict:
        """The counters plus the rates derived from them; ``running_s`` is the
        time of an iteration still in progress, not yet added to elapsed_s;
        ``readers``: the processes whose ``fetch_wait_s`` is summed; ``sample_bytes``:
        the dataset's stored bytes per sample (0: unknown, payload bytes read instead)."""
        out = self._values()
        elapsed = self.elapsed_s + running_s
        out["elapsed_s"] = elapsed
        out["samples_per_s"] = self.samples / elapsed if elapsed > 0 else 0.0
        out["stall_fraction"] = self.wait_s / elapsed if elapsed > 0 else 0.0
        stored = self.samples * sample_bytes if sample_bytes else self.bytes_read
        out["fetched_ratio"] = self.bytes_fetched / stored if stored else 0.0
        # a reader's wait lies inside the span it read in; workers read ahead of the consumer, so a
        # mean past the span is the epoch before it reaching in: never more than the span
        out["cache_wait_s"] = min(max(elapsed, 0.0), self.fetch_wait_s / max(1, readers))
        out["cache_wait_fraction"] = out["cache_wait_s"] / elapsed if elapsed > 0 else 0.0
        return out


_PREFETCH = ("prefetch_samples", "prefetch_shards", "prefetch_present", "prefetch_skipped", "prefetch_passed",
             "prefetch_errors")


class _Counted:
    """A LoaderStats field the Loader adds to in place (``st.samples += n``).

    Reading gives the lifetime total; an assignment adds its increment to both
    the total and the current epoch. The Loader's accounting stays one line
    per counter and never has to know that epochs are counted apart.
    """

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.total, self.name)

    def __set__(self, obj, value) -> None:
        step = value - getattr(obj.total, self.name)
        setattr(obj.total, self.name, value)
        setattr(obj.epoch, self.name, getattr(obj.epoch, self.name) + step)


class LoaderStats:
    """The Loader's counters: ``epoch`` (since ``start_epoch``) and ``total``."""

    samples = _Counted()
    batches = _Counted()
    wait_s = _Counted()
    read_s = _Counted()
    decode_s = _Counted()
    collate_s = _Counted()
    transfer_s = _Counted()
    bytes_read = _Counted()
    errors_skipped = _Counted()
    elapsed_s = _Counted()
    cache_hits = _Counted()
    cache_misses = _Counted()
    bytes_fetched = _Counted()
    fetch_wait_s = _Counted()
    evictions = _Counted()
    requests = _Counted()
    late_samples = _Counted()
    prefetch_samples = _Counted()
    prefetch_shards = _Counted()
    prefetch_present = _Counted()
    prefetch_skipped = _Counted()
    prefetch_passed = _Counted()
    prefetch_errors = _Counted()

    def __init__(self):
        self.epoch = Counters()
        self.total = Counters()
        self.epoch_number: int | None = None  # None until the Loader first calls start_epoch
        self.started: float | None = None  # perf_counter() when the running iteration began
        self.readers = 1  # processes that read batches (the Loader's workers, or the main process)
        self.sample_bytes = 0.0  # stored bytes per sample of a dataset read through the cache (fetched_ratio)

    def start_epoch(self, epoch: int, fresh: bool = True) -> None:
        """Called as an iteration begins. The epoch counters start again when
        ``epoch`` is another epoch, or when the iteration starts at its first
        step (``fresh``); an iteration resuming the same epoch part-way keeps
        adding to them."""
        if epoch != self.epoch_number or fresh:
            self.epoch = Counters()
            self.epoch_number = epoch
            if self.started is not None:  # an iteration still running: its time so far stays out of this epoch
                self.epoch.elapsed_s = -(time.perf_counter() - self.started)

    def add_batch(self, info: dict, wait_s: float, transfer_s: float, skipped: int) -> None:
        """One delivered batch, in one call: the descriptor per counter costs
        ~0.7 us each, ~10 us a batch, which a 1M samples/s loop cannot spare;
        info's values are read once for both spans."""
        samples, read_s, decode_s, collate_s, nbytes = (info["samples"], info["read_s"], info["decode_s"],
                                                        info["collate_s"], info["bytes"])
        for c in (self.epoch, self.total):
            c.wait_s += wait_s
            c.transfer_s += transfer_s
            c.samples += samples
            c.batches += 1
            c.read_s += read_s
            c.decode_s += decode_s
            c.collate_s += collate_s
            c.bytes_read += nbytes
            c.errors_skipped += skipped
        if "cache" in info:
            self._add_cache_info(info)

    def add_info(self, info: dict, skipped: int) -> None:
        self.read_s += info["read_s"]
        self.decode_s += info["decode_s"]
        self.collate_s += info["collate_s"]
        self.bytes_read += info["bytes"]
        self.errors_skipped += skipped
        self._add_cache_info(info)

    def _add_cache_info(self, info: dict) -> None:
        if "cache" in info:
            c = info["cache"]
            self.cache_hits += c["hits"]
            self.cache_misses += c["misses"]
            self.fetch_wait_s += c["wait_s"]
            self.late_samples += c.get("late_samples", 0)
            self.add_cache(c)

    def add_cache(self, c: dict) -> None:
        """Fetch counters of one process's cache (deltas)."""
        self.bytes_fetched += c["bytes_fetched"]
        self.evictions += c["evictions"]
        self.requests += c.get("requests", 0)
        for k in _PREFETCH:
            if c.get(k):
                setattr(self, k, getattr(self, k) + c[k])

    def snapshot(self) -> StatsSnapshot:
        running = time.perf_counter() - self.started if self.started is not None else 0.0
        total = self.total.view(running, self.readers, self.sample_bytes)
        # Before the first start_epoch the Loader's life is the only span known.
        epoch = total if self.epoch_number is None else self.epoch.view(running, self.readers, self.sample_bytes)
        return StatsSnapshot(total, epoch={"number": self.epoch_number, **epoch}, total=dict(total))


class StatsSnapshot(dict):
    """What ``Loader.stats()`` returns: a plain dict (JSON-ready, flat keys are
    the totals) whose ``str()`` is readable."""

    def format(self) -> str:
        epoch, total = self["epoch"], self["total"]
        if epoch["number"] is None:
            return "total: " + _line(total)
        head = f"epoch {epoch['number']}: "
        return head + _line(epoch) + "\n" + "total:".ljust(len(head)) + _line(total)

    def __str__(self) -> str:
        return self.format()


def _line(c: dict) -> str:
    return (f"{_count(c['samples'], 'sample')} ({_count(c['batches'], 'batch')}) in {_seconds(c['elapsed_s'])}"
            f" ({c['samples_per_s']:,.0f}/s), data stall {c['stall_fraction']:.1%}, "
            f"{_bytes(c['bytes_read'])} read, {_count(c['errors_skipped'], 'error')} skipped" + _cache_part(c))


def _cache_part(c: dict) -> str:
    opened = c["cache_hits"] + c["cache_misses"]
    if not opened and not c["bytes_fetched"]:
        return ""  # not read through a cache
    ahead = ""
    if c["prefetch_samples"] or c["prefetch_shards"] or c["prefetch_skipped"] or c["late_samples"]:
        ahead = (f"; prefetched {_count(c['prefetch_samples'], 'sample')} and {_count(c['prefetch_shards'], 'shard')}"
                 f" ({c['prefetch_skipped']:,} skipped for room), {_count(c['late_samples'], 'sample')} fetched "
                 "late by readers")
    hits = f", {c['cache_hits'] / opened:.0%} of shard opens found it cached" if opened else ""
    return (f"; cache: fetched {_bytes(c['bytes_fetched'])} ({c['fetched_ratio']:.2f}x the data read) in "
            f"{_count(c['requests'], 'request')}, readers waited {c['cache_wait_s']:.1f} s each "
            f"({c['cache_wait_fraction']:.0%} of the time){hits}, {_count(c['evictions'], 'eviction')}" + ahead)


def _count(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{n:,} {noun if n == 1 else plural}"


def _seconds(s: float) -> str:
    if s < 100:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def _bytes(n: int) -> str:
    # decimal units, as the benchmarks report them (1 MB = 1e6 B)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,} B"
