"""A follower may start before its writer (DESIGN, Streaming guarantee): on a
missing or empty folder it waits for the dataset to appear, under the same
idle timeout as any other wait, then delivers every published sample once.

Regression for issue 20: ``ShardDataset(missing, follow=True)`` raised
``ShardError: not a growing dataset`` instead of waiting."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from loader_helpers import step_together
from shardfeed.formats import ShardError
from shardfeed.loader import Loader, Mixture, ShardDataset

# A writer process that first sleeps (the followers are already waiting), then
# creates the dataset, appends n samples in shards of `per` and ends the stream.
WRITER = textwrap.dedent("""
    import sys, time
    from shardfeed.formats import ShardWriter
    root, n, per, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    time.sleep(delay)
    with ShardWriter(root, append=True, max_shard_samples=per, prefix="late") as w:
        for i in range(n):
            w.write({"__key__": f"late-{i:05d}", "cls": i})
            if (i + 1) % per == 0:
                time.sleep(0.01)
        w.end_stream()
""")


def _start_writer(root, n, per, delay=0.5) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(n), str(per), str(delay)])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("make_folder", [False, True])
def test_follower_started_before_its_writer_gets_every_sample_once(tmp_path, workers, make_folder):
    root = tmp_path / "stream"
    if make_folder:
        root.mkdir()  # an empty folder: no index, no log yet
    loaders = [Loader(ShardDataset(root, follow=True, rank=r, world_size=2, poll_s=0.02, idle_timeout_s=60), 4,
                      num_workers=workers) for r in range(2)]
    writer = _start_writer(root, 53, 6)
    try:
        keys, taken = step_together(loaders)
    finally:
        assert writer.wait(timeout=120) == 0
        for L in loaders:
            L.close()
    assert len(set(taken)) == 1
    delivered = Counter(k for ks in keys for k in ks)
    assert sorted(delivered) == [f"late-{i:05d}" for i in range(53)]
    assert sum(delivered.values()) == 53  # 53 = 6 global batches of 8 + a tail of 5 >= 2 ranks: no padding


def test_follower_of_a_stream_mixture_started_before_its_writer(tmp_path, make_dataset):
    fixed = make_dataset(40, shard_samples=10)
    root = tmp_path / "stream"
    mx = Mixture([fixed, ShardDataset(root, follow=True, poll_s=0.02, idle_timeout_s=60)], weights=[1, 1])
    writer = _start_writer(root, 30, 5)
    try:
        with Loader(mx, 6) as L:
            keys = [k for b in L for k in b["__key__"]]
    finally:
        assert writer.wait(timeout=120) == 0
    late = [k for k in keys if k.startswith("late-")]
    assert sorted(late) == [f"late-{i:05d}" for i in range(30)]


def test_dataset_that_never_appears_raises_the_idle_timeout(tmp_path):
    root = tmp_path / "never"
    with Loader(ShardDataset(root, follow=True, poll_s=0.02, idle_timeout_s=0.4), 4) as L:
        t0 = time.monotonic()
        with pytest.raises(ShardError, match=r"no dataset appeared here for 0\.\d s.*idle_timeout_s=0\.4") as e:
            next(iter(L))
    assert str(root) in str(e.value) and time.monotonic() - t0 < 10
    assert not os.path.exists(root)  # the follower creates nothing
