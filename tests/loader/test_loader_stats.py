"""Loader.stats(): this epoch apart from the Loader's life, flat totals kept,
and a snapshot that prints as two human lines."""

from __future__ import annotations

import json
import re

import pytest

from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.stats import LoaderStats

FLAT = {"samples", "batches", "samples_per_s", "elapsed_s", "wait_s", "stall_fraction", "read_s", "decode_s",
        "collate_s", "transfer_s", "bytes_read", "errors_skipped"}


def _read_batches(st: LoaderStats, batches: int, size: int, seconds: float, nbytes: int = 1000, skipped: int = 0):
    """What the Loader does per batch, in the Loader's own words (+= on the fields, add_info)."""
    for _ in range(batches):
        st.samples += size
        st.batches += 1
        st.wait_s += seconds / batches / 10
        st.transfer_s += 0.0
        st.add_info({"read_s": 0.001, "decode_s": 0.002, "collate_s": 0.003, "bytes": nbytes}, skipped)
    st.elapsed_s += seconds


def test_epoch_part_covers_only_the_last_epoch_and_total_both():
    st = LoaderStats()
    st.start_epoch(0)
    _read_batches(st, 10, 100, 2.0, skipped=1)
    st.start_epoch(1)
    _read_batches(st, 4, 50, 0.5)
    snap = st.snapshot()
    assert snap["epoch"]["number"] == 1
    assert (snap["epoch"]["samples"], snap["epoch"]["batches"], snap["epoch"]["errors_skipped"]) == (200, 4, 0)
    assert snap["epoch"]["elapsed_s"] == pytest.approx(0.5)
    assert snap["epoch"]["samples_per_s"] == pytest.approx(400)
    assert snap["epoch"]["stall_fraction"] == pytest.approx(0.1)
    assert snap["epoch"]["bytes_read"] == 4000
    assert (snap["total"]["samples"], snap["total"]["batches"], snap["total"]["errors_skipped"]) == (1200, 14, 10)
    assert snap["total"]["elapsed_s"] == pytest.approx(2.5) and snap["total"]["bytes_read"] == 14000
    assert "number" not in snap["total"]


def test_flat_keys_stay_and_are_the_totals():
    """tools/train.py and the loader tests read stats()["wait_s"] etc.: they keep working."""
    st = LoaderStats()
    st.start_epoch(0)
    _read_batches(st, 3, 10, 1.0)
    st.start_epoch(1)
    _read_batches(st, 2, 10, 1.0)
    snap = st.snapshot()
    assert FLAT <= set(snap)
    assert {k: snap[k] for k in FLAT} == {k: snap["total"][k] for k in FLAT}
    assert (st.samples, st.batches) == (50, 5)  # the fields read as totals, as before
    assert json.loads(json.dumps(snap))["epoch"]["samples"] == 20  # still a plain, JSON-ready dict


def test_resuming_the_same_epoch_part_way_keeps_adding_to_it():
    st = LoaderStats()
    st.start_epoch(2)
    _read_batches(st, 3, 10, 1.0)
    st.start_epoch(2, fresh=False)  # a new iterator after a break mid-epoch
    _read_batches(st, 2, 10, 1.0)
    assert st.snapshot()["epoch"]["samples"] == 50
    st.start_epoch(2, fresh=True)  # the same epoch read again from its first step
    assert st.snapshot()["epoch"]["samples"] == 0 and st.snapshot()["total"]["samples"] == 50


def test_a_running_iteration_counts_its_time_so_far():
    st = LoaderStats()
    st.start_epoch(0)
    st.started = 0.0  # perf_counter() at the start of the iteration: long ago
    snap = st.snapshot()
    assert snap["epoch"]["elapsed_s"] > 0 and snap["total"]["elapsed_s"] == pytest.approx(snap["elapsed_s"], rel=0.1)


def test_str_is_two_readable_lines_with_thousands_separators_and_plurals():
    st = LoaderStats()
    st.start_epoch(2)
    _read_batches(st, 1, 1, 0.5, nbytes=512)
    st.start_epoch(3)
    _read_batches(st, 50, 256, 1.2, nbytes=500_000, skipped=0)
    text = str(st.snapshot())
    epoch, total = text.splitlines()
    assert epoch == ("epoch 3: 12,800 samples (50 batches) in 1.2 s (10,667/s), data stall 10.0%, "
                     "25.0 MB read, 0 errors skipped")
    assert total.startswith("total:   12,801 samples (51 batches) in 1.7 s (7,530/s), ")
    assert total.endswith("25.0 MB read, 0 errors skipped")
    st2 = LoaderStats()
    st2.start_epoch(0)
    _read_batches(st2, 1, 1, 150.0, nbytes=512, skipped=1)
    assert str(st2.snapshot()).splitlines()[0] == (
        "epoch 0: 1 sample (1 batch) in 2 min 30 s (0/s), data stall 10.0%, 512 B read, 1 error skipped")


def test_before_any_epoch_is_known_only_the_total_is_printed():
    st = LoaderStats()
    _read_batches(st, 2, 1000, 1.0)
    snap = st.snapshot()
    assert snap["epoch"]["number"] is None and snap["epoch"]["samples"] == 2000
    assert str(snap).splitlines() == ["total: 2,000 samples (2 batches) in 1.0 s (2,000/s), data stall 10.0%, "
                                      "2.0 kB read, 0 errors skipped"]


# --- through a real Loader --------------------------------------------------------------

class _WiredLoader(Loader):
    """The Loader with the one call it needs as each iteration starts (the line
    proposed for Loader._iterate: ``st.start_epoch(self.epoch, fresh=self._pos["step"] == 0)``),
    made here from the public position. Harmless once the Loader makes the
    call itself: it is the same call, made just before."""

    def _iterate(self, gen):
        pos = self.state_dict()
        self._stats.start_epoch(pos["epoch"], fresh=pos["step"] == 0)
        yield from super()._iterate(gen)


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_stats_after_two_epochs(make_dataset, workers):
    root = make_dataset(60, shard_samples=20)
    with _WiredLoader(ShardDataset(root), 16, num_workers=workers) as loader:
        list(loader)
        list(loader)  # epoch 1, by the Loader's own move to the next epoch
        snap = loader.stats()
    assert snap["epoch"]["number"] == 1
    assert (snap["epoch"]["samples"], snap["epoch"]["batches"]) == (60, 4)
    assert (snap["total"]["samples"], snap["total"]["batches"]) == (120, 8)
    assert 0 < snap["epoch"]["elapsed_s"] < snap["total"]["elapsed_s"]
    assert 0 < snap["epoch"]["bytes_read"] < snap["total"]["bytes_read"] == snap["bytes_read"]
    assert re.fullmatch(r"epoch 1: 60 samples \(4 batches\) in .*\ntotal: +120 samples \(8 batches\) in .*",
                        str(snap))


def test_loader_stats_resume_after_a_break_stays_in_the_epoch(make_dataset):
    root = make_dataset(60, shard_samples=20)
    with _WiredLoader(ShardDataset(root), 16) as loader:
        for i, _ in enumerate(loader):
            if i == 1:
                break
        list(loader)  # the rest of epoch 0
        snap = loader.stats()
    assert snap["epoch"]["number"] == 0 and snap["epoch"]["samples"] == 60 and snap["total"]["samples"] == 60


def test_plain_loader_stats_keep_their_totals_and_print(make_dataset):
    """What works with today's Loader, before it calls start_epoch: flat totals and str()."""
    root = make_dataset(60, shard_samples=20)
    with Loader(ShardDataset(root), 16) as loader:
        list(loader)
        loader.set_epoch(1)
        list(loader)
        snap = loader.stats()
    assert snap["samples"] == snap["total"]["samples"] == 120 and snap["batches"] == 8
    assert FLAT <= set(snap)
    assert "120 samples (8 batches)" in str(snap)
