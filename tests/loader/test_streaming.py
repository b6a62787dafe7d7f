"""Streaming: writers appending to a live dataset while Loaders follow it.

Real files, real writer processes (subprocess), ranks simulated in one
process in lock step (loader_helpers.step_together) and one real 2-process
gloo job. Invariants: every published sample delivered exactly once across
ranks, equal steps per rank, the end commit ends every rank at the same
step, resume continues exactly, a killed writer's partial shard never shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import numpy as np
import pytest

from loader_helpers import step_together
from shardfeed.formats import ShardError, ShardWriter, compact
from shardfeed.formats.commit_log import LOG_DIR, end_stream, open_stream_index, publish, read_commits
from shardfeed.formats.index import ShardInfo
from shardfeed.loader import Loader, ShardDataset
from shardfeed.shuffling.apportion import tail_shares

# A writer process: appends ``n`` samples (keys PREFIX-i) in shards of
# ``per_shard``, sleeping a random bit between shards, then ends the stream
# if asked. Argv: root prefix n per_shard end(0/1) seed
WRITER = textwrap.dedent("""
    import random, sys, time
    from shardfeed.formats import ShardWriter
    root, prefix, n, per, end, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])
    rng = random.Random(seed)
    w = ShardWriter(root, append=True, max_shard_samples=per, prefix=prefix)
    for i in range(n):
        w.write({"__key__": f"{prefix}-{i:06d}", "cls": i})
        if (i + 1) % per == 0:
            time.sleep(rng.uniform(0, 0.05))
    if end:
        w.end_stream()
    else:
        w.close()
""")

# Writes one full shard, then part of a second one, says so and waits to be killed.
KILLED = textwrap.dedent("""
    import sys, time
    from shardfeed.formats import ShardWriter
    w = ShardWriter(sys.argv[1], append=True, max_shard_samples=10, prefix="k")
    for i in range(15):
        w.write({"__key__": f"k-{i:06d}", "cls": i})
    w._current.file.flush()
    print("ready", flush=True)
    time.sleep(60)
""")


def _writer(root, prefix="w", n=100, per=10, end=True, seed=0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root), prefix, str(n), str(per), "1" if end else "0",
                             str(seed)])


def _live(root) -> None:
    """An empty live dataset (what a first appending writer creates)."""
    os.makedirs(os.path.join(root, LOG_DIR), exist_ok=True)


def _loaders(root, world, batch_size, num_workers=0, **kw):
    kw.setdefault("idle_timeout_s", 60)
    kw.setdefault("poll_s", 0.02)
    return [Loader(ShardDataset(root, follow=True, rank=r, world_size=world, **kw), batch_size,
                   num_workers=num_workers) for r in range(world)]


def _published_keys(root) -> list[str]:
    from shardfeed.formats.readers import open_shard

    index, _ = open_stream_index(str(root))
    keys = []
    for i in range(len(index)):
        keys += list(open_shard(index, i).table.keys)
    return keys


# -- the commit log ---------------------------------------------------------
def test_end_stream_is_final(tmp_path):
    with ShardWriter(tmp_path, append=True, max_shard_samples=4) as w:
        for i in range(10):
            w.write({"__key__": f"a{i}", "cls": i})
    late = ShardWriter(tmp_path, append=True, max_shard_samples=4, prefix="late")
    seq = ShardWriter(tmp_path, append=True).end_stream()
    view = read_commits(str(tmp_path))
    assert view.end == seq == 4 and [s for s, _ in view.shards] == [1, 2, 3]
    late.write({"__key__": "x", "cls": 1})
    with pytest.raises(ShardError, match="ended by commit 4"):
        late.close()  # publishing its shard after the end
    with pytest.raises(ShardError, match="ended"):
        end_stream(str(tmp_path))
    with pytest.raises(ShardError, match="ended"):
        publish(str(tmp_path), ShardInfo("y.tar", "tar", 1, 1, "0"))
    assert read_commits(str(tmp_path)).end == 4  # nothing got past the end
    index, view = open_stream_index(str(tmp_path))
    assert index.num_samples == 10 and view.end == 4


def test_end_stream_needs_append(tmp_path):
    with pytest.raises(ValueError, match="append=True"):
        ShardWriter(tmp_path / "d").end_stream()


def test_killed_writer_partial_shard_never_appears(tmp_path):
    """SIGKILL mid-shard: the finished shard is published, the half-written one
    (left as a temp file) is never listed or read; the next writer continues
    the sequence and followers end at its end commit."""
    p = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert any(".tmp-" in n for n in os.listdir(tmp_path)), "the partial shard should be left as a temp file"
    index, view = open_stream_index(str(tmp_path))
    assert index.num_samples == 10 and [s for s, _ in view.shards] == [1]
    with ShardWriter(tmp_path, append=True, max_shard_samples=10, prefix="next") as w:
        for i in range(7):
            w.write({"__key__": f"next-{i:06d}", "cls": i})
        w.end_stream()
    assert [s for s, _ in read_commits(str(tmp_path)).shards] == [1, 2]
    [L] = _loaders(tmp_path, 1, 4, shuffle="none")
    keys = [k for b in L for k in b["__key__"]]
    assert keys == [f"k-{i:06d}" for i in range(10)] + [f"next-{i:06d}" for i in range(7)]


def test_three_concurrent_writers_lose_no_commit(tmp_path):
    _live(tmp_path)
    procs = [_writer(tmp_path, prefix=f"w{j}", n=120, per=4, end=False, seed=j) for j in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    view = read_commits(str(tmp_path))
    assert [s for s, _ in view.shards] == list(range(1, 91)), "commits lost or numbered with holes"
    keys = _published_keys(tmp_path)
    assert Counter(keys) == Counter(f"w{j}-{i:06d}" for j in range(3) for i in range(120))


def test_tail_shares_cover_exactly():
    for sizes in [(4,), (3, 3), (4, 2, 1), (1, 1, 100), (5, 5, 5, 5), (2, 7)]:
        G, W = sum(sizes), len(sizes)
        for n in range(1, G):
            shares = tail_shares(n, sizes)
            assert sum(c for _, c in shares) == n and shares[0][0] == 0
            assert all(shares[r + 1][0] == shares[r][0] + shares[r][1] for r in range(W - 1))
            assert all(c <= b for (_, c), b in zip(shares, sizes))
            if n >= W:
                assert all(c >= 1 for _, c in shares), (sizes, n, shares)


# -- following ----------------------------------------------------------------
@pytest.mark.parametrize("world,batch_size,num_workers", [(1, 8, 0), (2, 5, 0), (2, [6, 3], 2)])
def test_follow_live_writer_exactly_once(tmp_path, world, batch_size, num_workers):
    _live(tmp_path)
    writer = _writer(tmp_path, n=203, per=7, end=True)
    try:
        loaders = _loaders(tmp_path, world, batch_size, num_workers)
        keys, taken = step_together(loaders)
    finally:
        writer.wait(timeout=60)
        for L in loaders:
            L.close()
    assert len(set(taken)) == 1, f"ranks took different steps: {taken}"
    delivered = Counter(k for ks in keys for k in ks)
    assert sorted(delivered) == sorted(f"w-{i:06d}" for i in range(203))
    # 203 is not a multiple of any global batch here: only padding (tail < world) may repeat
    assert sum(delivered.values()) - 203 <= world - 1


def test_end_ends_every_rank_at_same_step(tmp_path):
    _live(tmp_path)
    with ShardWriter(tmp_path, append=True, max_shard_samples=5) as w:
        for i in range(41):
            w.write({"__key__": f"e{i:04d}", "cls": i})
        w.end_stream()
    loaders = _loaders(tmp_path, 3, [4, 2, 1])
    keys, taken = step_together(loaders)
    assert taken == [6, 6, 6]  # 41 = 5 full global batches of 7 + a tail of 6 (shares 3, 2, 1)
    assert [len(k) for k in keys] == [23, 12, 6]
    assert sorted(k for ks in keys for k in ks) == [f"e{i:04d}" for i in range(41)]
    for L in loaders:
        assert L.state_dict()["feed"]["done"] and list(L) == []


def test_tail_smaller_than_world_pads(tmp_path):
    with ShardWriter(tmp_path, append=True, max_shard_samples=5) as w:
        for i in range(9):  # 2 full global batches of 4, a tail of 1 over 4 ranks
            w.write({"__key__": f"p{i}", "cls": i})
        w.end_stream()
    keys, taken = step_together(_loaders(tmp_path, 4, 1))
    assert taken == [3, 3, 3, 3]
    assert [k[-1] for k in keys] == ["p8"] * 4  # three ranks repeat the one tail sample
    keys, taken = step_together(_loaders(tmp_path, 4, 1, drop_last=True))
    assert taken == [2, 2, 2, 2] and sorted(k for ks in keys for k in ks) == [f"p{i}" for i in range(8)]


def test_idle_timeout_raises(tmp_path):
    with ShardWriter(tmp_path, append=True, max_shard_samples=4) as w:
        for i in range(6):
            w.write({"__key__": f"t{i}", "cls": i})
    [L] = _loaders(tmp_path, 1, 4, idle_timeout_s=0.3, poll_s=0.05)
    it = iter(L)
    assert len(next(it)["__key__"]) == 4
    t0 = time.monotonic()
    with pytest.raises(ShardError, match=r"no commit arrived for 0\.\d s.*end_stream") as e:
        next(it)
    assert str(tmp_path) in str(e.value) and time.monotonic() - t0 < 5


def test_workers_same_sequence(tmp_path):
    with ShardWriter(tmp_path, append=True, max_shard_samples=9) as w:
        for i in range(100):
            w.write({"__key__": f"q{i:04d}", "cls": i})
        w.end_stream()
    runs = []
    for nw in (0, 2):
        runs.append(step_together(_loaders(tmp_path, 2, [5, 3], nw, shuffle="global", seed=3)))
    assert runs[0] == runs[1]
    assert runs[0][0][0][:5] != [f"q{i:04d}" for i in range(5)], "global shuffle should mix inside a global batch"


def test_resume_mid_stream_exact(tmp_path):
    """State mid-stream, a new Loader (same and other world size) delivers exactly the rest."""
    _live(tmp_path)
    with ShardWriter(tmp_path, append=True, max_shard_samples=6) as w:
        for i in range(50):
            w.write({"__key__": f"r{i:04d}", "cls": i})
    with ShardWriter(tmp_path, append=True, max_shard_samples=6, prefix="more") as w:
        for i in range(50, 77):
            w.write({"__key__": f"r{i:04d}", "cls": i})
        w.end_stream()
    full, _ = step_together(_loaders(tmp_path, 2, 4, seed=1))
    first = _loaders(tmp_path, 2, 4, seed=1)
    got, _ = step_together(first, steps=3)
    states = [L.state_dict() for L in first]
    assert states[0] == json.loads(json.dumps(states[0]))  # plain JSON
    assert states[0]["feed"]["watermark"]["samples"] == 24
    second = _loaders(tmp_path, 2, 4, seed=1)
    for L, s in zip(second, states):
        L.load_state_dict(s)
    rest, _ = step_together(second)
    assert [a + b for a, b in zip(got, rest)] == full
    # another world size: any rank's state, loaded by 3 ranks, yields exactly the rest
    third = _loaders(tmp_path, 3, 2, seed=1)
    for L in third:
        L.load_state_dict(states[1])
    rest3, taken3 = step_together(third)
    assert len(set(taken3)) == 1
    assert sorted(k for ks in got + rest3 for k in ks) == [f"r{i:04d}" for i in range(77)]


def test_resume_in_new_process_before_end(tmp_path):
    """A reader stopped while the stream is open resumes from its state while the writer keeps going."""
    _live(tmp_path)
    writer = _writer(tmp_path, n=90, per=9, end=True)
    try:
        [a] = _loaders(tmp_path, 1, 10)
        it = iter(a)
        first = [list(next(it)["__key__"]) for _ in range(4)]
        state = a.state_dict()
        a.close()
        [b] = _loaders(tmp_path, 1, 10, num_workers=2)
        b.load_state_dict(state)
        rest = [list(x["__key__"]) for x in b]
        b.close()
    finally:
        writer.wait(timeout=60)
    keys = [k for ks in first + rest for k in ks]
    assert sorted(keys) == [f"w-{i:06d}" for i in range(90)] and len(keys) == 90


def test_compact_while_following(tmp_path):
    """Compaction folds the log into index.arrow while a reader follows: ids stay, nothing repeats."""
    _live(tmp_path)
    with ShardWriter(tmp_path, append=True, max_shard_samples=5) as w:
        for i in range(20):
            w.write({"__key__": f"c{i:03d}", "cls": i})
    [L] = _loaders(tmp_path, 1, 6, shuffle="none")
    it = iter(L)
    got = [k for _ in range(2) for k in next(it)["__key__"]]
    compact(str(tmp_path))
    with ShardWriter(tmp_path, append=True, max_shard_samples=5, prefix="after") as w:
        for i in range(20, 33):
            w.write({"__key__": f"c{i:03d}", "cls": i})
        w.end_stream()
    got += [k for b in it for k in b["__key__"]]
    assert got == [f"c{i:03d}" for i in range(33)]
    [again] = _loaders(tmp_path, 1, 6, shuffle="none")  # a new reader: index.arrow then the log's later shards
    assert [k for b in again for k in b["__key__"]] == got


def test_follow_needs_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ShardError, match="growing dataset.*not a folder"):
        ShardDataset(tmp_path / "file", follow=True)
    # a folder that does not exist yet is waited for (tests/loader/test_follow_start.py)
    with pytest.raises(TypeError, match="no fixed plan or length"):
        len(ShardDataset(_mk_live(tmp_path), follow=True))


def test_follow_a_dataset_written_whole_ends_at_its_index(tmp_path):
    """A dataset written without append=True has no commit log: it is complete,
    so following it delivers it once and ends instead of waiting."""
    with ShardWriter(tmp_path, max_shard_samples=4) as w:
        for i in range(10):
            w.write({"__key__": f"f{i}", "cls": i})
    keys, taken = step_together(_loaders(tmp_path, 2, 2, idle_timeout_s=1))
    assert taken == [3, 3] and sorted(keys[0] + keys[1]) == sorted(f"f{i}" for i in range(10))


def _mk_live(tmp_path):
    root = tmp_path / "live"
    _live(root)
    return root


# -- a real 2-rank job (gloo) ---------------------------------------------------
def _rank_stream(rank, world_size, root):
    import torch
    import torch.distributed as dist

    L = Loader(ShardDataset(root, follow=True, poll_s=0.02, idle_timeout_s=60), 4)
    keys, steps = [], 0
    for b in L:
        keys += b["__key__"]
        steps += 1
        t = torch.ones(1)
        dist.all_reduce(t)  # a DDP step: hangs if ranks disagree on the step count
    L.close()
    return keys, steps


def test_two_process_gloo_follow(tmp_path):
    from distributed_utils import run_ranks

    _live(tmp_path)
    writer = _writer(tmp_path, n=66, per=5, end=True)
    try:
        results = run_ranks(_rank_stream, 2, str(tmp_path), timeout=120)
    finally:
        writer.wait(timeout=60)
    (k0, s0), (k1, s1) = results
    assert s0 == s1
    assert sorted(k0 + k1) == [f"w-{i:06d}" for i in range(66)]


def test_lookahead_lists_published_shards_in_order_of_use(tmp_path):
    with ShardWriter(tmp_path, append=True, max_shard_samples=5) as w:
        for i in range(23):
            w.write({"__key__": f"l{i:03d}", "cls": i})
    [L] = _loaders(tmp_path, 1, 4, shuffle="none")
    feed = L.feed
    assert [u.shard for u in feed.lookahead(10)] == [0, 1, 2, 3]  # 20 samples form 5 steps; 3 wait in shard 4
    assert [u.step for u in feed.lookahead(10)] == [0, 1, 2, 3]
    it = iter(L)
    next(it), next(it)
    assert [u.shard for u in feed.lookahead(2)] == [1, 2]


# -- replay and window ------------------------------------------------------------
def _stream(root, n, per_shard=5):
    with ShardWriter(root, append=True, max_shard_samples=per_shard) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:04d}", "cls": i})
        w.end_stream()


def test_replay_mix_and_window(tmp_path):
    """Each full global batch: 6 new samples in stream order, then 2 old ones drawn
    from the last 3 commits before them; every new sample comes once as new."""
    from shardfeed.loader import BatchSchedule

    _stream(tmp_path, 300)
    ds = ShardDataset(tmp_path, follow=True, rank=0, world_size=1, shuffle="none", replay=0.25, window=3)
    feed = ds.feed(BatchSchedule.of(8))
    new_seen, olds = [], 0
    for item in feed:
        ids = item.ids()
        if len(ids) < 8:  # the tail: only new samples
            new_seen += ids.tolist()
            continue
        new, old = ids[:6], ids[6:]
        assert (new == np.arange(new[0], new[0] + 6)).all()
        newest_shard = (new[-1]) // 5
        lo = max(0, newest_shard - 3 + 1) * 5
        assert ((old >= lo) | (new[0] == 0)).all() and (old < max(new[0], 6)).all(), (new, old)
        new_seen += new.tolist()
        olds += len(old)
    assert new_seen == list(range(300))
    assert olds == 2 * (300 // 6)  # the ratio is exact: 2 of 8 in every full global batch


def test_replay_shuffled_ratio_and_resume(tmp_path):
    _stream(tmp_path, 401, per_shard=7)  # 57 full global batches of 7 new + a tail of 2 (no padding)
    kw = {"replay": 0.3, "window": 10, "seed": 5}
    full, taken = step_together(_loaders(tmp_path, 2, [6, 4], **kw))
    assert len(set(taken)) == 1
    delivered = Counter(k for ks in full for k in ks)
    assert set(delivered) == {f"s{i:04d}" for i in range(401)}
    extra = sum(delivered.values()) - 401
    assert extra == 3 * 57  # G=10, per=7: 3 replayed in each full global batch
    first = _loaders(tmp_path, 2, [6, 4], **kw)
    got, _ = step_together(first, steps=20)
    states = [L.state_dict() for L in first]
    second = _loaders(tmp_path, 2, [6, 4], **kw)
    for L, s in zip(second, states):
        L.load_state_dict(s)
    rest, _ = step_together(second)
    assert [a + b for a, b in zip(got, rest)] == full


def test_replay_needs_follow_and_a_new_sample(tmp_path):
    _stream(tmp_path, 10)
    with pytest.raises(ValueError, match="follow=True"):
        ShardDataset(tmp_path, replay=0.5)
    with pytest.raises(ValueError, match=r"replay=1\.5"):
        Loader(ShardDataset(tmp_path, follow=True, replay=1.5), 4)


def test_ended_stream_opens_as_a_fixed_dataset(tmp_path):
    """After end_stream the dataset is complete: open_index, compact and a plain ShardDataset read it."""
    from shardfeed.formats import open_index

    _stream(tmp_path, 12)
    assert open_index(str(tmp_path)).num_samples == 12
    compact(str(tmp_path))
    assert len(ShardDataset(tmp_path, rank=0, world_size=1)) == 12
