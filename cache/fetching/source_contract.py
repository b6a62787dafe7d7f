"""The Source contract: what the cache reads of one object, whatever its URL scheme.

Every member a caller uses is declared here, with a default where one holds
for a source that reads byte ranges exactly as asked (a local file, an object
store), so callers call members and never probe for them:

    src.size()                  # the object's size in bytes
    src.read_range(a, b)        # exactly bytes [a, b), or raise
    src.read_ranges(spans)      # the bytes of each span
    src.read_into(a, b, sink)   # bytes [a, b) streamed into sink(chunk, offset); True: the whole object came
    src.read_head(n)            # up to n bytes from the start, in one request where the source can
    src.get_small(max_bytes)    # (Identity, bytes) of a small object, None for bytes when `known` still holds
    src.stat()                  # the object's Identity (size, ETag, Last-Modified), asked afresh
    src.ignores_range()         # the server answers a part with the whole object
    src.list()                  # URLs of the objects under this URL taken as a folder
    src.identity                # the version the reads saw (None: reads check no version)
    src.deadline                # time.monotonic() by which a fetch must be done (None: no deadline)

Errors are classified by fetch.is_retryable. tests/cache/test_source_contract.py
runs one check over every implementation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """What names one version of an object: size, ETag, Last-Modified (any may be unknown)."""

    size: int | None = None
    etag: str | None = None
    modified: str | None = None

    def token(self) -> str:
        return f"{self.size}|{self.etag or ''}|{self.modified or ''}"

    def same(self, other: Identity) -> bool:
        if self.etag and other.etag:
            return self.etag == other.etag and (self.size is None or other.size is None or self.size == other.size)
        if self.modified and other.modified and self.modified != other.modified:
            return False
        return self.size is None or other.size is None or self.size == other.size


class TooLarge(OSError):
    """A small object larger than its bound, refused before its body was read."""

    def __init__(self, url: str, size: int, max_bytes: int):
        self.url, self.status = url, 413  # a 4xx: fetch.is_retryable does not ask again
        super().__init__(f"claims {size:,} bytes, more than the {max_bytes:,} allowed for it; refused unread")


class Source(ABC):
    """Read access to one object. ``read_range`` returns exactly ``end - start``
    bytes or raises; errors it raises are classified by fetch.is_retryable."""

    url: str
    # the version this source's reads saw: a source that checks each answer against the first (http)
    # sets it; None where reads check no version
    identity: Identity | None = None
    # time.monotonic() by which the fetch reading this source must be done; a source whose requests can
    # outlive it (http: one request's stall timeout) bounds them by it
    deadline: float | None = None

    @abstractmethod
    def size(self) -> int:
        """The object's size in bytes."""

    @abstractmethod
    def read_range(self, start: int, end: int) -> bytes:
        """Exactly bytes ``[start, end)``, or an error."""

    @abstractmethod
    def list(self) -> list[str]:
        """URLs of the objects directly under this URL taken as a folder."""

    def read_ranges(self, spans) -> list[bytes]:
        """The bytes of each ``[start, end)`` of ``spans``: one read each here; a source whose
        server ignores Range serves them all from one read of the whole object."""
        return [self.read_range(a, b) for a, b in spans]

    def ignores_range(self) -> bool:
        """Whether the server is known to answer a request for part of an object with all of it
        (then ``read_ranges`` of every range at once costs one whole object, not one per range)."""
        return False

    def read_into(self, start: int, end: int, sink, size: int | None = None, on_headers=None) -> bool:
        """Stream bytes ``[start, end)`` into ``sink(chunk, offset)``. False normally; True when the
        server ignored Range and the whole object (``size`` bytes, offsets from 0) came instead.
        ``on_headers(whole)`` is called once the answer is known to be what was asked, before its
        body: here at once, as a range is read exactly as asked."""
        if on_headers is not None:
            on_headers(False)
        sink(self.read_range(start, end), start)
        return False

    def stat(self) -> Identity:
        """The object's Identity, asked afresh (here only its size)."""
        return Identity(self.size())

    def get_small(self, max_bytes: int, known: Identity | None = None, on_request=None
                  ) -> tuple[Identity, bytes | None]:
        """A small object (an index, a log entry, a sidecar, a listing) whole: ``(identity, body)``,
        or ``(known, None)`` when ``known`` is still its version. A body over ``max_bytes`` is
        refused before it is read (TooLarge). Here its version first (``stat``), then its bytes:
        ``on_request()`` is told of that second request."""
        ident = self.stat()
        if known is not None and ident.etag and known.etag and ident.same(known):
            return known, None
        size = int(ident.size or 0)
        if size > max_bytes:
            raise TooLarge(self.url, size, max_bytes)
        if not size:
            return ident, b""
        if on_request is not None:
            on_request()
        return ident, self.read_range(0, size)

    def read_head(self, n: int, on_request=None) -> bytes:
        """Up to ``n`` bytes from the start of the object (all of it when it is shorter), in one
        request where the source can; ``on_request()`` is told of each request after the first.
        Here its size first, then the bytes."""
        end = min(int(n), self.size())
        if on_request is not None:
            on_request()
        return self.read_range(0, end) if end else b""
