"""Download one object into a local file: concurrent ranged reads, retries.

One HTTP/S3 stream per process tops out near 1 GB/s on S3, so an object
larger than one range is split into ``range_bytes`` pieces fetched by a small
thread pool and written in place with pwrite. Each piece is retried on its
own with exponential backoff: a connection reset, a 5xx, a stall (the
transport's read timeout) or a short read costs one piece, not the shard.
Missing objects and refused access are not retried. When the attempts run
out the error is a ShardError naming the URL and the last reason.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shardfeed.cache.sources import Source
from shardfeed.formats import ShardError


@dataclass(frozen=True)
class FetchOptions:
    range_bytes: int = 16 << 20  # one ranged GET; 8-16 MiB keeps S3 request overhead small
    threads: int = 8  # concurrent ranges per object
    attempts: int = 5  # tries per range before giving up
    backoff_s: float = 0.2  # first retry delay, doubled each time (with jitter)
    max_backoff_s: float = 10.0
    stall_s: float = 30.0  # a read that gets no byte for this long is a failure

    def __post_init__(self):
        if self.range_bytes < 1 or self.threads < 1 or self.attempts < 1:
            raise ValueError(f"FetchOptions needs range_bytes, threads and attempts >= 1, got {self}")


class Cancelled(Exception):
    """The fetch was stopped by its caller (a prefetcher closing)."""


def is_retryable(err: BaseException) -> bool:
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                        ShardError, Cancelled)):
        return False
    status = getattr(err, "status", None) or getattr(err, "code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return False  # the request is wrong (403, 416 ...): asking again gives the same answer
    return isinstance(err, Exception)


def _reason(err: BaseException) -> str:
    text = str(err) or repr(err)
    return f"{type(err).__name__}: {text}"


def with_retries(url: str, what: str, fn, opts: FetchOptions, stopped=None):
    """``fn()`` with exponential backoff; ShardError naming ``url`` when it keeps failing.
    ``stopped()`` true ends it before the next try with Cancelled."""
    delay = opts.backoff_s
    for attempt in range(1, opts.attempts + 1):
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
            if attempt == opts.attempts:
                raise ShardError(url, f"{what} failed after {opts.attempts} attempts; last: {_reason(e)}") from e
            # jitter so ranks that failed together do not retry together
            time.sleep(min(delay, opts.max_backoff_s) * (0.5 + random.random()))
            delay *= 2


def fetch_to_fd(source: Source, fd: int, size: int, opts: FetchOptions,
                cancel: threading.Event | None = None, on_bytes=None) -> int:
    """Write the ``size`` bytes of ``source`` into the open file ``fd``; returns bytes written."""
    ranges = [(s, min(s + opts.range_bytes, size)) for s in range(0, size, opts.range_bytes)]
    failed = threading.Event()  # one range gave up: the others stop before their next try

    def stopped() -> bool:
        return failed.is_set() or (cancel is not None and cancel.is_set())

    def one(span):
        start, end = span
        data = with_retries(source.url, f"reading bytes {start}-{end - 1}",
                            lambda: source.read_range(start, end), opts, stopped)
        view = memoryview(data)
        try:
            while view:  # pwrite may write less than asked on some filesystems
                n = os.pwrite(fd, view, start + len(data) - len(view))
                view = view[n:]
        except OSError as e:  # the local disk, not the source: asking the source again cannot help
            raise ShardError(source.url, f"writing it to the cache disk failed ({e}); free space there, lower "
                                         "cache_limit_bytes or point cache_dir at a larger disk") from e
        if on_bytes is not None:
            on_bytes(len(data))
        return len(data)

    if len(ranges) <= 1 or opts.threads == 1:
        return sum(one(r) for r in ranges)
    with ThreadPoolExecutor(min(opts.threads, len(ranges)), thread_name_prefix="shardfeed-fetch") as pool:
        futures = [pool.submit(one, r) for r in ranges]
        try:
            return sum(f.result() for f in futures)
        except BaseException:
            failed.set()
            for f in futures:
                f.cancel()
            raise
