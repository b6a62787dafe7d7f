"""The room a ranged cache keeps for sample ranges (cache/cost_model.py, cache/ranged_reads.py)
and what `shardfeed plan` assumes of it (tools/plan_cmd.py, cache/simulate.py): the plan's
reserve is the policy's own for every ranks x workers layout; a prefetch never evicts a
partial copy the plan reads (its sidecar would be fetched again); the simulator admits a
shard into the reserve beyond the worst case exactly when the cost model would."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from conftest import labelled_sample
from shardfeed.cache import ShardCache
from shardfeed.cache.planning.simulate import Accesses, simulate_ranged
from shardfeed.cache.readers.ranged_reads import RangePolicy
from shardfeed.cache.storage.budget import Budget, NoRoom
from shardfeed.cache.storage.disk_blocks import empty_cache_bytes
from shardfeed.formats import ShardWriter, open_index
from shardfeed.tools.plan_cmd import _side_bytes, ranged_reserve


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reserve") / "ds")
    with ShardWriter(root, max_shard_samples=16) as w:
        for i in range(384):
            w.write(labelled_sample(i, 8192))
    return root


@pytest.mark.parametrize("f", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("ranks,workers", [(1, 0), (2, 2), (4, 1), (1, 3)])
def test_plan_keeps_the_reserve_the_policy_keeps(tmp_path, dataset, f, ranks, workers):
    index = open_index(dataset)
    sizes = np.asarray(index.sizes, np.int64)
    sidecars = [os.path.getsize(os.path.join(dataset, n + ".idx")) for n in index.names]
    share = sum(sidecars) / int(sizes.sum())
    limit = int(f * (int(sizes.sum()) + sum(sidecars)))
    policy = RangePolicy(ShardCache(str(tmp_path / "c"), limit), int(sizes.sum()), int(index.num_samples))
    for i, n in enumerate(sidecars):  # as the cache measures them when it fetches them
        policy.observe_sidecar(n, int(sizes[i]), index.path(i))
    policy.working_set(index, 8, ranks * max(1, workers), ranks)  # what the Loader's start check passes
    planned = ranged_reserve(index.counts, sizes, limit, ranks, 8, share, workers, side_bytes=_side_bytes(index),
                             fixed_bytes=empty_cache_bytes())
    assert policy.reserve > 0 and planned == policy.reserve
    # the part of it the cost model's whole shards may not take (the pins, the metadata and the
    # prefetch windows) is the floor the simulator admits against
    _, floor = ranged_reserve(index.counts, sizes, limit, ranks, 8, share, workers, side_bytes=_side_bytes(index),
                              fixed_bytes=empty_cache_bytes(), floor=True)
    assert floor == policy.reserve - policy.slack() and policy.window_bytes > 0
    # more readers per rank pin more batches: the plan sees it (it modelled one reader a rank before)
    if workers > 1:
        assert planned > ranged_reserve(index.counts, sizes, limit, ranks, 8, share, 0,
                                        side_bytes=_side_bytes(index), fixed_bytes=empty_cache_bytes())


def test_reserve_counts_only_the_samples_read_as_ranges(dataset):
    """A batch read from shards held whole needs no room: the nearer the budget is to the
    data, the less the ranges hold on average (it was a fixed share of every batch)."""
    from shardfeed.cache.sample_ranges.cost_model import range_reserve

    index = open_index(dataset)
    total, samples = int(np.sum(index.sizes)), int(index.num_samples)
    got = {f: range_reserve(int(f * total), total, 0.0, samples, 8, 8) for f in (0.3, 0.6, 0.9, 1.0)}
    assert got[0.3] > got[0.6] > got[0.9] > got[1.0] == 0, got
    # at 0.3 at least 70% of the 8 batches' samples are ranges (more: the reserve is room whole
    # shards do not take), each in its span plus a block on average
    mean = total / samples
    assert 0.7 * 64 * mean < got[0.3] < 64 * (mean + 4096), got


def _partial(data: str, key: str, n: int) -> None:
    with open(os.path.join(data, key), "wb") as fh:
        fh.write(os.urandom(n))  # written out: its disk blocks are what the budget counts


def test_a_prefetch_never_evicts_a_partial_copy_the_plan_reads(tmp_path):
    cdir = str(tmp_path)
    data = os.path.join(cdir, "data")
    os.makedirs(data)
    os.makedirs(os.path.join(cdir, "locks"))
    _partial(data, "r-planned", 40960)
    _partial(data, "r-unplanned", 40960)
    budget = Budget(cdir, 90_000, 1.0, lambda: {"r-planned": 3}, lambda **_: None)
    # a prefetch (headroom) needing room: the copy the plan does not read goes, the planned one stays
    tmp = budget.make_room_and_create("r-new", "", 8192, "http://x/new.tar", headroom=8192)
    os.unlink(tmp)
    assert sorted(os.listdir(data)) == ["r-planned"]
    with pytest.raises(NoRoom):  # only a planned copy left to evict: no room rather than churn
        budget.make_room_and_create("r-new", "", 60_000, "http://x/new.tar", headroom=8192)
    assert os.listdir(data) == ["r-planned"]
    # a reader (no headroom) needs the room now: it may evict what the plan reads
    os.unlink(budget.make_room_and_create("r-new", "", 60_000, "http://x/new.tar"))
    assert os.listdir(data) == []


def test_a_prefetch_for_a_step_evicts_only_copies_read_after_it(tmp_path):
    """The prefetcher's window (for_step): Belady at range granularity, among partial copies
    only: a copy read after the step it fetches for may go, one read sooner stays, and a whole
    shard stays whatever its next use."""
    cdir = str(tmp_path)
    data = os.path.join(cdir, "data")
    os.makedirs(data)
    os.makedirs(os.path.join(cdir, "locks"))
    for key in ("r-soon", "r-late", "h-whole"):
        _partial(data, key, 40960)
    plan = {"r-soon": 3, "r-late": 9, "h-whole": 20}
    budget = Budget(cdir, 130_000, 1.0, lambda: plan, lambda **_: None)
    os.unlink(budget.make_room_and_create("r-new", "", 8192, "http://x/new.tar", for_step=5))
    assert sorted(os.listdir(data)) == ["h-whole", "r-soon"]  # read at 9, after 5: it went
    with pytest.raises(NoRoom):  # r-soon is read at 3, before 5; h-whole is a whole shard
        budget.make_room_and_create("r-new", "", 60_000, "http://x/new.tar", for_step=5)
    os.unlink(budget.make_room_and_create("r-new", "", 60_000, "http://x/new.tar", for_step=2))  # 3 is after 2
    assert os.listdir(data) == ["h-whole"]


def test_the_prefetch_window_is_given_back_as_the_readers_move(tmp_path):
    """What the prefetcher may hold for the steps after the readers' next one: claimed up to
    policy.window_bytes; a step the readers reach leaves it (its samples are theirs now)."""
    from types import SimpleNamespace

    from shardfeed.cache.planning.loader_prefetch import SamplePrefetcher

    policy = SimpleNamespace(window_bytes=100)
    with SamplePrefetcher(ShardCache(str(tmp_path / "c"), 1 << 20), lambda pos: ([], []), policy) as p:
        p.moved(None, 10)
        assert p._window_room(11, 60) and not p._window_room(12, 50)  # 110 > 100
        assert p._window_room(12, 40)
        p.moved(None, 11)  # the readers' next step is 11: its 60 bytes leave the window
        assert p._window_room(12, 60) and not p._window_room(13, 1)


def test_an_admitted_shards_room_stays_held_until_its_fetch_starts(tmp_path):
    """RangePolicy._claim holds room for a whole shard with a placeholder; another fetch's scan
    must not take it for a dead fetcher's temporary (nobody holds its fetch lock yet): with 4
    ranks admitting at once, the whole shards overfilled their room (16 where 12 fit) and the
    readers' batches no longer did. A dead process's placeholder is dropped."""
    from shardfeed.cache.storage.admission import ADMIT
    from shardfeed.cache.storage.budget import CacheLimitError

    cdir = str(tmp_path)
    data = os.path.join(cdir, "data")
    os.makedirs(data)
    os.makedirs(os.path.join(cdir, "locks"))
    live = os.path.join(data, f"h-x{ADMIT}{os.getpid()}-abcd")
    dead = os.path.join(data, f"h-y{ADMIT}{(1 << 22) + 7}-abcd")  # above any pid_max: no such process
    for p in (live, dead):
        with open(p, "wb") as fh:
            fh.truncate(40_000)
    budget = Budget(cdir, 100_000, 0.2, lambda: {}, lambda **_: None)
    os.unlink(budget.make_room_and_create("h-z", "", 10_000, "http://x/z.tar"))
    assert os.path.exists(live) and not os.path.exists(dead)
    with pytest.raises(CacheLimitError):  # 60,000 free beside the placeholder
        budget.make_room_and_create("h-z", "", 70_000, "http://x/z.tar")
    os.unlink(budget.make_room_and_create("h-x", "", 70_000, "http://x/x.tar"))  # its own fetch takes it over
    assert not os.path.exists(live)


def test_simulator_admits_beyond_the_worst_case_only_for_two_samples_soon():
    # two shards of 100 bytes; the reserve (200) leaves no room for one in 250, the worst case (100) does
    sizes, counts = [100, 100], [4, 4]
    acc = Accesses.of([0, 1, 0, 1, 0, 1])
    kw = dict(span_bytes=[10, 10], floor_bytes=100)
    # shard 0: a range first (its sidecar unknown), then whole once two of its reads fall in the window
    assert simulate_ranged(sizes, counts, acc, 250, 200, window=3, **kw).tolist() == [10 + 10 + 100 + 10 + 10]
    assert simulate_ranged(sizes, counts, acc, 250, 200, window=2, **kw).tolist() == [60]  # one read a window
    assert simulate_ranged(sizes, counts, acc, 250, 200, span_bytes=[10, 10], window=3).tolist() == [60]  # no floor


@pytest.mark.timeout(300)
def test_a_ranged_reader_holds_no_partial_copy_open_between_reads(tmp_path, dataset, monkeypatch):
    """Its partial copies are closed after each read: nothing the prefetcher brought into them
    is pinned between reads (the worst case counts no kept-open copy), while whole shards stay open."""
    from cache_servers import RangeServer
    from shardfeed.cache.readers import ranged_reads
    from shardfeed.loader import Loader, ShardDataset

    monkeypatch.setattr(ranged_reads, "ENABLED", None)  # samples of 8 KiB: ranges by default
    index = open_index(dataset)
    limit = int(0.5 * int(np.sum(index.sizes)) * 1.02)
    open_ranges, open_whole, batches = 0, 0, 0
    with RangeServer(dataset) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=3, cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit)
        with Loader(ds, 8) as loader:
            for _ in itertools.islice(loader, 12):
                cached = loader._maker.cached
                kinds = [cached._kind.get(s) for s in cached._held]
                open_ranges += kinds.count(ranged_reads.RANGES)
                open_whole += kinds.count(ranged_reads.WHOLE)
                batches += 1
    names = os.listdir(tmp_path / "c" / "data")
    assert batches == 12 and any(n.startswith("r-") for n in names)  # ranges were read
    assert open_ranges == 0 and open_whole > 0, (open_ranges, open_whole)


def test_plan_holds_as_many_whole_shards_as_the_block_budget(tmp_path):
    """Shards of 37.25 blocks with sidecars of 2.7 KB: the budget charges 39 blocks for each held
    whole (and a block more while its admission is claimed); the plan's simulator charged their
    bytes and held ~3% more whole shards, so `shardfeed plan` predicted 0.235 of the data per warm
    epoch where the cache fetched 0.26-0.27 (test_cache_ranges at f = 0.75)."""
    from shardfeed.cache.sample_ranges.cost_model import mean_span
    from shardfeed.cache.storage.admission import ADMIT, claim
    from shardfeed.tools.plan_cmd import ranged_epochs

    size, side, shards = 152_576, 2_682, 64
    share, limit = side / size, 6_000_000
    sizes, counts = np.full(shards, size, np.int64), np.full(shards, 8, np.int64)
    reserve, _ = ranged_reserve(counts, sizes, limit, 1, 8, share, side_bytes=4096, fixed_bytes=0, floor=True)
    cache = ShardCache(str(tmp_path / "c"), limit)
    held = 0
    for i in range(shards):  # misses of distinct shards, admitted one after another
        ok, _ = claim(cache, f"k{i:03d}", size, share, limit - reserve)
        if not ok:
            break
        held += 1
        for name, n in ((f"k{i:03d}", size), (f"k{i:03d}.idx", side)):  # what the fetch leaves, written out
            with open(os.path.join(cache.data_dir, name), "wb") as fh:
                fh.write(b"\1" * n)
        for name in os.listdir(cache.data_dir):
            if ADMIT in name:  # its fetch started: the placeholder gives its room back
                os.unlink(os.path.join(cache.data_dir, name))
    got, = ranged_epochs(counts, sizes, Accesses.of(np.arange(shards)), limit, 1, 8, share, side_bytes=4096,
                         fixed_bytes=0)
    span = mean_span(size, 8)  # a shard not admitted is read as one sample's range
    assert 0 < held < shards and got == int(held * size + (shards - held) * span), \
        (held, (got - shards * span) / (size - span))
