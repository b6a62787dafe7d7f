"""The cache's start check never advises a setting it would refuse: a refusal
names the block window, shuffle buffer, worker count and order that pass for
this dataset and node, and each one named then passes the same check."""

from __future__ import annotations

import re

import pytest

from conftest import labelled_sample
from shardfeed.cache import CacheLimitError
from shardfeed.cache.readers import ranged_reads
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset

BATCH = 50


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The issue's case: 1,000 samples of 8 KiB in 10 shards of 100."""
    root = str(tmp_path_factory.mktemp("advice") / "ds")
    with ShardWriter(root, max_shard_samples=100) as w:
        for i in range(1000):
            w.write(labelled_sample(i, 8192))
    return root


def _start(folder, cache_dir, num_workers=0, **kw) -> None:
    """The start check (it runs before the first batch), and that first batch."""
    ds = ShardDataset(folder, seed=1, cache_dir=cache_dir, cache_limit_bytes=open_index(folder).num_bytes // 2, **kw)
    with Loader(ds, BATCH, num_workers=num_workers) as loader:
        assert len(next(iter(loader))["__key__"]) == BATCH


def _advised(err: CacheLimitError) -> list[tuple[dict, int | None]]:
    """The settings a refusal names besides a larger limit: (dataset keywords, num_workers or None)."""
    text = str(err)
    out = [({"shuffle": "block", "block_shards": int(w)}, None) for w in re.findall(r"with block_shards=(\d+)", text)]
    out += [({"shuffle": "shard", "shuffle_buffer": int(b)}, None) for b in re.findall(r"with shuffle_buffer=(\d+)", text)]
    out += [({}, int(n)) for n in re.findall(r"num_workers=(\d+)", text)]
    if "shuffle='global' read as sample ranges" in text:
        out.append(({"shuffle": "global"}, None))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", ["block", "shard"])
def test_a_refusal_names_settings_that_pass(tmp_path, folder, shuffle, num_workers):
    with pytest.raises(CacheLimitError) as err:
        _start(folder, str(tmp_path / "c"), num_workers, shuffle=shuffle)
    text = str(err.value)
    assert "up to 10 shard(s) per step" in text  # the defaults' window and buffer span all 10 shards
    advised = _advised(err.value)
    orders = {kw.get("shuffle") for kw, _ in advised}
    assert {"block", "shard", "global"} <= orders, text  # each with a value this node can read
    for j, (kw, workers) in enumerate(advised):
        _start(folder, str(tmp_path / f"c{j}"), num_workers if workers is None else workers,
               **(kw or {"shuffle": shuffle}))


@pytest.mark.timeout(60)
def test_a_smaller_window_is_counted_as_its_shards_per_step(tmp_path, folder):
    # a step of 50 samples in a window of 2 shards touches at most those 2: it passes at half the data
    _start(folder, str(tmp_path / "c"), 0, shuffle="block", block_shards=2)
    _start(folder, str(tmp_path / "d"), 0, shuffle="shard", shuffle_buffer=15)


@pytest.mark.timeout(60)
def test_ranges_off_is_not_advised_back(tmp_path, folder, monkeypatch):
    monkeypatch.setattr(ranged_reads, "ENABLED", False)  # SHARDFEED_CACHE_RANGES=0
    with pytest.raises(CacheLimitError) as err:
        _start(folder, str(tmp_path / "c"), 0, shuffle="global")
    text = str(err.value)
    assert "unset SHARDFEED_CACHE_RANGES" in text and "'block', 'shard'" not in text
    for j, (kw, workers) in enumerate(_advised(err.value)):
        if kw.get("shuffle") == "global":
            monkeypatch.setattr(ranged_reads, "ENABLED", None)  # what unsetting it gives
        _start(folder, str(tmp_path / f"c{j}"), 0 if workers is None else workers, **kw)
        monkeypatch.setattr(ranged_reads, "ENABLED", False)


def test_window_and_buffer_belong_to_their_order(folder):
    with pytest.raises(ValueError, match="block_shards=4 sets the 'block' order"):
        ShardDataset(folder, shuffle="global", block_shards=4)
    with pytest.raises(ValueError, match="shuffle_buffer=0 must be an int >= 1"):
        ShardDataset(folder, shuffle="shard", shuffle_buffer=0)
    a = ShardDataset(folder, shuffle="block", block_shards=2, seed=1)
    b = ShardDataset(folder, shuffle="block", seed=1)
    assert a.spec.block_shards == 2 and a.fingerprint() != b.fingerprint()  # a saved position names it
    assert list(a.unbatched_plan().positions(0, 1000)) != list(b.unbatched_plan().positions(0, 1000))


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory):
    """1,000 samples of 8 KiB in 50 shards of 20: read as sample ranges in the global order."""
    root = str(tmp_path_factory.mktemp("advice_ranges") / "ds")
    with ShardWriter(root, max_shard_samples=20) as w:
        for i in range(1000):
            w.write(labelled_sample(i, 8192))
    return root


@pytest.mark.timeout(120)
def test_a_sample_range_refusal_names_settings_that_pass(tmp_path, small_shards, monkeypatch):
    monkeypatch.setattr(ranged_reads, "ENABLED", None)  # 8 KiB samples: ranges by default
    limit = open_index(small_shards).num_bytes // 8

    def start(j, workers=2, batch=BATCH, **kw):
        ds = ShardDataset(small_shards, seed=1, cache_dir=str(tmp_path / f"c{j}"), cache_limit_bytes=limit,
                          **{"shuffle": "global", **kw})
        with Loader(ds, batch, num_workers=workers) as loader:
            assert len(next(iter(loader))["__key__"]) == batch

    with pytest.raises(CacheLimitError) as err:
        start("x")
    text = str(err.value)
    assert "read as sample ranges" in text and "use fewer workers or smaller batches" not in text
    named = [int(n) for n in re.findall(r"num_workers=(\d+)", text)] + [-int(b) for b in re.findall(r"batch_size=(\d+)", text)]
    assert named, text
    for j, n in enumerate(named):  # each one named passes the check it was refused by
        start(j, workers=n, batch=BATCH) if n >= 0 else start(j, batch=-n)
    for j, (kw, _) in enumerate(_advised(err.value)):  # orders read whole, if any fit
        if kw.get("shuffle") in ("block", "shard"):
            start(f"o{j}", **kw)
