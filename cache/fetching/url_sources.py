"""Where shard bytes come from, chosen by URL scheme.

One contract (`Source`, source_contract.py) with three backends: plain paths and ``file://`` read with
pread; ``http(s)://`` by shardfeed's own checked, bounded client
(http_source.py); ``s3://``, ``gs://`` and ``az://`` through fsspec
(url_schemes.REMOTE_SCHEMES). Any other scheme (``ftp://``, ...), a scheme whose fsspec
driver is not installed, and shell URLs (``pipe:``) are refused with a
ShardError naming the URL: the cache never runs a command to get bytes.
"""

from __future__ import annotations

import os

from shardfeed.cache.fetching.source_contract import Identity, Source
from shardfeed.cache.fetching.url_schemes import EXTRAS, check_url
from shardfeed.formats import ShardError

_filesystems: dict = {}  # (pid, scheme, options) -> this process's fsspec filesystem


class LocalSource(Source):
    def __init__(self, url: str):
        self.url = url
        self.path = url[len("file://"):] if url.startswith("file://") else url

    def size(self) -> int:
        return os.path.getsize(self.path)

    def read_range(self, start: int, end: int) -> bytes:
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), end - start, start)
        if len(data) != end - start:
            raise EOFError(f"read {len(data)} of {end - start} bytes at {start} (file shrank?)")
        return data

    def stat(self) -> Identity:
        st = os.stat(self.path)
        return Identity(st.st_size, None, str(st.st_mtime_ns))

    def read_head(self, n: int, on_request=None) -> bytes:
        with open(self.path, "rb") as f:
            return f.read(n)

    def list(self) -> list[str]:
        base = self.url.rstrip("/")
        return [f"{base}/{n}" for n in sorted(os.listdir(self.path))]


async def _read_upto(body, n: int) -> bytes:
    """Up to ``n`` bytes of an aiobotocore body: one ``read(n)`` returns what has arrived so far
    (65,536 of 549,888 bytes through a paced link), so read until ``n`` or the end."""
    parts, got = [], 0
    while got < n:
        chunk = await body.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class FsspecSource(Source):
    def __init__(self, url: str, fs, path: str):
        self.url = url
        self.fs = fs
        self.path = path

    def size(self) -> int:
        size = self.fs.size(self.path)
        if size is None:
            raise ShardError(self.url, "server reports no size for this object (no Content-Length)")
        return int(size)

    def stat(self):
        """The object's Identity (size, ETag, Last-Modified), asked afresh."""
        self.fs.invalidate_cache(self.path)
        info = self.fs.info(self.path)
        etag = info.get("ETag") or info.get("etag")
        modified = info.get("LastModified") or info.get("last_modified") or info.get("mtime")
        return Identity(info.get("size"), str(etag) if etag else None, str(modified) if modified else None)

    etag: str | None = None  # S3: the object's ETag at this source's first range (If-Match on the next ones)

    def read_range(self, start: int, end: int) -> bytes:
        if "s3" in ((self.fs.protocol,) if isinstance(self.fs.protocol, str) else tuple(self.fs.protocol)):
            return self._s3_range(start, end)
        data = self.fs.cat_file(self.path, start=start, end=end)
        want = end - start
        if len(data) != want:
            if start > 0 and len(data) >= end:
                data = data[start:end]  # the server ignored Range and sent the whole object
            elif start == 0 and len(data) > want:
                data = data[:want]
            else:
                raise EOFError(f"short read: {len(data)} of {want} bytes at offset {start}")
        return bytes(data)

    def read_head(self, n: int, on_request=None) -> bytes:
        return bytes(self.fs.cat_file(self.path, start=0, end=n))

    def _s3_range(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the S3 object; every range after the first asks for the
        ETag the first one had (If-Match), so an object rewritten between two ranges is
        refused, never stitched from two versions."""
        from fsspec.asyn import sync

        bucket, key, version = self.fs.split_path(self.path)
        kw = dict(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        if version:
            kw["VersionId"] = version
        if self.etag:
            kw["IfMatch"] = self.etag
        try:
            resp = self.fs.call_s3("get_object", **kw)
        except Exception as e:  # noqa: BLE001 - s3fs translates most codes; a failed If-Match is named here
            if self.etag and any(w in repr(e) for w in ("PreconditionFailed", "412", "pre-condition")):
                raise ShardError(self.url, f"the object changed on the source while it was read in ranges (ETag "
                                           f"{self.etag} at the first range, another one at bytes {start}-{end - 1})"
                                           "; nothing of it was kept: read it again") from e
            raise
        body = resp["Body"]
        try:
            data = sync(self.fs.loop, _read_upto, body, end - start + 1)  # one byte more shows a body past the range
        finally:
            body.close()
        self.etag = self.etag or resp.get("ETag")
        if len(data) > end - start:
            raise ShardError(self.url, f"the source answered bytes {start}-{end - 1} with more than "
                                       f"{end - start} bytes (Range ignored?); nothing of it was kept")
        if len(data) < end - start:
            raise EOFError(f"short read: {len(data)} of {end - start} bytes at offset {start}")
        return bytes(data)

    def list(self) -> list[str]:
        proto = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        out = []
        # a listing fsspec cached would hide commits published since: list afresh each time
        self.fs.invalidate_cache(self.path)
        for p in self.fs.ls(self.path, detail=False):
            if "://" not in p:
                p = f"{proto}://{p}"
            out.append(p)
        return sorted(out)


def _default_options(scheme: str, stall_s: float) -> dict:
    """Stall detection lives in the transport: a read that gets no byte for
    ``stall_s`` raises, and fetch retries it."""
    if scheme in ("http", "https"):
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=stall_s,
                                                                   sock_read=stall_s)}}
    if scheme in ("s3", "s3a"):
        return {"config_kwargs": {"read_timeout": stall_s, "connect_timeout": stall_s,
                                  "retries": {"max_attempts": 1}}}
    return {}


def _merge(defaults: dict, given: dict) -> dict:
    out = dict(defaults)
    for k, v in given.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def open_source(url: str, storage_options: dict | None = None, stall_s: float = 30.0,
                min_rate: float = 0.0) -> Source:
    """The Source for ``url``; ``storage_options`` go to the fsspec filesystem
    of the URL's scheme (as in ``fsspec.open``), over stall-timeout defaults;
    for http(s):// only ``headers`` is used."""
    url = str(url)
    scheme = check_url(url)
    if scheme in ("", "file"):
        return LocalSource(url)
    if scheme in ("http", "https"):
        from shardfeed.cache.fetching.http_source import HttpSource

        return HttpSource(url, stall_s, min_rate, (storage_options or {}).get("headers"))
    import fsspec
    opts = _merge(_default_options(scheme, stall_s), storage_options or {})
    if _filesystems.get("pid") != os.getpid():
        # a forked child: fsspec's one event-loop thread did not come along, and
        # async filesystems made by the parent would wait on it forever
        import fsspec.asyn

        fsspec.asyn.reset_lock()
        _filesystems.clear()
        _filesystems["pid"] = os.getpid()
    key = (os.getpid(), scheme, repr(sorted(opts.items())))
    fs = _filesystems.get(key)
    if fs is not None:
        return FsspecSource(url, fs, fs._strip_protocol(url))
    try:
        # never fsspec's shared instance: one made before a fork holds an event loop
        # thread the child lacks, and its first request hangs (s3fs in forked workers)
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **opts)
        _filesystems[key] = fs
    except ImportError as e:
        pkg = EXTRAS.get(scheme, "the fsspec driver")
        raise ShardError(url, f"reading {scheme}:// needs {pkg} (pip install 'shardfeed[remote]'): {e}") from e
    return FsspecSource(url, fs, path)
