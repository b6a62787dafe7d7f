"""propose_batch_sizes: per-rank sizes from measured speed (properties, stability under noise)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.shuffling.balance_proposal import fit_rank, propose_batch_sizes, recent_points

PROPS = settings(max_examples=150, deadline=None, derandomize=True)


@st.composite
def problems(draw):
    """Ranks with cost models, measurements at a few sizes, limits and a rounding rule that fit."""
    world = draw(st.integers(1, 6))
    multiple = draw(st.sampled_from([1, 2, 8]))
    lo = [draw(st.integers(1, 3)) * multiple for _ in range(world)]
    hi = [x + draw(st.integers(0, 40)) * multiple for x in lo]
    units = draw(st.integers(-(-sum(lo) // multiple), sum(hi) // multiple))
    models = [(draw(st.floats(1e-4, 1e-1)), draw(st.floats(0, 0.5))) for _ in range(world)]
    meas = []
    for a, c in models:
        sizes = draw(st.lists(st.integers(1, 64), min_size=1, max_size=3))
        noise = draw(st.lists(st.floats(0.8, 1.2), min_size=len(sizes) * 3, max_size=len(sizes) * 3))
        meas.append([(b, (a * b + c) * n) for b, n in zip(sizes * 3, noise)])
    current = draw(st.one_of(st.none(), st.lists(st.integers(1, 64), min_size=world, max_size=world)))
    return meas, units * multiple, current, lo, hi, multiple


@PROPS
@given(problems(), st.floats(0, 0.5))
def test_sizes_sum_to_the_global_batch_inside_the_limits(problem, threshold):
    meas, batch, current, lo, hi, multiple = problem
    p = propose_batch_sizes(meas, batch, current, min_batch=lo, max_batch=hi, multiple=multiple, threshold=threshold)
    assert sum(p.batch_sizes) == batch
    assert all(a <= b <= c and b % multiple == 0 for a, b, c in zip(lo, p.batch_sizes, hi))
    # deterministic: the same inputs (in any order within a rank) give the same proposal
    again = propose_batch_sizes([list(reversed(m)) for m in meas], batch, current, min_batch=lo, max_batch=hi,
                                multiple=multiple, threshold=threshold)
    assert again == p
    # never predicted slower than what it keeps or replaces
    assert p.step_s <= p.current_s + 1e-12


@PROPS
@given(problems())
def test_the_proposal_is_the_best_split_of_the_fitted_models(problem):
    """No other split inside the limits predicts a shorter step (checked by moving one unit between two ranks)."""
    meas, batch, _, lo, hi, multiple = problem
    p = propose_batch_sizes(meas, batch, None, min_batch=lo, max_batch=hi, multiple=multiple)
    models, b = p.models, list(p.batch_sizes)

    def step(sizes):
        return max(a * x + c for (a, c), x in zip(models, sizes))
    for i in range(len(b)):
        for j in range(len(b)):
            if i != j and b[i] - multiple >= lo[i] and b[j] + multiple <= hi[j]:
                moved = list(b)
                moved[i] -= multiple
                moved[j] += multiple
                assert step(moved) >= step(b) - 1e-12


def test_fit_separates_per_sample_and_per_step_time():
    a, c = fit_rank([(8, 0.1 + 8 * 0.01), (8, 0.1 + 8 * 0.01), (32, 0.1 + 32 * 0.01)])
    assert a == pytest.approx(0.01) and c == pytest.approx(0.1)
    assert fit_rank([(16, 0.32)]) == pytest.approx((0.02, 0.0))  # one size: proportional
    assert fit_rank([(8, 0.5), (16, 0.4)])[1] == 0.0  # slower with fewer samples is noise: proportional


def test_a_speed_ratio_is_found_and_hysteresis_keeps_a_good_split():
    meas = [[(32, 0.32)] * 5, [(32, 0.96)] * 5]
    p = propose_batch_sizes(meas, 64, [32, 32])
    assert p.changed and p.batch_sizes == (48, 16)
    near = [[(47, 0.47)] * 5, [(17, 0.51)] * 5]  # 47/17 predicts 0.51 s, 48/16 0.48 s: 6% better
    assert not propose_batch_sizes(near, 64, [47, 17], threshold=0.1).changed
    assert propose_batch_sizes(near, 64, [47, 17], threshold=0.05).batch_sizes == (48, 16)
    # a changed global batch is always re-split
    assert propose_batch_sizes(near, 128, [47, 17], threshold=0.5).batch_sizes == (96, 32)


def test_bad_inputs_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="rank 1 has no measurement"):
        propose_batch_sizes([[(8, 0.1)], []], 16)
    with pytest.raises(ValueError, match="multiple of multiple=8"):
        propose_batch_sizes([[(8, 0.1)], [(8, 0.1)]], 20, multiple=8)
    with pytest.raises(ValueError, match="widen the limits"):
        propose_batch_sizes([[(8, 0.1)], [(8, 0.1)]], 64, max_batch=[16, 16])
    with pytest.raises(ValueError, match="rank 0: compute time"):
        propose_batch_sizes([[(8, float("nan"))]], 8)


def closed_loop(seed, ratio, c, steps=8, batch=64, noise=0.2, intervals=30, swap_at=None):
    """Two ranks of a speed ratio, every step's time off by up to +-noise; after each interval of
    ``steps`` steps, each rank's recent_points are proposed on, as the Balancer does. swap_at: the
    interval from which the slowdown moves to the other rank. Returns the changes, the final sizes
    and per interval the best split's step time over the one run."""
    rng = random.Random(seed)
    a = [0.01, 0.01 * ratio]
    cur = [batch // 2] * 2
    history, changes, efficiency = [[], []], [], []
    for i in range(intervals):
        if i == swap_at:
            a = a[::-1]
        best = min(max(a[0] * b + c, a[1] * (batch - b) + c) for b in range(1, batch))
        efficiency.append(best / max(a[0] * cur[0] + c, a[1] * cur[1] + c))
        for r in range(2):
            history[r].append([(cur[r], (a[r] * cur[r] + c) * (1 + rng.uniform(-noise, noise))) for _ in range(steps)])
            del history[r][:-8]  # the Balancer keeps its last 8 intervals
        p = propose_batch_sizes([recent_points(h) for h in history], batch, cur)
        if p.changed:
            cur = list(p.batch_sizes)
            changes.append((i, cur))
    return changes, cur, efficiency


@pytest.mark.parametrize("c", [0.0, 0.02, 0.2])
@pytest.mark.parametrize("ratio", [1.0, 2.0, 3.0, 5.0])
def test_no_oscillation_on_a_constant_speed_ratio_with_20_percent_noise(ratio, c):
    """Rank 0's size moves one way only, at most three times in 30 intervals (a first guess, the
    fit once two sizes are seen, a last unit), and ends near the ideal split."""
    for seed in range(20):
        changes, cur, _ = closed_loop(seed, ratio, c)
        path = [32] + [b[0] for _, b in changes]
        steps = [y - x for x, y in zip(path, path[1:])]
        assert len(changes) <= 3, (seed, changes)
        assert all(s > 0 for s in steps) or all(s < 0 for s in steps), (seed, changes)
        ideal = 64 * ratio / (1 + ratio)
        assert abs(cur[0] - ideal) <= 0.1 * ideal, (seed, changes)


@pytest.mark.parametrize("c", [0.0, 0.02, 0.2])
def test_a_slowdown_that_moves_to_the_other_rank_is_followed_within_two_intervals(c):
    """5% noise: from two intervals after the slowdown moves, the split runs within 90% of the best one."""
    for seed in range(20):
        changes, _, eff = closed_loop(seed, 3.0, c, noise=0.05, swap_at=10)
        assert min(eff[3:10]) >= 0.9 and min(eff[12:]) >= 0.9, (seed, changes)


def test_recent_points_keep_several_sizes_until_the_speed_changes():
    iv = [[(32, 0.32)] * 3, [(48, 0.48)] * 3, [(40, 0.40)] * 3, [(44, 0.44)] * 3]
    assert sorted({b for b, _ in recent_points(iv)}) == [40, 44, 48]  # the newest three sizes
    assert recent_points(iv, sizes=1) == iv[-1]
    slowed = iv[:-1] + [[(44, 0.88)] * 3]  # twice as slow as the older sizes predict
    assert recent_points(slowed) == slowed[-1]
    assert recent_points([]) == []
