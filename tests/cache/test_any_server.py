"""Any static HTTP server works: the standard library's ``http.server`` (no Range
support) over a converted folder, read through a cache of half the dataset with
every shuffle, delivers every sample once per epoch; the server's behaviour is
found at its first answer, remembered, and named in one warning."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from cache_servers import StaticServer
from conftest import labelled_sample
from shardfeed.cache import CacheLimitError
from shardfeed.cache.fetching.http_source import HttpSource
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset

SAMPLES, PER_SHARD, SAMPLE_BYTES, BATCH = 200, 20, 8192, 10
WARNING = "ignores HTTP Range requests"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("static") / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(SAMPLES):
            w.write(labelled_sample(i, SAMPLE_BYTES))
    return root


def _epochs(ds, num_workers: int, epochs: int = 2) -> list[list[str]]:
    with Loader(ds, BATCH, num_workers=num_workers) as loader:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([k for b in loader for k in b["__key__"]])
        return out


def _option(err: CacheLimitError, name: str) -> int:
    m = re.search(rf"with {name}=(\d+)", str(err))
    assert m, f"the refusal names no {name}: {err}"
    return int(m.group(1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", ["global", "block", "shard"])
def test_stdlib_http_server_delivers_every_sample_once(tmp_path, folder, capfd, shuffle, num_workers):
    limit = open_index(folder).num_bytes // 2
    option = {"block": "block_shards", "shard": "shuffle_buffer"}.get(shuffle)
    with StaticServer(folder) as srv, warnings.catch_warnings():
        warnings.simplefilter("always")
        # every process's warnings, the forked workers' too, straight to fd 2 (a worker exits without
        # flushing a buffered stderr, and one forked inside catch_warnings(record=True) records into its copy)
        warnings.showwarning = lambda msg, cat, *_, **__: os.write(2, f"{cat.__name__}: {msg}\n".encode())
        kw = dict(shuffle=shuffle, seed=3, cache_limit_bytes=limit)
        if option is not None:
            # the defaults (a window of 16 shards, a buffer of 10,000 samples) span all 10 shards, twice
            # what the cache holds: refused, naming a value of the same order that this node can read
            with pytest.raises(CacheLimitError) as err:
                _epochs(ShardDataset(srv.url, cache_dir=str(tmp_path / "c0"), **kw), num_workers, 1)
            kw[option] = _option(err.value, option)
        epochs = _epochs(ShardDataset(srv.url, cache_dir=str(tmp_path / "c"), **kw), num_workers)
        assert 206 not in {code for *_, code, _ in srv.log}  # no Range support (404s: absent log entries)
    for keys in epochs:
        assert sorted(keys) == [f"{i:08d}" for i in range(SAMPLES)]  # every sample once per epoch
    told = capfd.readouterr().err.count(WARNING)
    # global reads sample ranges, each of which the server answers with a whole shard: one warning,
    # whichever process met it first; block and shard read whole shards (one request each): nothing to say
    assert told == (1 if shuffle == "global" else 0)


def test_range_ignoring_server_is_found_at_its_first_answer_and_remembered(tmp_path):
    data = bytes(range(256)) * 64
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "b.bin").write_bytes(data[::-1])
    with StaticServer(str(tmp_path)) as srv, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = HttpSource(f"{srv.url}/a.bin")
        assert a.read_range(100, 300) == data[100:300]  # the whole body came; the part asked for is kept
        assert srv.gets("a.bin") == 1 and a.ignores_range()  # not retried as a range
        b = HttpSource(f"{srv.url}/b.bin")  # another object of the same server: known already
        spans = [(0, 10), (5000, 5100), (16000, 16384)]
        assert b.read_ranges(spans) == [data[::-1][x:y] for x, y in spans]
        assert srv.gets("b.bin") == 1  # one GET serves every range
    named = [str(w.message) for w in seen if WARNING in str(w.message)]
    assert len(named) == 1 and srv.url.split("//")[1] in named[0] and "whole shard" in named[0]


def test_sample_ranges_from_a_range_ignoring_server_take_one_get_per_fetch(tmp_path, folder):
    """A fetch of samples far apart (several ranges) from such a server is one GET of the shard,
    and every sample written to the partial copy is checked and served."""
    from shardfeed.cache import ShardCache, ShardRef
    from shardfeed.cache.sample_ranges.cost_model import CostModel
    from shardfeed.cache.sample_ranges.ranges import RangeFetcher

    ix = open_index(folder)
    fetcher = RangeFetcher(ShardCache(str(tmp_path / "c"), 1 << 22), CostModel())
    with StaticServer(folder) as srv, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = [ShardRef(f"{srv.url}/{ix.names[s]}", ix.hashes[s], int(ix.sizes[s])) for s in (0, 1)]
        assert fetcher.ensure(refs[0], [1], PER_SHARD) == (0, 1)  # the first answer tells
        assert srv.gets(ix.names[0]) == 1
        assert fetcher.ensure(refs[1], [0, 6, 12, 19], PER_SHARD) == (0, 4)  # four ranges apart
        assert srv.gets(ix.names[1]) == 1  # one whole-object GET served them all
        assert fetcher.ensure(refs[1], [0, 6, 12, 19], PER_SHARD) == (4, 0)  # present and checked
