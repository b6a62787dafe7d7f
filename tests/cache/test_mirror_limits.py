"""A remote dataset opened into a cache that cannot hold it: a disk that is full
while its index is mirrored, and a limit below one shard, each end at once in a
CacheLimitError or ShardError naming the URL, the cache and what works."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache import CacheLimitError
from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset


@pytest.fixture
def full_disk(tmp_path):
    """A 16 KiB tmpfs filled to the last byte: a real ENOSPC from the kernel (needs mount rights)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)], capture_output=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({got.stderr.decode().strip()}): a full disk needs one")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # ENOSPC: full
        finally:
            os.close(fd)
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mirror") / "ds")
    with ShardWriter(root, max_shard_samples=16) as w:
        for i in range(64):
            w.write(labelled_sample(i, 8192))
    return root


def test_a_full_disk_while_mirroring_names_the_url_and_the_cache(full_disk, folder):
    with RangeServer(folder) as srv:
        with pytest.raises(ShardError) as err:
            ShardDataset(srv.url, cache_dir=os.path.join(full_disk, "c"), cache_limit_bytes=1 << 20)
    text = str(err.value)
    assert not isinstance(err.value, OSError)  # not a bare OSError(28)
    assert err.value.shard == srv.url and os.path.join(full_disk, "c") in text
    assert "No space left on device" in text and "larger disk" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", [1000, "index"])
def test_a_limit_below_one_shard_names_the_limit_that_works(tmp_path, folder, limit):
    index = open_index(folder)
    if limit == "index":  # exactly the index: it fits, nothing else does (it used to wait 300 s for room)
        limit = os.path.getsize(os.path.join(folder, "index.arrow"))
    with RangeServer(folder) as srv:
        t0 = time.monotonic()
        with pytest.raises(CacheLimitError) as err:
            ShardDataset(srv.url, cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit)
        assert time.monotonic() - t0 < 10
        text, least = str(err.value), err.value.needed_bytes
        assert f"cache_limit_bytes={limit:,}" in text and "limit_bytes to" not in text.replace("cache_limit", "")
        assert least > int(index.sizes.max())  # the largest shard and what stays beside it, not the index
        assert f"at least {least:,}" in text
        ds = ShardDataset(srv.url, cache_dir=str(tmp_path / "d"), cache_limit_bytes=least)  # the figure opens it
        with pytest.raises(CacheLimitError) as err:  # a Loader's start check counts the next shard too
            next(iter(Loader(ds, 8)))
        loader_least = err.value.needed_bytes
        assert f"{loader_least:,}" in text or loader_least <= int(text.split("fetches the next: ")[1].split(";")[0]
                                                                       .replace(",", ""))
        ds = ShardDataset(srv.url, cache_dir=str(tmp_path / "e"), cache_limit_bytes=loader_least)
        with Loader(ds, 8) as loader:
            assert sum(len(b["__key__"]) for b in loader) == 64
