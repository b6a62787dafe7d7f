"""The prefetchers' windows (samples brought for steps after the readers' next) get only
the room beyond the readers' worst case. What a window brings into a copy a reader
then pins stays pinned: at the figure the start check names, windows of a full
share made two ranks wait on each other until the timeout (1 round in 2)."""

from __future__ import annotations

import numpy as np

from conftest import labelled_sample
from shardfeed.cache import ShardCache
from shardfeed.cache.readers.ranged_reads import NEAR_STEPS, RangePolicy
from shardfeed.formats import ShardWriter, open_index


def _policy(tmp_path, ix, limit: int) -> RangePolicy:
    cache = ShardCache(str(tmp_path / f"c{limit}"), limit)
    policy = RangePolicy(cache, int(np.asarray(ix.sizes).sum()), int(ix.num_samples))
    policy.working_set(ix, 8, 2, 2)  # 2 ranks of 1 reader, batches of 8
    return policy


def test_windows_take_only_the_room_beyond_the_readers_worst_case(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(192):
            w.write(labelled_sample(i, 16384))
    ix = open_index(root)
    total = int(np.asarray(ix.sizes).sum())
    roomy = _policy(tmp_path, ix, total // 2)
    share = int(roomy.expected * (NEAR_STEPS - 1) / roomy.held)  # a rank's share of what the windows hold
    assert roomy.window_bytes == share > 0  # room enough: the whole share
    tight = _policy(tmp_path, ix, roomy.fixed + roomy.working)  # the figure the start check names
    assert (tight.working, tight.fixed) == (roomy.working, roomy.fixed)
    assert tight.window_bytes == 0
    # a few samples beyond it: that many samples' worth for the node, shared by its 2 ranks
    some = _policy(tmp_path, ix, roomy.fixed + roomy.working + 4 * roomy.sample_blocks)
    assert some.window_bytes == 2 * some.sample_bytes() < share
