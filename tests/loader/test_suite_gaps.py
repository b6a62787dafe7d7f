"""Tests for two bugs the suite let through: an idle timer measured from the
last commit rather than from the start of the wait (a trainer slower than
the idle timeout would fail at once although the writer is alive), and a
repeated Mixture source whose every pass reuses the first pass's order."""

from __future__ import annotations

import threading
import time

import pytest

from shardfeed.formats import ShardError, ShardWriter
from shardfeed.loader import Loader, Mixture
from shardfeed.loader.feeds.stream_log import StreamLog

pytestmark = pytest.mark.timeout(120)


def _append(root, prefix, n, per=5):
    w = ShardWriter(str(root), append=True, max_shard_samples=per, prefix=prefix)
    for i in range(n):
        w.write({"__key__": f"{prefix}-{i:04d}", "cls": i})
    w.close()


def test_the_idle_timer_starts_with_the_wait_not_at_the_last_commit(tmp_path):
    """The last commit is 1.5 s old when the wait starts (the trainer was
    busy); a commit lands 0.4 s into the wait, well inside the 1 s idle
    timeout counted from the wait's start: the wait returns. A timer counted
    from the last commit raises at its first poll."""
    _append(tmp_path, "a", 10)
    log = StreamLog(str(tmp_path))
    assert log.total == 10
    time.sleep(1.5)  # the trainer works on what it has; no commit meanwhile
    t = threading.Timer(0.4, _append, (tmp_path, "b", 10))
    t.start()
    try:
        t0 = time.monotonic()
        log.wait(15, step=3, poll_s=0.05, idle_timeout_s=1.0)
        assert log.total >= 15 and time.monotonic() - t0 < 5  # returned at the commit, no ShardError
    finally:
        t.join()


def test_the_idle_timer_still_raises_after_a_quiet_wait(tmp_path):
    _append(tmp_path, "a", 10)
    log = StreamLog(str(tmp_path))
    t0 = time.monotonic()
    with pytest.raises(ShardError, match="no commit arrived"):
        log.wait(15, step=3, poll_s=0.05, idle_timeout_s=0.5)
    assert 0.5 <= time.monotonic() - t0 < 3


def test_passes_over_a_repeated_mixture_source_differ(tmp_path):
    """A 12-sample source drawn 36 times an epoch is walked in three passes;
    each pass covers it once, in an order of its own."""
    small, big = str(tmp_path / "small"), str(tmp_path / "big")
    for root, prefix, n in ((small, "s", 12), (big, "b", 36)):
        with ShardWriter(root, max_shard_samples=6) as w:
            for i in range(n):
                w.write({"__key__": f"{prefix}-{i:04d}", "cls": i})
    mx = Mixture([small, big], counts=[36, 36], seed=5)
    keys = [k for b in Loader(mx, 8) for k in b["__key__"]]
    walk = [k for k in keys if k.startswith("s-")]
    assert len(walk) == 36
    passes = [walk[i:i + 12] for i in range(0, 36, 12)]
    for p in passes:
        assert sorted(p) == sorted(f"s-{i:04d}" for i in range(12))  # each pass covers the source once
    assert passes[0] != passes[1] and passes[1] != passes[2] and passes[0] != passes[2], passes
