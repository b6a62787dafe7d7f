"""The commit log's rules, each against a log the test damages or races by
hand: a name is committed at most once, the sequence has no holes, a
replaced shard is refused, nothing lands after the end (even for a writer
whose listing is stale), and a lost response to a conditional put on S3 does
not commit the same shard twice."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from shardfeed.formats import ShardError, ShardWriter, open_shard
from shardfeed.formats import commit_log as cl
from shardfeed.formats.commit_log import LOG_DIR, end_stream, open_stream_index, publish, read_commits
from shardfeed.formats.index import ShardInfo
from shardfeed.loader import Loader, ShardDataset

pytestmark = pytest.mark.hostile(timeout=120)  # bounded time and memory (conftest.py)


def _stream(root, shards: int, per: int = 10, end: bool = True) -> None:
    w = ShardWriter(root, append=True, max_shard_samples=per)
    for i in range(shards * per):
        w.write({"__key__": f"k{i:05d}", "cls": i})
    if end:
        w.end_stream()
    else:
        w.close()


def _follow_keys(root, **kw) -> list[str]:
    ds = ShardDataset(str(root), follow=True, rank=0, world_size=1, idle_timeout_s=5, poll_s=0.02, **kw)
    return [k for b in Loader(ds, 5) for k in b["__key__"]]


def _entry(root, seq: int) -> str:
    return os.path.join(root, LOG_DIR, f"{seq:012d}.json")


# -- a name is committed at most once ----------------------------------------
def test_a_second_commit_of_a_committed_name_is_refused(tmp_path):
    _stream(tmp_path, 2, end=False)
    info = open_stream_index(str(tmp_path))[0].shard(0)
    with pytest.raises(ShardError, match=f"{info.name}.*already committed.*commit 1"):
        publish(str(tmp_path), info)
    assert [s for s, _ in read_commits(str(tmp_path)).shards] == [1, 2]


def test_a_name_twice_in_the_log_is_damage_reading_and_following(tmp_path):
    _stream(tmp_path, 2, end=False)
    shutil.copy(_entry(tmp_path, 1), _entry(tmp_path, 3))  # a second commit of shard 1, by hand
    end_stream(str(tmp_path))
    with pytest.raises(ShardError, match="committed twice.*commits 1 and 3"):
        open_stream_index(str(tmp_path))
    with pytest.raises(ShardError, match="committed twice"):
        _follow_keys(tmp_path)


def test_a_name_twice_across_polls_is_damage_while_following(tmp_path):
    """The duplicate arrives after the follower read the first commit."""
    _stream(tmp_path, 2, end=False)
    ds = ShardDataset(str(tmp_path), follow=True, rank=0, world_size=1, idle_timeout_s=5, poll_s=0.02)
    it = iter(Loader(ds, 5))
    got = [k for _ in range(4) for k in next(it)["__key__"]]  # everything published so far
    assert len(got) == 20
    shutil.copy(_entry(tmp_path, 1), _entry(tmp_path, 3))
    end_stream(str(tmp_path))
    with pytest.raises(ShardError, match="committed twice"):
        next(it)


# -- the log has no holes -----------------------------------------------------
def test_a_hole_in_the_log_is_damage_naming_the_missing_seq(tmp_path):
    _stream(tmp_path, 12, end=True)  # 120 samples, end at 13
    os.unlink(_entry(tmp_path, 5))
    with pytest.raises(ShardError, match="commit 5 is missing"):
        open_stream_index(str(tmp_path))
    with pytest.raises(ShardError, match="commit 5 is missing"):
        _follow_keys(tmp_path)


def test_a_hole_after_the_followers_watermark_is_damage(tmp_path):
    _stream(tmp_path, 2, end=False)
    ds = ShardDataset(str(tmp_path), follow=True, rank=0, world_size=1, idle_timeout_s=5, poll_s=0.02)
    it = iter(Loader(ds, 5))
    assert len([k for _ in range(4) for k in next(it)["__key__"]]) == 20
    _stream_more = ShardWriter(str(tmp_path), append=True, max_shard_samples=10, prefix="more")
    for i in range(30):
        _stream_more.write({"__key__": f"m{i:05d}", "cls": i})
    _stream_more.end_stream()
    os.unlink(_entry(tmp_path, 4))  # 3 and 5 stay
    with pytest.raises(ShardError, match="commit 4 is missing"):
        for _ in range(10):
            next(it)


def test_a_log_after_a_compacted_base_has_no_false_hole(tmp_path):
    """A log that starts after index.arrow's log_seq (its older entries gone) is whole."""
    from shardfeed.formats import compact

    _stream(tmp_path, 3, end=False)
    compact(str(tmp_path))
    for s in (1, 2, 3):
        os.unlink(_entry(tmp_path, s))
    w = ShardWriter(str(tmp_path), append=True, max_shard_samples=10, prefix="late")
    for i in range(10):
        w.write({"__key__": f"l{i}", "cls": i})
    w.end_stream()
    index, view = open_stream_index(str(tmp_path))
    assert index.num_samples == 40 and [s for s, _ in view.shards] == [4] and view.end == 5
    assert read_commits(str(tmp_path)).end == 5


# -- a replaced shard is refused ----------------------------------------------
def test_a_shard_replaced_by_another_valid_shard_of_the_same_size_is_refused(tmp_path):
    _stream(tmp_path, 2, end=True)
    index, _ = open_stream_index(str(tmp_path))
    a, b = index.path(0), index.path(1)
    assert os.path.getsize(a) == os.path.getsize(b) and index.hashes[0] != index.hashes[1]
    for suffix in ("", ".idx"):  # a whole valid shard, with its own sidecar, in shard 0's place
        shutil.copy(b + suffix, a + suffix)
    with pytest.raises(ShardError, match="another version of the shard"):
        open_shard(index, 0)
    with pytest.raises(ShardError, match="another version of the shard"):
        _follow_keys(tmp_path)


# -- nothing lands after the end ----------------------------------------------
def test_a_commit_after_an_end_below_the_top_is_refused_at_the_writer(tmp_path):
    """A log already damaged by a commit past its end must not grow further."""
    _stream(tmp_path, 1, end=True)
    rec = {"name": "stray.tar", "format": "tar", "samples": 1, "bytes": 1, "hash": "0"}
    with open(_entry(tmp_path, 3), "w") as f:
        json.dump(rec, f)
    with pytest.raises(ShardError, match="ended by commit 2"):
        publish(str(tmp_path), ShardInfo("late.tar", "tar", 1, 1, "0"))
    assert not os.path.exists(_entry(tmp_path, 4))


def test_a_writer_with_a_stale_listing_does_not_commit_after_the_end(tmp_path, monkeypatch):
    """The writer's listing predates the end (taken before another writer
    ended the stream): it must still be refused, and followers stay whole."""
    _stream(tmp_path, 2, end=False)
    stale = cl._seqs(os.path.join(str(tmp_path), LOG_DIR))
    assert end_stream(str(tmp_path)) == 3
    monkeypatch.setattr(cl, "_seqs", lambda log: list(stale))
    with pytest.raises(ShardError, match="ended by commit 3"):
        publish(str(tmp_path), ShardInfo("late.tar", "tar", 1, 1, "0"))
    monkeypatch.undo()
    assert sorted(os.listdir(os.path.join(str(tmp_path), LOG_DIR))) == [f"{s:012d}.json" for s in (1, 2, 3)]
    assert len(_follow_keys(tmp_path)) == 20


def test_a_stream_made_again_at_the_same_path_is_a_new_log_even_with_the_old_inode(tmp_path):
    """A folder deleted and made again often gets its old inode back (the clean-clone CI of
    2026-12-03: `shardfeed demo` run twice into one --out): the writer's memo of the ended
    stream must not refuse the new stream's commits."""
    root = tmp_path / "s"
    _stream(root, 1, end=True)
    log = os.path.realpath(os.path.join(root, LOG_DIR))
    ended = cl._Scan._by_log[(log, os.stat(log).st_ino)]
    assert ended.end == 2
    shutil.rmtree(root)
    os.makedirs(os.path.join(root, LOG_DIR))
    cl._Scan._by_log[(log, os.stat(log).st_ino)] = ended  # the inode came back, for certain
    _stream(root, 2, end=False)
    assert [s for s, _ in read_commits(str(root)).shards] == [1, 2]
