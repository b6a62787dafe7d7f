"""One checker run on every implementation of the Source contract
(cache/fetching/source_contract.py): a local path, a file:// URL, http(s)
from a Range-capable loopback server and from the standard library's
http.server (no Range), and S3 from moto's server. Each source subclasses
Source with nothing abstract left and no public method the contract does not
declare (callers never probe), and every member answers as declared on a real
object the test writes."""

from __future__ import annotations

import inspect
import os

import pytest

from cache_servers import RangeServer, StaticServer, s3_client, s3_options, upload_folder
from shardfeed.cache import ShardCache
from shardfeed.cache.fetching.fetch import FetchOptions, fetch_to_fd
from shardfeed.cache.fetching.source_contract import Identity, Source
from shardfeed.cache.fetching.url_sources import open_source

BLOB = bytes(range(251)) * 300  # 75,300 bytes: several ranges of the fetch below
DECLARED = {n for n, v in vars(Source).items() if not n.startswith("_")}
KINDS = ("path", "file", "http", "http-static", "s3")


@pytest.fixture
def served(request, tmp_path):
    """(folder URL, options, rewrite(bytes)) of a folder holding ``o.bin`` = BLOB, by the kind asked."""
    kind = request.param
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "o.bin").write_bytes(BLOB)
    local = lambda data: (folder / "o.bin").write_bytes(data)  # noqa: E731
    if kind == "path":
        yield str(folder), None, local
    elif kind == "file":
        yield f"file://{folder}", None, local
    elif kind in ("http", "http-static"):
        with (RangeServer if kind == "http" else StaticServer)(str(folder)) as srv:
            yield srv.url, None, local
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = f"contract-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}"
        s3_client(endpoint).create_bucket(Bucket=bucket)
        upload_folder(endpoint, bucket, str(folder), "ds")

        def rewrite(data):
            local(data)
            upload_folder(endpoint, bucket, str(folder), "ds")

        yield f"s3://{bucket}/ds", s3_options(endpoint), rewrite


def _rewrite(rewrite, tmp_path) -> None:
    """The object rewritten with other bytes of the same size (and, on disk, another mtime)."""
    rewrite(bytes(reversed(BLOB)))
    os.utime(tmp_path / "d" / "o.bin", ns=(10**18, 10**18))


def _open(url, options):
    return open_source(url, options, 10.0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("served", KINDS, indirect=True)
def test_every_source_keeps_the_declared_contract(served, tmp_path):
    url, options, rewrite = served
    src = _open(f"{url}/o.bin", options)
    cls = type(src)
    assert isinstance(src, Source) and not inspect.isabstract(cls)
    extra = {n for n, v in inspect.getmembers(cls, callable) if not n.startswith("_")} - DECLARED
    assert extra == set(), f"{cls.__name__} has public methods the Source contract does not declare: {extra}"
    assert src.deadline is None and src.url == f"{url}/o.bin"

    assert src.size() == len(BLOB)
    assert src.read_range(1000, 1100) == BLOB[1000:1100]
    spans = [(0, 10), (5000, 5100), (len(BLOB) - 7, len(BLOB))]
    assert src.read_ranges(spans) == [BLOB[a:b] for a, b in spans]
    assert src.read_head(64) == BLOB[:64] or src.ignores_range()  # a no-Range server may send more
    assert src.read_head(len(BLOB) + 999) == BLOB  # shorter than asked: all of it
    assert isinstance(src.ignores_range(), bool)

    # read_into: the bytes asked for at their offsets, or the whole object from 0 (said so by True)
    got, heads = bytearray(len(BLOB)), []
    whole = src.read_into(2000, 3000, lambda c, at: got.__setitem__(slice(at, at + len(c)), c), len(BLOB),
                          heads.append)
    assert heads == [whole]
    assert got[2000:3000] == BLOB[2000:3000]
    if whole:
        assert bytes(got) == BLOB

    ident = src.stat()
    assert isinstance(ident, Identity) and ident.size == len(BLOB)
    assert src.identity is None or src.identity.size == len(BLOB)

    # a small object whole; over its bound it is refused (a 4xx status: never asked again)
    small = _open(f"{url}/o.bin", options)
    version, body = small.get_small(len(BLOB))
    assert body == BLOB and version.size == len(BLOB)
    with pytest.raises(OSError) as refused:
        _open(f"{url}/o.bin", options).get_small(len(BLOB) - 1)
    assert refused.value.status == 413
    seen, again = _open(f"{url}/o.bin", options).get_small(len(BLOB), known=version)
    assert again in (None, BLOB) and seen.same(version)
    assert again is None or not version.etag  # unchanged under its ETag: not read again

    listed = _open(url, options).list()
    assert f"{url}/o.bin" in listed, listed

    # the whole object through the fetch every cache entry takes
    fd = os.open(tmp_path / "copy", os.O_CREAT | os.O_RDWR)
    try:
        n = fetch_to_fd(_open(f"{url}/o.bin", options), fd, len(BLOB), FetchOptions(range_bytes=16 << 10))
    finally:
        os.close(fd)
    assert n == len(BLOB) and (tmp_path / "copy").read_bytes() == BLOB

    # a rewrite of the same size is a new version: stat says so, so a cached copy is revalidated
    _rewrite(rewrite, tmp_path)
    assert _open(f"{url}/o.bin", options).stat().token() != ident.token()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("served", ["path", "http", "s3"], indirect=True)
def test_a_copy_kept_without_a_hash_is_served_while_its_source_is_unchanged(served, tmp_path):
    """The version recorded when a copy without a hash is fetched is the one a later get compares:
    unchanged, the copy is served (one request to ask); rewritten, it is fetched again."""
    url, options, rewrite = served
    cache = ShardCache(str(tmp_path / "cache"), 10 << 20, storage_options=options)
    path = cache.get(f"{url}/o.bin")
    assert open(path, "rb").read() == BLOB
    before = cache.stats()
    assert open(cache.get(f"{url}/o.bin"), "rb").read() == BLOB
    after = cache.stats()
    assert after["bytes_fetched"] == before["bytes_fetched"] and after["hits"] == before["hits"] + 1
    _rewrite(rewrite, tmp_path)
    assert open(cache.get(f"{url}/o.bin"), "rb").read() == bytes(reversed(BLOB))
    cache.close()
