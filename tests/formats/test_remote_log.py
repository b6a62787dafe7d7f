"""The commit log on S3 (moto's real server on loopback): create-if-absent
commits through S3 conditional put, several writers appending to one prefix,
and a reader following the remote log through the node cache's mirror."""

from __future__ import annotations

import threading

import pytest

from cache_servers import s3_options
from shardfeed.cache import FetchOptions, RemoteDataset, ShardCache
from shardfeed.formats import ShardError, open_shard
from shardfeed.formats.commit_log import read_commits
from shardfeed.formats.index import ShardInfo
from shardfeed.formats.remote_log import RemoteAppender, RemoteLog

FAST = FetchOptions(range_bytes=1 << 16, threads=2, attempts=2, backoff_s=0.01, stall_s=10.0)


@pytest.fixture(scope="module")
def s3(moto_endpoint):
    """The shared moto server (conftest.py) with the bucket these tests write to."""
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="live")
    return moto_endpoint


def _info(name: str) -> ShardInfo:
    return ShardInfo(name, "tar", 1, 1024, "0" * 32)


def test_a_second_commit_to_the_same_seq_is_refused(s3):
    log = RemoteLog("s3://live/refuse", s3_options(s3))
    assert log.try_commit(1, dict(_info("a.tar").__dict__))
    assert not log.try_commit(1, dict(_info("b.tar").__dict__))  # 412 from the conditional put
    assert log.read_entry(1)["name"] == "a.tar"  # the first commit stands
    assert log.publish(_info("c.tar")) == 2  # a writer walks past the taken number
    assert log.end_stream() == 3
    with pytest.raises(ShardError, match="ended by commit 3"):
        log.publish(_info("d.tar"))
    view = log.read_commits()
    assert [(s, i.name) for s, i in view.shards] == [(1, "a.tar"), (2, "c.tar")] and view.end == 3


def test_three_concurrent_writers_lose_no_commit(s3):
    """Three writer threads, each with its own S3 client, commit 12 entries
    each at once: 36 distinct sequence numbers 1..36, no hole, every entry
    the one its writer committed."""
    url, per = "s3://live/three", 12
    results: dict[int, list] = {}
    errors: list = []
    barrier = threading.Barrier(3)

    def writer(w: int):
        # a writer per host: its own filesystem instance, not fsspec's shared one
        log = RemoteLog(url, dict(s3_options(s3), skip_instance_cache=True))
        barrier.wait()
        try:
            results[w] = [(log.publish(_info(f"w{w}-{i:03d}.tar")), f"w{w}-{i:03d}.tar") for i in range(per)]
        except Exception as e:  # noqa: BLE001 - shown by the assert below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,), name=f"writer-{w}") for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    committed = sorted(x for r in results.values() for x in r)
    assert [s for s, _ in committed] == list(range(1, 3 * per + 1))
    view = RemoteLog(url, s3_options(s3)).read_commits()
    assert [(s, i.name) for s, i in view.shards] == committed
    for w in range(3):  # each writer's own commits keep its order
        assert [n for _, n in results[w]] == [f"w{w}-{i:03d}.tar" for i in range(per)]


def test_appenders_on_s3_and_a_reader_through_the_cache(s3, tmp_path):
    """Two RemoteAppenders append shards to one S3 prefix; a reader mirrors
    the log through its ShardCache, sees new commits after each refresh and
    reads every sample back, checked against its hash."""
    url, opts = "s3://live/appended", s3_options(s3)
    # cache/sources.py lists with fsspec's listings cache, which would hide new
    # commits from refresh(); a follower of a remote log turns it off
    cache = ShardCache(str(tmp_path / "cache"), 1 << 22, storage_options=dict(opts, use_listings_cache=False),
                       fetch=FAST)
    a = RemoteAppender(url, opts, stage_dir=str(tmp_path), prefix="a", max_shard_samples=4)
    b = RemoteAppender(url, opts, stage_dir=str(tmp_path), prefix="b", max_shard_samples=4)
    for i in range(8):
        a.write({"__key__": f"a{i:03d}", "cls": i})
    ds = RemoteDataset(url, cache)
    assert ds.index.num_samples == 8
    for i in range(6):
        b.write({"__key__": f"b{i:03d}", "cls": i})
    b.close()  # publishes b's half-full second shard
    a.end_stream()
    assert ds.refresh().num_samples == 14
    assert read_commits(ds.folder).end == 5  # the end commit is mirrored too
    keys = []
    for i in range(len(ds.index)):
        with ds.hold(i) as path, open_shard(ds.index, i, path) as reader:
            keys += [reader.read(j)["__key__"] for j in range(len(reader))]
    assert sorted(keys) == [f"a{i:03d}" for i in range(8)] + [f"b{i:03d}" for i in range(6)]
    with pytest.raises(ShardError, match="ended"):
        with RemoteAppender(url, opts, stage_dir=str(tmp_path), max_shard_samples=4) as late:
            late.write({"__key__": "late", "cls": 0})


def test_a_store_without_conditional_put_is_refused():
    with pytest.raises(ShardError, match="no atomic create-if-absent"):
        RemoteLog("https://example.invalid/ds")


def test_a_writer_with_a_stale_listing_does_not_commit_after_the_end(s3, monkeypatch):
    log = RemoteLog("s3://live/stale", s3_options(s3))
    assert log.publish(_info("a.tar")) == 1
    stale = log.seqs()
    assert RemoteLog("s3://live/stale", s3_options(s3)).end_stream() == 2
    monkeypatch.setattr(log, "seqs", lambda: list(stale))
    with pytest.raises(ShardError, match="ended by commit 2"):
        log.publish(_info("b.tar"))
    monkeypatch.undo()
    view = log.read_commits()
    assert [i.name for _, i in view.shards] == ["a.tar"] and view.end == 2 and log.seqs() == [1, 2]


def test_a_lost_response_to_a_conditional_put_commits_once(s3, monkeypatch):
    """The put lands but its response is lost; the retry gets 412 (what
    s3fs's own retry of a conditional put sees). The entry at that seq is the
    writer's own: it must not commit the shard again at seq + 1."""
    log = RemoteLog("s3://live/lost", s3_options(s3))
    assert log.publish(_info("a.tar")) == 1
    real = log.fs.pipe_file
    calls = []

    def put_then_lose_response(path, value, **kw):
        calls.append(path)
        if len(calls) == 1:
            real(path, value, **kw)
            raise ConnectionResetError("connection reset after the request was sent")
        return real(path, value, **kw)

    monkeypatch.setattr(log.fs, "pipe_file", put_then_lose_response)
    assert log.publish(_info("b.tar")) == 2
    monkeypatch.undo()
    view = log.read_commits()
    assert [(s, i.name) for s, i in view.shards] == [(1, "a.tar"), (2, "b.tar")] and view.end is None


def test_a_412_at_seq_for_our_own_entry_is_ours(s3, monkeypatch):
    log = RemoteLog("s3://live/own412", s3_options(s3))
    real = log.fs.pipe_file

    def put_then_412(path, value, **kw):
        real(path, value, **kw)
        raise FileExistsError(path)  # s3fs retried the put that landed

    monkeypatch.setattr(log.fs, "pipe_file", put_then_412)
    assert log.publish(_info("a.tar")) == 1
    monkeypatch.undo()
    assert log.seqs() == [1]


def _samples(prefix: str, n: int) -> list[dict]:
    return [{"__key__": f"{prefix}{i:03d}", "cls": i, "txt": f"{prefix} {i}"} for i in range(n)]


def test_a_shard_under_a_committed_name_is_refused_and_its_objects_kept(s3, tmp_path):
    """A second appender that comes to a name already committed (here: the
    same tag, as two hosts with one clock and pid could) is refused before it
    uploads anything: the committed shard and sidecar keep their bytes, the
    log keeps one commit of the name."""
    url, opts = "s3://live/dupname", s3_options(s3)
    with RemoteAppender(url, opts, stage_dir=str(tmp_path), max_shard_samples=2) as a:
        for s in _samples("a", 2):
            a.write(s)
    name = a.published[0][1].name
    log = RemoteLog(url, opts)
    before = {suffix: log.fs.cat_file(f"{log.path}/{name}{suffix}") for suffix in ("", ".idx")}
    b = RemoteAppender(url, opts, stage_dir=str(tmp_path), max_shard_samples=2)
    b.writer.prefix, b.writer._tag = a.writer.prefix, a.writer._tag
    b.write(_samples("b", 1)[0])
    with pytest.raises(ShardError, match=rf"{url}/{name}.*already committed \(commit 1\)"):
        b.close()
    assert {suffix: log.fs.cat_file(f"{log.path}/{name}{suffix}") for suffix in before} == before
    assert [(s, i.name) for s, i in log.read_commits().shards] == [(1, name)]
    with pytest.raises(ShardError, match="already committed"):  # the log itself refuses it too
        log.publish(_info(name))


def test_a_writer_walking_up_past_its_own_name_is_refused(s3, monkeypatch):
    """A writer whose listing predates another's commit of the same name
    meets that entry at the seq it tries, and stops: no second commit."""
    url = "s3://live/dupwalk"
    slow = RemoteLog(url, dict(s3_options(s3), skip_instance_cache=True))
    assert slow.publish(_info("a.tar")) == 1
    stale = slow.seqs()
    assert RemoteLog(url, s3_options(s3)).publish(_info("x.tar")) == 2
    monkeypatch.setattr(slow, "seqs", lambda: list(stale))
    other = ShardInfo("x.tar", "tar", 1, 1024, "1" * 32)  # another shard: the same record would be its own commit
    with pytest.raises(ShardError, match=r"dupwalk/x.tar.*already committed \(commit 2\)"):
        slow.publish(other)
    monkeypatch.undo()
    assert slow.seqs() == [1, 2]


def test_an_uncommitted_object_under_the_name_is_not_written_over(s3, tmp_path):
    """The check before the upload cannot see a shard another writer has
    uploaded but not committed yet: the conditional put refuses to replace it."""
    url, opts = "s3://live/foreign", s3_options(s3)
    w = RemoteAppender(url, opts, stage_dir=str(tmp_path), max_shard_samples=1)
    name = f"{w.writer.prefix}-{w.writer._tag}000000.tar"
    w.log.fs.pipe_file(f"{w.log.path}/{name}", b"another writer's shard")
    with pytest.raises(ShardError, match=rf"{url}/{name}: another object is already stored"):
        w.write(_samples("a", 1)[0])
    w.abort()
    assert w.log.fs.cat_file(f"{w.log.path}/{name}") == b"another writer's shard"
    assert w.log.seqs() == []


def test_a_lost_upload_response_is_not_a_foreign_object(s3, tmp_path, monkeypatch):
    """The shard's put lands and its response is lost; s3fs's retry meets
    412. The object holds our bytes: the shard is committed, once."""
    url, opts = "s3://live/lostupload", s3_options(s3)
    w = RemoteAppender(url, opts, stage_dir=str(tmp_path), max_shard_samples=2)
    real = w.log.fs.put_file

    def put_then_412(lpath, rpath, **kw):
        real(lpath, rpath, **kw)
        raise FileExistsError(rpath)

    monkeypatch.setattr(w.log.fs, "put_file", put_then_412)
    for s in _samples("a", 4):
        w.write(s)
    w.close()
    monkeypatch.undo()
    assert [i.samples for _, i in w.log.read_commits().shards] == [2, 2]


def test_appended_commits_record_the_sample_fields(s3, tmp_path):
    """As local append does, each commit lists the fields written so far: the
    mirrored index has them (train and inspect need cls; compact keeps them)."""
    url, opts = "s3://live/fields", s3_options(s3)
    with RemoteAppender(url, opts, stage_dir=str(tmp_path), max_shard_samples=2) as w:
        for s in _samples("a", 3):
            w.write(s)
        w.write({"__key__": "b000", "cls": 1, "json": {"x": 1}})
    assert RemoteLog(url, opts).read_commits().fields == ("cls", "txt", "json")
    cache = ShardCache(str(tmp_path / "cache"), 1 << 22, storage_options=dict(opts, use_listings_cache=False),
                       fetch=FAST)
    ds = RemoteDataset(url, cache)
    assert list(ds.index.fields) == ["cls", "txt", "json"] and ds.index.num_samples == 4
