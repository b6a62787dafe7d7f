"""Mixture: exact per-epoch counts, even interleaving, equal steps per rank,
worker-count independence, exact and elastic resume, curriculum."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from conftest import labelled_sample
from loader_helpers import check_save_restore, keys_of, step_together
from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, Mixture, ShardDataset
from shardfeed.shuffling.apportion import apportion
from shardfeed.shuffling.mixture_plans import interleave


@pytest.fixture
def sources(tmp_path):
    """Three datasets of different sizes and shard counts; keys say their source."""
    roots = []
    for j, (n, per_shard) in enumerate([(60, 10), (130, 25), (35, 7)]):
        root = str(tmp_path / f"src{j}")
        with ShardWriter(root, max_shard_samples=per_shard) as w:
            for i in range(n):
                s = labelled_sample(i)
                s["__key__"] = f"s{j}-{i:04d}"
                w.write(s)
        roots.append(root)
    return roots


def by_source(keys) -> collections.Counter:
    return collections.Counter(k.split("-")[0] for k in keys)


def test_apportion_is_exact_largest_remainder():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert apportion(97, [0.5, 0.3, 0.2]) == [49, 29, 19]
    assert sum(apportion(1001, [3, 5, 7, 11])) == 1001


@pytest.mark.parametrize("weights,total", [([0.7, 0.3], 101), ([0.5, 0.3, 0.2], 157), ([1, 1, 1], 90)])
def test_weights_honoured_exactly_per_epoch(sources, weights, total):
    roots = sources[:len(weights)]
    mx = Mixture(roots, weights=weights, epoch_samples=total, seed=3)
    want = apportion(total, weights)
    with Loader(mx, 8) as L:
        for epoch in range(3):  # sources repeat (src2: 35 samples) and sub-sample (src1: 130)
            got = by_source(keys_of(L))
            assert [got[f"s{j}"] for j in range(len(roots))] == want, f"epoch {epoch}"


def test_counts_and_subsampling_cover_a_source_before_repeating(sources):
    mx = Mixture(sources[:2], counts=[20, 50], seed=1)  # src0 (60 samples) over three epochs
    with Loader(mx, 10) as L:
        s0 = [k for _ in range(3) for k in keys_of(L) if k.startswith("s0")]
    assert len(s0) == 60 and len(set(s0)) == 60


def test_interleaving_has_no_long_runs(sources):
    src, _ = interleave([600, 300, 100], 0, 1000)
    runs = max(len(list(g)) for _, g in __import__("itertools").groupby(src.tolist()))
    assert runs <= 2
    for t in (10, 100, 333, 1000):  # every prefix is within one sample of its share
        c = np.bincount(src[:t], minlength=3)
        assert np.all(np.abs(c - t * np.array([0.6, 0.3, 0.1])) <= 1.0)
    # the interleave of a range equals the slice of the whole epoch
    whole = interleave([61, 130, 35], 0, 226)
    part = interleave([61, 130, 35], 57, 140)
    assert np.array_equal(whole[0][57:140], part[0]) and np.array_equal(whole[1][57:140], part[1])
    # and every item of every source appears exactly once
    for i, c in enumerate([61, 130, 35]):
        assert sorted(whole[1][whole[0] == i].tolist()) == list(range(c))


def test_each_batch_mixes_sources(sources):
    mx = Mixture(sources, weights=[1, 1, 1], epoch_samples=120, seed=0)
    with Loader(mx, 12) as L:
        for b in L:
            c = by_source(b["__key__"])
            assert all(c[f"s{j}"] == 4 for j in range(3))


@pytest.mark.parametrize("world", [1, 3])
def test_equal_steps_per_rank_and_exact_counts(sources, world):
    mk = [Loader(Mixture(sources, weights=[0.5, 0.3, 0.2], epoch_samples=101, seed=5, rank=r, world_size=world), 8)
          for r in range(world)]
    keys, taken = step_together(mk)
    assert len(set(taken)) == 1 and taken[0] == len(mk[0])
    all_keys = [k for ks in keys for k in ks]
    padded = len(all_keys) - 101
    assert 0 <= padded <= world - 1
    got = by_source(all_keys)
    assert sum(got.values()) - padded == 101
    for L in mk:
        L.close()


def test_same_sequence_for_0_and_2_workers(sources):
    def run(workers):
        mx = Mixture(sources, weights=[2, 1, 1], epoch_samples=90, seed=7)
        with Loader(mx, 8, num_workers=workers) as L:
            return [keys_of(L) for _ in range(2)]

    assert run(0) == run(2)


def test_resume_inside_a_mixed_epoch(sources):
    def make():
        return Loader(Mixture(sources, weights=[0.6, 0.3, 0.1], epoch_samples=80, seed=2), 6)

    check_save_restore(make, points=[1, 5, 13])


def test_elastic_resume_2_to_3_ranks_inside_a_mixed_epoch(sources):
    def mixture(r, w):
        return Mixture(sources, weights=[0.5, 0.3, 0.2], epoch_samples=100, seed=4, rank=r, world_size=w)

    two = [Loader(mixture(r, 2), 5) for r in range(2)]
    before, taken = step_together(two, steps=4)
    state = two[1].state_dict()
    three = [Loader(mixture(r, 3), 5) for r in range(3)]
    for L in three:
        L.load_state_dict(state)
    after, taken3 = step_together(three)
    assert len(set(taken3)) == 1
    delivered = [k for ks in before + after for k in ks]
    with Loader(mixture(0, 1), 5) as one:  # the same epoch on one rank: the multiset to match
        whole = keys_of(one)
    extra = collections.Counter(delivered) - collections.Counter(whole)
    assert collections.Counter(whole) - collections.Counter(delivered) == collections.Counter()
    assert sum(extra.values()) <= 2  # padding of the 3-rank tail only
    for L in two + three:
        L.close()


def test_curriculum_across_epochs_with_resume(sources):
    stages = [(1, [1, 0, 0]), (1, [1, 1, 0]), (1, [1, 1, 2])]

    def make():
        return Loader(Mixture(sources, weights=stages, epoch_samples=40, seed=9), 4)

    with make() as L:
        per_epoch = [by_source(keys_of(L)) for _ in range(4)]
    assert [dict(c) for c in per_epoch] == [{"s0": 40}, {"s0": 20, "s1": 20}, {"s0": 10, "s1": 10, "s2": 20},
                                            {"s0": 10, "s1": 10, "s2": 20}]
    # resume inside epoch 1 (the second stage), then through the change of stage
    with make() as a:
        keys_of(a)
        it = iter(a)
        first = [keys_of([next(it)]) for _ in range(3)]
        state = a.state_dict()
    with make() as b:
        b.load_state_dict(state)
        rest = [keys_of([x]) for x in b]
        nxt = by_source(keys_of(b))
    assert by_source([k for ks in first + rest for k in ks]) == per_epoch[1]
    assert nxt == per_epoch[2]


def test_curriculum_callable_and_changed_counts_refused(sources):
    mx = Mixture(sources[:2], weights=lambda e: [1, e + 1], epoch_samples=30)
    assert mx.counts_at(0) == [15, 15] and mx.counts_at(2) == [8, 22]
    with Loader(mx, 5) as L:
        it = iter(L)
        next(it)
        state = L.state_dict()
    other = Mixture(sources[:2], weights=[1, 3], epoch_samples=30)
    with Loader(other, 5) as L2, pytest.raises(ValueError, match="counts"):
        L2.load_state_dict(state)


def test_on_error_skip_and_raise_for_a_damaged_sample(sources):
    from shardfeed.formats import ShardError, read_sidecar

    path = ShardDataset(sources[0]).index.path(0)
    table, _ = read_sidecar(path + ".idx", path)
    off = int(table.offset[int(table.member_start[4]) - 1])  # sample 3's last member, a payload byte
    with open(path, "r+b") as f:
        f.seek(off)
        c = f.read(1)
        f.seek(off)
        f.write(bytes([c[0] ^ 0xFF]))
    mx = Mixture(sources, counts=[60, 10, 10], on_error="skip", seed=0)
    with Loader(mx, 10) as L:
        keys = keys_of(L)
        assert L.stats()["errors_skipped"] == 1 and len(keys) == 79 and table.keys[3] not in keys
    with Loader(Mixture(sources, counts=[60, 10, 10], seed=0), 10) as L, pytest.raises(ShardError) as e:
        keys_of(L)
    assert e.value.shard == path and "checksum" in e.value.reason


def test_bad_arguments_name_the_fix(sources, tmp_path):
    with pytest.raises(ValueError, match="one number >= 0 per source"):
        Mixture(sources, weights=[1, 2])
    with pytest.raises(ValueError, match="weights or counts"):
        Mixture(sources, weights=[1, 1, 1], counts=[1, 1, 1])
    with pytest.raises(ValueError, match="non-empty list"):
        Mixture(sources[0])


@pytest.mark.parametrize("bad,name", [(float("nan"), "nan"), (float("inf"), "inf"), (-1.0, "-1.0"),
                                      (np.float64("nan"), r"np.float64\(nan\)")])
def test_non_finite_or_negative_weights_are_refused_by_name(sources, tmp_path, bad, name):
    """Regression (issue 20): NaN / inf weights reached fractions.Fraction and raised its
    ValueError / OverflowError, naming neither the weight nor the fix."""
    for make in (lambda w: Mixture(sources, weights=w), lambda w: Mixture(sources, counts=w),
                 lambda w: Mixture(sources, weights=[(1, [1, 1, 1]), (1, w)]).counts_at(1)):
        with pytest.raises(ValueError, match=rf"\[1\]={name} is not a finite number >= 0.*one number >= 0 per source"):
            make([1, bad, 1])
    with pytest.raises(ValueError, match="all are zero"):
        Mixture(sources, weights=[0, 0, 0])
    stream = tmp_path / "live"
    with pytest.raises(ValueError, match=rf"weights of epoch 0 = .*\[1\]={name} is not a finite number"):
        Mixture([sources[0], ShardDataset(stream, follow=True)], weights=[1, bad])


def test_epoch_steps_sets_the_epoch_length_in_steps(sources):
    mx = Mixture(sources, weights=[0.5, 0.3, 0.2], epoch_steps=7, seed=1)
    with Loader(mx, 8) as L:
        assert len(L) == 7
        for _ in range(2):
            batches = list(L)
            assert len(batches) == 7 and all(len(b["__key__"]) == 8 for b in batches)
            got = by_source(keys_of(batches))
            assert [got[f"s{j}"] for j in range(3)] == apportion(56, [0.5, 0.3, 0.2])
    with pytest.raises(ValueError, match="epoch length once"):
        Mixture(sources, weights=[1, 1, 1], epoch_steps=3, epoch_samples=10)
    with pytest.raises(TypeError, match="depend on the batch size of the Loader"):
        len(Mixture(sources, epoch_steps=3))


def test_epoch_steps_elastic_resume_keeps_the_saving_jobs_epoch(sources):
    """2 ranks x 4 (G=8, 5 steps = 40 samples) saved after 2 steps, resumed on 1 rank x 4:
    the rest of the 40-sample epoch comes (6 steps), then epochs of 5 steps of 4."""
    def mixture(r, w):
        return Mixture(sources, weights=[2, 1, 1], epoch_steps=5, seed=6, rank=r, world_size=w)

    two = [Loader(mixture(r, 2), 4) for r in range(2)]
    before, _ = step_together(two, steps=2)
    state = two[0].state_dict()
    with Loader(mixture(0, 2), 4) as a, Loader(mixture(1, 2), 4) as b:
        whole, taken = step_together([a, b])
    assert taken == [5, 5]
    with Loader(mixture(0, 1), 4) as one:
        one.load_state_dict(state)
        rest = list(one)
        nxt = list(one)
    assert len(rest) == 6 and len(nxt) == 5
    got = collections.Counter(k for ks in before for k in ks) + collections.Counter(keys_of(rest))
    assert got == collections.Counter(k for ks in whole for k in ks)
    for L in two:
        L.close()


def test_epoch_steps_state_after_an_elastic_epoch_resumes_where_its_sources_stand(sources):
    """A job resumed at another global batch finishes the saving job's epoch 0 (40 samples), then
    takes epochs of its own (20); a state saved in its epoch 1 carries where each source's stream
    stands (after 40, not 20, samples of epoch 0). Resumed in a fresh Loader it continues from there
    (before, the starts were counted anew from epoch 0 at the new global batch: other samples)."""
    def mixture(r, w):
        return Mixture(sources, weights=[2, 1, 1], epoch_steps=5, seed=6, rank=r, world_size=w)

    two = [Loader(mixture(r, 2), 4) for r in range(2)]
    step_together(two, steps=2)
    state = two[0].state_dict()
    for L in two:
        L.close()
    with Loader(mixture(0, 1), 4) as one:
        one.load_state_dict(state)
        assert len(list(one)) == 6
        it = iter(one)
        [next(it) for _ in range(2)]
        saved = one.state_dict()
        rest = keys_of(list(it))
    assert saved["feed"]["epoch"] == 1 and len(rest) == 12
    assert saved["feed"]["starts"] == [a + c for a, c in zip(state["feed"]["starts"], state["feed"]["counts"])]
    with Loader(mixture(0, 1), 4) as fresh:
        fresh.load_state_dict(saved)
        assert keys_of(list(fresh)) == rest


def test_a_refused_epoch_steps_state_leaves_the_feed_where_it_was(sources):
    """A state whose counts are a valid split but whose step lies outside its epoch is refused, and
    the feed keeps the counts it had pinned (before, the refused state's counts were pinned first)."""
    from shardfeed.loader.schedule import BatchSchedule

    def mixture(r, w):
        return Mixture(sources, weights=[2, 1, 1], epoch_steps=5, seed=6, rank=r, world_size=w)

    two = [Loader(mixture(r, 2), 4) for r in range(2)]
    step_together(two, steps=2)
    state = two[0].state_dict()["feed"]
    for L in two:
        L.close()
    feed = mixture(0, 1).feed(BatchSchedule.of(4))
    feed.reset(state)
    kept = feed.get_state()
    bad = {**state, "counts": apportion(24, [2, 1, 1]), "step": 99}
    with pytest.raises(ValueError, match="step"):
        feed.reset(bad)
    assert feed.get_state() == kept and (kept["counts"], kept["starts"]) == (state["counts"], state["starts"])


def test_loaders_over_one_epoch_steps_mixture_each_count_for_their_own_job(sources):
    """Regression: the Mixture's counts were one mutable memo that each new feed pointed at its own
    global batch and cleared, so a second Loader (or unbatched_plan's feed) over the same Mixture
    re-sized the first Loader's epochs (5 steps of 4 became 10) and dropped the counts it had pinned
    from a saved state of another job. Each feed now owns its counts; MixtureCounts is a frozen value."""
    def mixture(r, w):
        return Mixture(sources, weights=[2, 1, 1], epoch_steps=5, seed=6, rank=r, world_size=w)

    mx = mixture(0, 1)
    with Loader(mx, 4) as small, Loader(mx, 8) as large:
        mx.unbatched_plan()  # a third feed over the same Mixture (workers warm with one)
        assert (len(small), len(large)) == (5, 5)
        assert [len(b["__key__"]) for b in small] == [4] * 5
        assert [len(b["__key__"]) for b in large] == [8] * 5
        assert small.state_dict()["feed"]["counts"] == apportion(20, [2, 1, 1])
        assert large.state_dict()["feed"]["counts"] == apportion(40, [2, 1, 1])

    # a state of 2 ranks x 4 (an epoch of 40 samples) after 2 steps, resumed on 1 rank x 4: the
    # resumed feed pins the saving job's counts; a Loader made after it over the same Mixture reads
    # epochs of its own job (20 samples) and leaves that pin alone
    two = [Loader(mixture(r, 2), 4) for r in range(2)]
    before, _ = step_together(two, steps=2)
    state = two[0].state_dict()
    for L in two:
        L.close()
    with Loader(mixture(0, 2), 4) as a, Loader(mixture(1, 2), 4) as b:
        whole, _ = step_together([a, b])
    mx = mixture(0, 1)
    with Loader(mx, 4) as resumed:
        resumed.load_state_dict(state)
        it = iter(resumed)
        rest = [next(it)]
        with Loader(mx, 4) as fresh:
            assert [len(b["__key__"]) for b in fresh] == [4] * 5
        mid = resumed.state_dict()
        assert (mid["feed"]["counts"], mid["feed"]["starts"]) == (state["feed"]["counts"], state["feed"]["starts"])
        rest += list(it)
    assert len(rest) == 6
    with Loader(mixture(0, 1), 4) as again:  # and the state saved after the other Loader came resumes too
        again.load_state_dict(mid)
        assert keys_of(list(again)) == keys_of(rest[1:])
    got = collections.Counter(k for ks in before for k in ks) + collections.Counter(keys_of(rest))
    assert got == collections.Counter(k for ks in whole for k in ks)
