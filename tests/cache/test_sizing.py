"""Budget sizing (cache/planning/sizing.py) and the thrash verdict (cache/planning/thrash.py): the start
check's arithmetic, each function against figures worked out by hand in the comments."""

from types import SimpleNamespace

import numpy as np
import pytest

from shardfeed.cache import CacheLimitError
from shardfeed.cache.planning import sizing
from shardfeed.cache.planning.thrash import thrash_ratio
from shardfeed.cache.storage.eviction import plan_bytes


def test_readers_keep_open_shards_within_a_quarter_of_the_budget():
    assert sizing.reader_max_open(4000, 100, 2) == 5  # 4000 // (4 x 2 readers x 100)
    assert sizing.reader_max_open(799, 100, 2) == 0  # tight: each read reopens its shards
    assert sizing.reader_max_open(10 ** 9, 1, 1) == 256  # at most 256 a reader


def test_node_need_counts_each_readers_reads_open_shards_and_one_fetch():
    # readers reading 2 and 3 shards a step, each keeping 4000 // 800 = 5 open, one shard fetched
    assert sizing.node_need(4000, 100, [2, 3]) == (2 + 3 + 5 * 2 + 1) * 100 == 1600
    assert sizing.node_need(700, 100, [2, 3]) == (2 + 3 + 1) * 100  # none kept open at 700


def test_smallest_limit_is_the_fixed_point_of_the_need():
    assert sizing.smallest_limit(100, [1]) == 200  # one read and one fetch; nothing kept open at 200
    # 7 a step: 800 keeps 800 // 400 = 2 open, so 1000 are needed; 1000 keeps 2 too
    assert sizing.smallest_limit(100, [7]) == 1000
    assert sizing.node_need(999, 100, [7]) > 999


def test_whole_shard_check_need_least_window_and_fits():
    fixed, whole = 300, 5000
    # 2 ranks x 2 readers, 2 shards a step each: 1700 free keeps 1700 // (4 x 4 x 100) = 1 open a reader
    per_step = sizing.per_reader([2, 2], 2)
    assert per_step == [2, 2, 2, 2]
    assert sizing.whole_need(2000, fixed, whole, 100, per_step) == 300 + (8 + 1 * 4 + 1) * 100 == 1600
    assert sizing.whole_need(2000, fixed, 1000, 100, per_step) == 1000  # every shard fits: that is all
    assert sizing.whole_least(fixed, whole, 100, per_step) == 300 + (8 + 1) * 100  # 900 keeps none open
    assert sizing.whole_least(fixed, 1000, 100, per_step) == 1000
    assert sizing.prefetch_window(2000, 2000, 100) == 100  # one shard at least
    assert sizing.prefetch_window(3000, 1200, 100) == 1900
    assert sizing.fits(100, [2, 2], 2, 1200, fixed, whole)
    assert not sizing.fits(100, [2, 2], 2, 1199, fixed, whole)  # none kept open: 1200 needed
    assert sizing.fits(100, [2, 2], 1, 800, fixed, whole)  # one reader a rank: 300 + 500


def test_whole_terms_and_ranged_need():
    plans = 2 * plan_bytes(10, False)  # two ranks' plans of 10 shards
    assert sizing.whole_terms(500, 2, 10, 3000) == (500 + plans, 500 + plans + 3000)
    assert sizing.ranged_need(100, 5000, 800) == 900
    assert sizing.ranged_need(100, 500, 800) == 600  # the whole dataset is less than the working set


def test_read_slots_and_its_error():
    assert sizing.read_slots(700, [100, 200, 300], 2, "c", fixed=50) == 3  # 650: all of it fits
    assert sizing.read_slots(620, [100, 200, 300], 1, "c", fixed=50) == 1  # not with the index's 50
    # 950 free for 2 readers of shards up to 300: one slot each, none kept open
    assert sizing.read_slots(1000, [100, 200, 300, 300, 300], 2, "c", fixed=50) == 1
    # 3000 for one reader: 10 slots less the 2 it keeps open
    assert sizing.read_slots(3000, [300] * 12, 1, "c") == 8
    with pytest.raises(CacheLimitError, match="at least 650 ") as e:
        sizing.read_slots(600, [100, 200, 300, 300, 300], 2, "/cache", fixed=50)
    assert e.value.needed_bytes == 650


def test_split_by_shards_cuts_runs_at_most_shards():
    offsets = np.array([0, 3, 6, 9])
    ids = np.array([0, 1, 3, 4, 6, 0])  # shards 0 0 1 1 2 0
    assert [p.tolist() for p in sizing.split_by_shards(ids, offsets, 2)] == [[0, 1, 3, 4], [6, 0]]
    assert [p.tolist() for p in sizing.split_by_shards(ids, offsets, 1)] == [[0, 1], [3, 4], [6], [0]]
    assert [p.tolist() for p in sizing.split_by_shards(ids[:0], offsets, 1)] == [[]]


def test_most_per_step_over_a_prefix():
    pos = np.array([0, 4, 8, 1, 2, 3])  # shards 0 1 2 0 0 0 of offsets 0/4/8/12
    plan = SimpleNamespace(num_samples=len(pos), positions=lambda a, b: pos[a:b])
    offsets = np.array([0, 4, 8, 12])
    assert sizing.most_per_step(offsets, plan, 3, 100) == 3  # step 0 reads shards 0, 1, 2
    assert sizing.most_per_step(offsets, plan, 2, 100) == 2  # (0, 1), (2, 0), (0, 0)
    assert sizing.most_per_step(offsets, plan, 4, 1) == 3  # at least one step: the first 4 samples
    empty = SimpleNamespace(num_samples=0, positions=lambda a, b: pos[:0])
    assert sizing.most_per_step(offsets, empty, 2, 100) == 1


def test_belady_room_leaves_out_what_eviction_cannot_free():
    # 2 readers keep 5 shards of 100 open each: 1000, and 300 fixed
    assert sizing.belady_room(4000, 100, 2, 300) == 2700
    assert sizing.belady_room(250, 100, 1, 200) == 100  # one shard at least


def test_plan_names_twice_what_the_cache_holds_or_every_shard_for_ranges():
    assert sizing.plan_shards(100, 1000, 100, ranged=False) == 22  # 10 held: 2 x 10 + 2
    assert sizing.plan_shards(100, 1000, 100, ranged=True) == 100
    assert sizing.plan_shards(10 ** 5, 10 ** 12, 1, ranged=True) == sizing.LOOKAHEAD_SHARDS


def test_one_shard_limits():
    least, loader = sizing.one_shard_limits(500, 1000, 3)
    assert least == 1500
    assert loader == 500 + plan_bytes(3, False) + 2000  # holds one shard and fetches the next


def test_thrash_ratio():
    assert thrash_ratio({"node_bytes": 2000, "fetched_bytes": 5000}, 1000) == 2.5
    assert thrash_ratio({"node_bytes": 2000, "fetched_bytes": 4000}, 1000) is None  # twice: not over it
    assert thrash_ratio({"node_bytes": 900, "fetched_bytes": 9000}, 1000) is None  # the cache holds it all
