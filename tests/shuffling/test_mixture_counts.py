"""MixtureCounts: a frozen value whose counts are a pure function of (epoch, global batch); the
positions each source's stream stands at are summed by starts_from, from any epoch already known."""

from __future__ import annotations

import dataclasses

import pytest

from shardfeed.shuffling.apportion import apportion
from shardfeed.shuffling.mixture_counts import MixtureCounts, stages, starts_from


def test_counts_are_a_pure_function_of_the_epoch_and_the_global_batch():
    mc = MixtureCounts(("a", "b", "c"), stages([(1, [1, 1, 1]), (1, [2, 1, 1])], "weights"), None, 30, epoch_steps=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mc.epoch_steps = 6  # type: ignore[misc]
    # asked in any order, by jobs of any size, each answer is its own: nothing one caller asks changes another's
    assert mc.at(1, 8) == apportion(40, [2, 1, 1])
    assert mc.at(0, 4) == apportion(20, [1, 1, 1])
    assert mc.at(1, 4) == apportion(20, [2, 1, 1]) and mc.at(1, 8) == apportion(40, [2, 1, 1])
    with pytest.raises(TypeError, match="depend on the batch size of the Loader"):
        mc.at(0)  # epoch_steps without a job: no length
    fixed = MixtureCounts(("a", "b"), None, stages([3, 4], "counts"), 0)
    assert fixed.at(7) == [3, 4] and fixed.total(7, 99) == 7


def test_starts_sum_the_earlier_epochs_from_any_known_epoch():
    mc = MixtureCounts(("a", "b"), stages([1, 3], "weights"), None, 10)
    counts = [mc.at(e) for e in range(4)]
    assert starts_from(mc.at, 0, 0, [0, 0]) == [0, 0]
    assert starts_from(mc.at, 3, 0, [0, 0]) == [sum(c[i] for c in counts[:3]) for i in range(2)]
    # counted on from a pinned epoch's positions (a saved state's): only the epochs after it are added
    assert starts_from(mc.at, 3, 1, [100, 200]) == [100 + counts[1][0] + counts[2][0], 200 + counts[1][1] + counts[2][1]]
