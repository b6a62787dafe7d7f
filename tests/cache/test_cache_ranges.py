"""Misses fetched as sample ranges (cache/ranges.py, cache/ranged_reads.py):
a loopback HTTP dataset read for several epochs through a cache of half of
it, by one and by two ranks sharing the node's cache; bytes counted by the
server. Every delivered sample is compared with what was written; a damaged
range is refused; the prefetcher brings what readers need before they ask."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache import ShardCache, ShardRef
from shardfeed.cache.sample_ranges.cost_model import CostModel
from shardfeed.cache.sample_ranges.ranges import RangeFetcher, coalesce
from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset

N, PAYLOAD, PER_SHARD, BATCH = 1024, 16384, 8, 8


@pytest.fixture(autouse=True)
def _default_ranges(monkeypatch):
    """Samples of 16 KiB: sample ranges by default (no SHARDFEED_CACHE_RANGES override)."""
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", None)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ranges") / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, PAYLOAD))
    return root


def _sizes(root):
    """(shards, sidecars) in the disk's blocks: what the cache's budget charges for them."""
    ix = open_index(root)
    data = sum(_blocks(int(n)) for n in ix.sizes)
    sidecars = sum(_blocks(os.path.getsize(os.path.join(root, n + ".idx"))) for n in ix.names)
    return data, sidecars


def _blocks(n: int) -> int:
    return -(-n // 4096) * 4096


def _check(batch, seen) -> int:
    """Compare each delivered sample with the one written; returns how many were wrong."""
    bad = 0
    for k, c, b in zip(batch["__key__"], batch["cls"].tolist(), batch["bin"]):
        want = labelled_sample(int(k), PAYLOAD)
        bad += (c != want["cls"]) or (bytes(b) != want["bin"])
        seen.append(k)
    return bad


def _rank(url, cache_dir, limit, rank, world, epochs, barrier, out, pause_s):
    ds = ShardDataset(url, shuffle="global", seed=5, cache_dir=cache_dir, cache_limit_bytes=limit, rank=rank,
                      world_size=world)
    result = []
    with Loader(ds, BATCH) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            seen, bad = [], 0
            for b in loader:
                bad += _check(b, seen)
                time.sleep(pause_s)
            st = loader.stats()["epoch"]
            result.append((seen, bad, st["cache_hits"], st["cache_misses"]))
            barrier.wait()  # the epoch is over on every rank: the parent reads the server's counters
            barrier.wait()
        result.append(loader._cache.prefetcher.fetched_samples)
    out.put((rank, result))


def _run(srv, cache_dir, limit, world, epochs, pause_s=0.0):
    """Run ``world`` ranks on this node; (bytes of .tar per epoch from the server, per-rank results)."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(world + 1), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(srv.url, cache_dir, limit, r, world, epochs, barrier, out, pause_s))
             for r in range(world)]
    for p in procs:
        p.start()
    per_epoch, before = [], 0
    try:
        for _ in range(epochs):
            barrier.wait(timeout=300)
            now = srv.bytes_sent(".tar")
            per_epoch.append(now - before)
            before = now
            barrier.wait(timeout=300)
        results = dict(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return per_epoch, results


@pytest.mark.parametrize("f,world", [(0.5, 1), (0.5, 2), (0.75, 1)])
def test_global_epochs_fetch_at_most_what_the_cache_cannot_hold(tmp_path, dataset, f, world):
    data, sidecars = _sizes(dataset)
    limit = int(f * (data + sidecars))
    with RangeServer(dataset) as srv:
        per_epoch, results = _run(srv, str(tmp_path / "c"), limit, world, epochs=3)
        predicted = _plan(srv.url, tmp_path / "plan", limit, world)
    # a shard admitted whole after its samples came as ranges is read whole from then on: its
    # partial copy is gone (it held budget, and its samples were fetched again as ranges)
    names = os.listdir(tmp_path / "c" / "data")
    whole = {n for n in names if "." not in n and not n.startswith("r-")}
    assert whole and not {n[2:] for n in names if n.startswith("r-") and "." not in n} & whole
    for epoch in range(3):
        keys = [k for r in results.values() for k in r[epoch][0]]
        assert sorted(set(keys)) == [f"{i:08d}" for i in range(N)]  # every sample, every epoch
        assert sum(r[epoch][1] for r in results.values()) == 0  # each one equal to what was written
    bound = 1.1 * (1 - f) * data
    for epoch, got in enumerate(per_epoch[1:], start=1):
        assert got <= bound, (epoch, got / data, per_epoch)
    # whole-shard caching of the same budget fetched 2.7x the dataset per epoch here: ranges are doing it
    assert per_epoch[1] > 0.2 * data
    # `shardfeed plan URL` predicts the epochs after the first within 10%
    measured = float(np.mean(per_epoch[1:]))
    assert abs(predicted - measured) <= 0.1 * measured, (predicted / data, measured / data)


def _plan(url, cache_dir, limit, world) -> float:
    """`shardfeed plan URL --json`'s prediction for the cache's own policy: mean bytes of epochs 2-3."""
    import argparse
    import contextlib
    import io
    import json

    from shardfeed.tools import plan_cmd

    p = argparse.ArgumentParser()
    plan_cmd.add_arguments(p)
    args = p.parse_args([url, "--cache-limit", str(limit), "--world-size", str(world), "--batch-size", str(BATCH),
                         "--epochs", "3", "--seed", "5", "--json", "--cache-dir", str(cache_dir)])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert plan_cmd.main(args) == 0
    row, = [r for r in json.loads(out.getvalue())["rows"] if r["order"] == "global" and r["policy"] == "shardfeed"]
    return float(np.mean(row["epochs"][1:]))


def test_whole_dataset_cache_fetches_nothing_after_the_first_epoch(tmp_path, dataset):
    data, sidecars = _sizes(dataset)
    with RangeServer(dataset) as srv:
        # the budget also counts the mirrored index, the published plans (two files of a block each per plan) and
        # the cache's folders, in blocks: room for them beside the data
        per_epoch, results = _run(srv, str(tmp_path / "c"), data + sidecars + (128 << 10), 1, epochs=2, pause_s=0.02)
    (_, bad0, _, _), (seen1, bad1, hits1, misses1), _ = results[0]
    assert bad0 == bad1 == 0 and len(seen1) == N
    assert per_epoch[0] >= int(open_index(dataset).sizes.sum()) and per_epoch[1] == 0
    assert misses1 == 0 and hits1 > 0  # every read a hit


@pytest.mark.parametrize("margin_kib", [0, 32, 88])
def test_a_cache_near_the_dataset_size_refetches_no_more_than_its_shortfall(tmp_path, dataset, margin_kib):
    """At the dataset's size in blocks and 32 KiB over it nothing can hold every shard beside the
    cache's own metadata (here ~80 KiB: the mirrored index 16 KiB, source.txt, seven folders and the
    names 128 shards add to data/ and locks/): a shard or three are read as ranges, never a cliff.
    At +88 KiB all of it fits: the plans' worst case (48 KiB) no longer counts, as a cache that holds
    every shard publishes none (at +88 KiB 1.5-2% of the data was read again every epoch)."""
    data, sidecars = _sizes(dataset)
    with RangeServer(dataset) as srv:
        per_epoch, results = _run(srv, str(tmp_path / "c"), data + sidecars + (margin_kib << 10), 1, epochs=2)
    assert all(len(r[0]) == N and r[1] == 0 for r in results[0][:2])
    assert per_epoch[0] <= 1.02 * int(open_index(dataset).sizes.sum()), per_epoch[0] / data
    if margin_kib >= 88:
        assert per_epoch[1] == 0, per_epoch[1] / data
    else:
        assert per_epoch[1] <= 0.03 * data, per_epoch[1] / data


def test_prefetcher_brings_ranges_before_the_readers_ask(tmp_path, dataset):
    data, sidecars = _sizes(dataset)
    limit = int(0.5 * (data + sidecars))
    with RangeServer(dataset) as srv:
        _, results = _run(srv, str(tmp_path / "c"), limit, 1, epochs=2, pause_s=0.03)
    (_, _, hits1, misses1), prefetched = results[0][1], results[0][2]
    assert prefetched > 0.3 * N  # sample ranges fetched by the prefetcher
    assert misses1 <= 0.25 * (hits1 + misses1), (hits1, misses1)


def test_damaged_range_is_refused_never_written(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(16):
            w.write(labelled_sample(i, PAYLOAD))
    ix = open_index(root)
    from shardfeed.formats.own_tables import read_sidecar

    path = os.path.join(root, ix.names[0])
    table, _ = read_sidecar(path + ".idx", path)
    j = int(table.member_start[3])  # a member of sample 3
    with open(path, "r+b") as f:
        f.seek(int(table.offset[j]))
        byte = f.read(1)
        f.seek(int(table.offset[j]))
        f.write(bytes([byte[0] ^ 0xFF]))
    cache = ShardCache(str(tmp_path / "c"), 1 << 20)
    fetcher = RangeFetcher(cache, CostModel())
    with RangeServer(root) as srv:
        ref = ShardRef(f"{srv.url}/{ix.names[0]}", ix.hashes[0], int(ix.sizes[0]))
        assert fetcher.ensure(ref, [1], PER_SHARD) == (0, 1)  # a good sample comes in
        with pytest.raises(ShardError, match="sample 3 .*fails its checksum"):
            fetcher.ensure(ref, [3], PER_SHARD)
        assert fetcher.ensure(ref, [1], PER_SHARD) == (1, 0)  # still there, checked again
        fd = os.open(fetcher.path(ref), os.O_RDONLY)
        try:
            assert not fetcher._present(fd, table, 3)  # nothing of the damaged range was written
        finally:
            os.close(fd)


def test_coalesce_merges_within_the_gap_only():
    start, end = np.array([0, 100, 5000, 200]), np.array([50, 150, 6000, 300])
    assert coalesce(start, end, 60) == [(0, 300), (5000, 6000)]
    assert coalesce(start, end, 0) == [(0, 50), (100, 150), (200, 300), (5000, 6000)]
    assert coalesce(np.array([5]), np.array([5]), 10) == []
