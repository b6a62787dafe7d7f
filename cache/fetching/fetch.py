"""Download one object into a local file: concurrent ranged reads, retries, a deadline.

One HTTP/S3 stream per process tops out near 1 GB/s on S3, so an object
larger than one range is split into ``range_bytes`` pieces fetched by a small
thread pool and written in place with pwrite. Each piece is retried on its
own with exponential backoff: a connection reset, a 5xx, a stall (the
transport's read timeout) or a short read costs one piece, not the shard.
Missing objects and refused access are not retried, nor an object that
changed between ranges (the fetch fails whole: nothing stitched). A body
slower than ``min_rate`` bytes/s after a grace of ``stall_s`` fails its try,
and ``deadline_s`` bounds one object's fetch, retries included. A fault is
retried ``attempts`` times, and for as long as ``retry_s`` after the first
failure when that is longer (the backoff capped at ``max_backoff_s``): a
follower that runs for days rides out a 503 storm of a minute
(loader/remote_follow.py gives it ``FOLLOW_RETRY_S``) where five tries span
about 3 s. When both run out the error is a ShardError naming the URL and the
last reason.

Defaults can be set for a whole job in the environment (read when a
FetchOptions is made): ``SHARDFEED_FETCH_STALL_S``, ``SHARDFEED_FETCH_MIN_RATE``
(bytes/s), ``SHARDFEED_FETCH_DEADLINE_S``, ``SHARDFEED_FETCH_ATTEMPTS``,
``SHARDFEED_FETCH_RETRY_S``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from shardfeed.cache.fetching.source_contract import Source
from shardfeed.formats import ShardError


def _env(name: str, default: float, kind=float):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return kind(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not a number") from None


@dataclass(frozen=True)
class FetchOptions:
    range_bytes: int = 16 << 20  # one ranged GET; 8-16 MiB keeps S3 request overhead small
    threads: int = 8  # concurrent ranges per object
    attempts: int = field(default_factory=lambda: _env("SHARDFEED_FETCH_ATTEMPTS", 5, int))  # tries per range
    backoff_s: float = 0.2  # first retry delay, doubled each time (with jitter)
    max_backoff_s: float = 10.0
    # faults are retried for at least this long after the first one (beyond `attempts` if need be); 0: tries only
    retry_s: float = field(default_factory=lambda: _env("SHARDFEED_FETCH_RETRY_S", 0.0))
    # a read that gets no byte for this long is a failure
    stall_s: float = field(default_factory=lambda: _env("SHARDFEED_FETCH_STALL_S", 30.0))
    # a body slower than this (bytes/s, after stall_s of grace) is a failure: a trickle is not progress
    min_rate: float = field(default_factory=lambda: _env("SHARDFEED_FETCH_MIN_RATE", 16 << 10))
    # one object's fetch, all ranges and retries, must end within this
    deadline_s: float = field(default_factory=lambda: _env("SHARDFEED_FETCH_DEADLINE_S", 3600.0))

    def __post_init__(self):
        if self.range_bytes < 1 or self.threads < 1 or self.attempts < 1:
            raise ValueError(f"FetchOptions needs range_bytes, threads and attempts >= 1, got {self}")
        if not (self.stall_s > 0 and self.deadline_s > 0 and self.min_rate >= 0 and self.retry_s >= 0):
            raise ValueError(f"FetchOptions needs stall_s and deadline_s > 0 and min_rate and retry_s >= 0, "
                             f"got {self}")


# What a prefetcher (loader_prefetch.py) did, in its cache's stats() and so in Loader.stats():
# samples it brought as ranges and whole shards it brought; shards of its window found
# complete already; shards given up for room (budget.NoRoom: no room beside what the
# readers may still need); shards whose samples the readers passed before the fetch could
# start (too late); failed fetches (the readers fetch those themselves).
PREFETCH_COUNTERS = ("prefetch_samples", "prefetch_shards", "prefetch_present", "prefetch_skipped",
                     "prefetch_passed", "prefetch_errors")


class Cancelled(Exception):
    """The fetch was stopped by its caller (a prefetcher closing)."""


def is_retryable(err: BaseException) -> bool:
    from shardfeed.cache.fetching.http_source import Changed, Deadline

    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                        ShardError, Cancelled, Changed, Deadline)):
        return False
    status = getattr(err, "status", None) or getattr(err, "code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return False  # the request is wrong (403, 416 ...): asking again gives the same answer
    return isinstance(err, Exception)


def _reason(err: BaseException) -> str:
    text = str(err) or repr(err)
    return f"{type(err).__name__}: {text}"


def with_retries(url: str, what: str, fn, opts: FetchOptions, stopped=None, deadline: float | None = None):
    """``fn()`` with exponential backoff; ShardError naming ``url`` when it keeps failing
    (``opts.attempts`` tries, and ``opts.retry_s`` seconds after the first failure).
    ``stopped()`` true ends it before the next try with Cancelled; past
    ``deadline`` (time.monotonic()) no new try starts."""
    delay = opts.backoff_s
    attempt, failed_at = 0, None
    while True:
        attempt += 1
        if stopped is not None and stopped():
            raise Cancelled(url)
        try:
            return fn()
        except FileNotFoundError as e:
            raise ShardError(url, f"not found while {what} ({_reason(e)})") from e
        except Exception as e:  # noqa: BLE001 - classified below, re-raised as ShardError
            if not is_retryable(e):
                if isinstance(e, (ShardError, Cancelled)):
                    raise
                raise ShardError(url, f"{what} failed: {_reason(e)}") from e
            now = time.monotonic()
            failed_at = now if failed_at is None else failed_at
            window = failed_at + opts.retry_s - now  # of the retry window, left
            if attempt >= opts.attempts and window <= 0:
                over = f" over {now - failed_at:.0f} s" if opts.retry_s else ""
                raise ShardError(url, f"{what} failed after {attempt} attempts{over}; last: {_reason(e)}") from e
            # jitter so ranks that failed together do not retry together
            pause = min(delay, opts.max_backoff_s) * (0.5 + random.random())
            if attempt >= opts.attempts:
                pause = min(pause, window)  # the tries are spent: the last ones end with the window
            if deadline is not None and time.monotonic() + pause > deadline:
                raise ShardError(url, f"{what} failed and the fetch deadline of {opts.deadline_s:g} s has "
                                      f"passed after {attempt} attempt(s); last: {_reason(e)}") from e
            time.sleep(pause)
            delay *= 2


def fetch_to_fd(source: Source, fd: int, size: int, opts: FetchOptions,
                cancel: threading.Event | None = None, on_bytes=None, on_request=None) -> int:
    """Write the ``size`` bytes of ``source`` into the open file ``fd``; returns bytes written.

    The first range goes first: the others start once its headers have told
    the object's identity (each later range must match it) and whether the
    server honours Range at all; one that sends the whole object instead has
    it streamed into ``fd`` once, and no other range is asked for."""
    ranges = [(s, min(s + opts.range_bytes, size)) for s in range(0, size, opts.range_bytes)]
    failed = threading.Event()  # one range gave up: the others stop before their next try
    deadline = time.monotonic() + opts.deadline_s
    source.deadline = deadline

    def stopped() -> bool:
        return failed.is_set() or (cancel is not None and cancel.is_set())

    def put(view, at: int) -> None:
        view = memoryview(view)
        try:
            while view:  # pwrite may write less than asked on some filesystems
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
        except OSError as e:  # the local disk, not the source: asking the source again cannot help
            raise ShardError(source.url, f"writing it to the cache disk failed ({e}); free space there, lower "
                                         "cache_limit_bytes or point cache_dir at a larger disk") from e

    headers = threading.Event()  # the first range's answer is known (or it ended)
    whole = []

    def seen(w: bool) -> None:
        if w:
            whole.append(True)
        headers.set()

    def one(span, first=False):
        start, end = span
        what = f"reading bytes {start}-{end - 1}"
        got = [0]

        def sink(chunk, at):
            put(chunk, at)
            got[0] += len(chunk)

        def attempt():
            got[0] = 0
            if on_request is not None:
                on_request()
            return source.read_into(start, end, sink, size, seen if first else None)

        try:
            all_of_it = with_retries(source.url, what, attempt, opts, stopped, deadline)
        finally:
            if first:
                headers.set()
        if on_bytes is not None:
            on_bytes(got[0])
        return size if all_of_it else end - start

    if not ranges:
        return 0
    if len(ranges) == 1 or opts.threads == 1:
        first = one(ranges[0], first=True)
        return first if first == size else first + sum(one(r) for r in ranges[1:])
    with ThreadPoolExecutor(min(opts.threads, len(ranges)), thread_name_prefix="shardfeed-fetch") as pool:
        futures = [pool.submit(one, ranges[0], True)]
        try:
            while not headers.wait(0.05):
                if futures[0].done() or stopped():
                    break
            if futures[0].done() and futures[0].exception() is not None:
                return futures[0].result()  # raises
            if not whole:
                futures += [pool.submit(one, r) for r in ranges[1:]]
            return sum(f.result() for f in futures)
        except BaseException:
            failed.set()
            for f in futures:
                f.cancel()
            raise
