"""http(s):// objects read by shardfeed itself (http.client), every response checked.

fsspec's HTTP filesystem reads a whole body into memory (``cat_file``),
trusts a 200 answered to a Range request and has no rate floor. Here:

- every body is streamed in chunks into its destination, never past the
  bytes asked for (a longer or endless body is an error, not a buffer);
- a ranged answer must be 206 with a Content-Range naming exactly the bytes
  asked for and the object size known so far; its ETag must not change
  between ranges (each range after the first carries If-Match), so a file
  rewritten mid-fetch is refused, never stitched;
- a server answering 200 to a Range sends the whole object: ``read_into``
  streams it once into the destination and says so (the caller serves every
  range from that copy instead of asking again). Such a server (any static
  server without Range support, ``python -m http.server`` among them) is
  remembered by its origin (scheme, host and port) for the rest of the
  process: ``read_range`` / ``read_ranges`` then read the whole object in one
  GET and keep the bytes asked for, never asking for ranges again, and one
  RuntimeWarning names the server and the cost (a process group's ranks and
  workers share one warning per origin: ``note_ignores_range``);
- a read getting no byte for ``stall_s``, or a body arriving slower than
  ``min_rate`` bytes/s (after ``stall_s`` of grace), fails with the URL;
- refused connections, DNS failures, 403, 404 and 5xx are raised as what
  they are (``HttpError.status``), so retries and messages tell them apart.

Connections are kept alive per thread and per process (a forked child never
reuses its parent's socket).
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import tempfile
import threading
import time
import warnings
from hashlib import sha1
from urllib.parse import urljoin, urlsplit

from shardfeed.cache.fetching.source_contract import Identity, Source

CHUNK = 256 << 10
_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_HREF = re.compile(r"""href\s*=\s*["']([^"'#?]+)["']""", re.I)


class _PerThread(threading.local):
    pool: tuple | None = None  # (pid, {(scheme, host, port): kept-alive connection}) of this thread


_local = _PerThread()
_ignoring: set[str] = set()  # origins that answered a Range request with the whole object (this process)
_ignoring_mu = threading.Lock()


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``: what answers its requests."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{parts.port or ''}"


def origin_ignores_range(url: str) -> bool:
    """Whether ``url``'s server answered a Range request of this process with the whole object."""
    return origin(url) in _ignoring


def note_ignores_range(url: str, size: int | None) -> None:
    """Remember that ``url``'s server ignores Range (for this process), and warn once: once per
    origin and process group (a job's ranks and Loader workers), through an empty marker file in
    the temp folder, so two workers meeting the same server do not both warn."""
    where = origin(url)
    with _ignoring_mu:
        if where in _ignoring:
            return
        _ignoring.add(where)
    folder = os.path.join(tempfile.gettempdir(), f"shardfeed-{os.getuid()}-range-ignored")
    marker = os.path.join(folder, sha1(f"{where}|{os.getpgrp()}".encode()).hexdigest()[:16])
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return  # another process of this job warned
    except OSError:
        pass  # no temp folder to mark in: this process warns
    whole = f" ({size:,} bytes)" if size else ""
    warnings.warn(f"shardfeed: the server at {where} ignores HTTP Range requests (it answered a request for "
                  f"part of {url} with the whole object{whole}, HTTP 200). shardfeed reads every object from it "
                  "whole from now on: a shard the cache holds whole is fetched once as before, but each fetch of "
                  "sample ranges of a shard it does not hold transfers the whole shard to keep a few samples. "
                  "Serve the dataset with a server that answers Range requests with 206 (nginx, Apache, "
                  "S3 and other object stores do) to fetch only the samples the plan reads, or read it with "
                  "shuffle='block' or 'shard' (whole shards, each fetched once per use).",
                  RuntimeWarning, stacklevel=2)


class HttpError(OSError):
    """An HTTP answer or transport failure, with ``status`` (0: no answer) and ``url``."""

    def __init__(self, url: str, status: int, what: str):
        self.url, self.status = url, status
        super().__init__(what)


class NotFound(HttpError, FileNotFoundError):
    pass


class Denied(HttpError, PermissionError):
    pass


class Deadline(HttpError, TimeoutError):
    pass


class Changed(HttpError):
    """The object changed between two requests of one fetch (ETag, size or Content-Range)."""


def _identity(resp, size: int | None) -> Identity:
    etag = resp.getheader("ETag")
    if etag and etag.startswith("W/"):
        etag = None  # a weak ETag does not promise the same bytes
    return Identity(size, etag, resp.getheader("Last-Modified"))


class HttpSource(Source):
    """One http(s):// object, every answer checked against the first one's identity (``identity``)."""

    def __init__(self, url: str, stall_s: float = 30.0, min_rate: float = 0.0, headers: dict | None = None):
        self.url = url
        self.stall_s, self.min_rate = float(stall_s), float(min_rate)
        self.headers = dict(headers or {})
        self.identity: Identity | None = None  # of the first answer; later ranges must match it
        self.deadline: float | None = None  # time.monotonic() by which the whole fetch must be done

    # -- transport ---------------------------------------------------------
    def _conn(self, parts):
        pool = _local.pool
        if pool is None or pool[0] != os.getpid():
            pool = _local.pool = (os.getpid(), {})
        key = (parts.scheme, parts.hostname, parts.port)
        conn = pool[1].pop(key, None)
        if conn is None:
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(parts.hostname, parts.port, timeout=self.stall_s)
        return key, conn

    def _keep(self, key, conn) -> None:
        _local.pool[1][key] = conn

    def _request(self, method: str, headers: dict, url: str | None = None, hops: int = 5):
        url = url or self.url
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        key, conn = self._conn(parts)
        try:
            conn.request(method, target, headers={**self.headers, **headers})
            resp = conn.getresponse()
        except ConnectionRefusedError as e:
            conn.close()
            raise HttpError(url, 0, f"connection refused by {parts.netloc} ({e})") from e
        except socket.gaierror as e:
            conn.close()
            raise HttpError(url, 0, f"host {parts.hostname!r} not found (DNS: {e})") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise HttpError(url, 0, f"{type(e).__name__} while asking {parts.netloc}: {e}") from e
        if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location") and hops > 0:
            self._drain(resp, key, conn)
            return self._request(method, headers, urljoin(url, resp.getheader("Location")), hops - 1)
        if resp.status >= 400:
            self._drain(resp, key, conn)
            raise _status_error(url, resp.status, resp.reason)
        return resp, key, conn

    def _drain(self, resp, key, conn) -> None:
        """Read a small error or redirect body so the connection can be reused; else close it."""
        n = resp.getheader("Content-Length")
        if n is not None and n.isdigit() and int(n) <= 65536:
            try:
                resp.read(int(n))
                self._keep(key, conn)
                return
            except (OSError, http.client.HTTPException):
                pass
        conn.close()

    def _body(self, resp, n: int, sink) -> None:
        """Stream exactly ``n`` body bytes into ``sink(chunk, at)``; slow, short or long bodies fail."""
        t0, got = time.monotonic(), 0
        while got < n:
            try:
                chunk = resp.read1(min(CHUNK, n - got))
            except (OSError, http.client.HTTPException) as e:
                raise HttpError(self.url, 0, f"{type(e).__name__} after {got} of {n} bytes: {e}") from e
            if not chunk:
                raise HttpError(self.url, 0, f"connection closed after {got} of {n} bytes")
            sink(chunk, got)
            got += len(chunk)
            now = time.monotonic()
            el = now - t0
            if got < n and el > self.stall_s and got / el < self.min_rate:  # after a grace of one stall
                raise HttpError(self.url, 0, f"too slow: {got} of {n} bytes in {el:.1f} s ({got / el:,.1f} B/s, "
                                             f"below the minimum rate of {self.min_rate:,.0f} B/s)")
            if got < n and self.deadline is not None and now > self.deadline:
                raise Deadline(self.url, 0, f"deadline passed with {got} of {n} bytes of a range read")

    def _finish(self, resp, key, conn) -> None:
        if resp.length == 0:
            resp.read()  # marks the answer done, so the connection takes the next request
            self._keep(key, conn)
        else:  # more body than asked for (or no length): never read it, drop the connection
            conn.close()

    # -- the Source interface ---------------------------------------------
    def stat(self) -> Identity:
        resp, key, conn = self._request("HEAD", {})
        n = resp.getheader("Content-Length")
        resp.length = 0  # a HEAD answer has no body whatever its Content-Length says
        self._finish(resp, key, conn)
        ident = _identity(resp, int(n) if n and n.isdigit() else None)
        self._check_same(ident)
        return ident

    def size(self) -> int:
        size = self.stat().size
        if size is None:
            raise HttpError(self.url, 0, "server reports no size for this object (no Content-Length)")
        return size

    def _check_same(self, ident: Identity) -> None:
        if self.identity is None:
            self.identity = ident
        elif not self.identity.same(ident):
            raise Changed(self.url, 0, f"changed at the source while being fetched (was {self.identity.token()}, "
                                       f"now {ident.token()}); nothing was cached")

    def read_into(self, start: int, end: int, sink, size: int | None = None, on_headers=None) -> bool:
        """Stream bytes [start, end) into ``sink(chunk, offset)``. False normally;
        True when the server ignored Range and the whole object (``size``
        bytes, offsets from 0) was streamed instead. ``on_headers(whole)`` is
        called once the answer's headers are checked, before its body."""
        headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        if self.identity is not None and self.identity.etag:
            headers["If-Match"] = self.identity.etag
        try:
            resp, key, conn = self._request("GET", headers)
        except HttpError as e:
            if e.status == 412:
                raise Changed(self.url, 412, "changed at the source while being fetched (ETag no longer "
                                             "matches); nothing was cached") from e
            raise
        total = size
        if resp.status == 206:
            m = _RANGE.match(resp.getheader("Content-Range") or "")
            if not m or (int(m.group(1)), int(m.group(2)) + 1) != (start, end):
                conn.close()
                raise HttpError(self.url, 206, f"answered bytes {start}-{end - 1} with Content-Range "
                                               f"{resp.getheader('Content-Range')!r}")
            if m.group(3) != "*":
                if size is not None and int(m.group(3)) != size:
                    conn.close()
                    raise Changed(self.url, 206, f"has {m.group(3)} bytes, not the {size} expected (changed at "
                                                 "the source?); nothing was cached")
                total = int(m.group(3))
            n, whole = end - start, False
        elif resp.status == 200:
            length = resp.getheader("Content-Length")
            n = int(length) if length and length.isdigit() else None
            if n is None or (size is not None and n != size):
                conn.close()
                raise HttpError(self.url, 200, f"ignored the Range request and sent {length or 'an unknown size'} "
                                               f"bytes where {size} were expected")
            if start > 0 or end < n:  # part of it was asked for: the server ignores Range
                note_ignores_range(self.url, n)
            whole, total, start = True, n, 0
        else:
            conn.close()
            raise HttpError(self.url, resp.status, f"answered a Range request with HTTP {resp.status}")
        declared = resp.getheader("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) != n:
            conn.close()
            raise HttpError(self.url, resp.status, f"declares {declared} body bytes for a {n}-byte answer")
        self._check_same(_identity(resp, total))
        if on_headers is not None:
            on_headers(whole)
        self._body(resp, n, lambda c, at: sink(c, start + at))
        self._finish(resp, key, conn)
        return whole

    def ignores_range(self) -> bool:
        return origin_ignores_range(self.url)

    def read_range(self, start: int, end: int) -> bytes:
        return self.read_ranges([(start, end)])[0]

    def read_ranges(self, spans) -> list[bytes]:
        """The bytes of each ``[start, end)`` of ``spans``, one GET each; from a server that
        ignores Range (known, or found at the first answer) one GET of the whole object
        serves every span left, only their bytes kept."""
        spans = [(int(a), int(b)) for a, b in spans]
        out: list[bytes | None] = [None] * len(spans)
        for j, (a, b) in enumerate(spans):
            if origin_ignores_range(self.url):
                rest = list(range(j, len(spans)))
                for k, data in zip(rest, self._pick([spans[k] for k in rest])):
                    out[k] = data
                break
            out[j] = self._pick([(a, b)])[0]
        return out

    def _pick(self, spans) -> list[bytes]:
        """Spans of one GET of bytes [first start, last end): a 206 of those, or the whole object."""
        bufs = [bytearray(b - a) for a, b in spans]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)

        def put(chunk, at):
            end = at + len(chunk)
            for (a, b), buf in zip(spans, bufs):
                x, y = max(a, at), min(b, end)
                if x < y:
                    buf[x - a:y - a] = chunk[x - at:y - at]

        self.read_into(lo, hi, put, self.identity.size if self.identity else None)
        return [bytes(b) for b in bufs]

    def get_small(self, max_bytes: int, known: Identity | None = None, on_request=None
                  ) -> tuple[Identity, bytes | None]:
        """One GET of a small object (an index, a log entry, a sidecar, a listing),
        conditional on ``known`` (If-None-Match / If-Modified-Since): (identity,
        None) when unchanged (304), else (identity, body). A body over
        ``max_bytes`` is refused before it is read."""
        headers = {"Accept-Encoding": "identity"}
        if known is not None and known.etag:
            headers["If-None-Match"] = known.etag
        elif known is not None and known.modified:
            headers["If-Modified-Since"] = known.modified
        resp, key, conn = self._request("GET", headers)
        if resp.status == 304:
            self._finish(resp, key, conn)
            return known, None
        if resp.status != 200:
            conn.close()
            raise HttpError(self.url, resp.status, f"answered a GET with HTTP {resp.status}")
        length = resp.getheader("Content-Length")
        if length is None or not length.isdigit():
            conn.close()
            raise HttpError(self.url, 200, "sent no Content-Length (shardfeed bounds every body it reads)")
        if int(length) > max_bytes:
            conn.close()
            raise HttpError(self.url, 413, f"claims {int(length):,} bytes, more than the {max_bytes:,} allowed "
                                           "for it; refused unread")
        buf = bytearray(int(length))
        self._body(resp, len(buf), lambda c, at: buf.__setitem__(slice(at, at + len(c)), c))
        self._finish(resp, key, conn)
        return _identity(resp, len(buf)), bytes(buf)

    def read_head(self, n: int, on_request=None) -> bytes:
        """One bounded GET of the whole object when it is at most ``n`` bytes; a server that
        refuses it as larger is asked for the first ``n`` (``on_request()`` told)."""
        try:
            return self.get_small(n)[1]
        except HttpError as e:
            if e.status != 413:
                raise
            if on_request is not None:
                on_request()
            return self.read_range(0, n)  # larger than guessed: the caller asks its size and reads it whole

    def list(self) -> list[str]:
        """URLs linked from the folder's HTML listing (at most 64 MiB of it)."""
        base = self.url if self.url.endswith("/") else self.url + "/"
        _, body = HttpSource(base, self.stall_s, self.min_rate, self.headers).get_small(64 << 20)
        names = {urljoin(base, h) for h in _HREF.findall(body.decode("utf-8", "replace"))}
        return sorted(n for n in names if n.startswith(base) and n != base)


def _status_error(url: str, status: int, reason: str) -> HttpError:
    what = f"HTTP {status} {reason}".strip()
    if status in (404, 410):
        return NotFound(url, status, f"not found ({what})")
    if status in (401, 403):
        return Denied(url, status, f"access denied ({what})")
    if status >= 500:
        return HttpError(url, status, f"server error ({what})")
    return HttpError(url, status, what)
