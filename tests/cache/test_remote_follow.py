"""follow=True on remote datasets through the node cache: a growing folder
written by the local appender and served by the loopback HTTP range server,
and a prefix on moto's S3 server written by RemoteAppender. Every committed
sample is delivered once, the end commit ends iteration, and a reader killed
mid-stream resumes from its last state without a loss or a repeat."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest

from cache_servers import Fault, RangeServer, s3_options
from loader_helpers import step_together
from shardfeed.formats import ShardError, ShardWriter
from shardfeed.formats.commit_log import LOG_DIR
from shardfeed.formats.remote_log import RemoteAppender
from shardfeed.loader import Loader, ShardDataset

FAST = dict(poll_s=0.02, idle_timeout_s=30)


def _write_local(root: str, n: int, per: int = 5, prefix: str = "w", end: bool = True, pause: float = 0.01):
    w = ShardWriter(root, append=True, max_shard_samples=per, prefix=prefix)
    for i in range(n):
        w.write({"__key__": f"{prefix}-{i:05d}", "cls": i})
        if (i + 1) % per == 0:
            time.sleep(pause)
    if end:
        w.end_stream()
    else:
        w.close()


def _live(folder: str) -> str:
    os.makedirs(os.path.join(folder, LOG_DIR), exist_ok=True)
    return folder


def _keys(n: int, prefix: str = "w") -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(n)]


# A reader process: follows URL with batch 6, prints each batch's keys with the state after it, one JSON line.
READER = textwrap.dedent("""
    import json, sys
    from shardfeed.loader import Loader, ShardDataset
    url, cache = sys.argv[1], sys.argv[2]
    ds = ShardDataset(url, follow=True, cache_dir=cache, seed=3, poll_s=0.02, idle_timeout_s=60)
    L = Loader(ds, 6)
    for b in L:
        print(json.dumps({"keys": list(b["__key__"]), "state": L.state_dict()}), flush=True)
""")


def test_http_follow_killed_reader_resumes_exactly_once(tmp_path):
    """A reader process follows a growing folder over HTTP while the local appender
    writes it (more commits come after its first batches, and after it dies); it is
    SIGKILLed mid-stream, and a fresh dataset on the same cache resumes from its
    last printed state while the writer goes on: 83 committed samples, each once."""
    root = _live(str(tmp_path / "srv" / "ds"))
    cache = str(tmp_path / "cache")
    read_some, killed = threading.Event(), threading.Event()

    def write():
        w = ShardWriter(root, append=True, max_shard_samples=5, prefix="w")
        for i in range(83):
            if i == 20:
                read_some.wait(120)  # the reader has polled and read: the rest it must find by polling
            if i == 50:
                killed.wait(120)
            w.write({"__key__": f"w-{i:05d}", "cls": i})
            if i % 5 == 4 and i > 20:
                time.sleep(0.02)
        w.end_stream()

    with RangeServer(str(tmp_path / "srv")) as srv:
        writer = threading.Thread(target=write)
        writer.start()
        child = subprocess.Popen([sys.executable, "-c", READER, f"{srv.url}/ds", cache], stdout=subprocess.PIPE,
                                 text=True)
        lines = []
        try:
            for line in child.stdout:
                lines.append(json.loads(line))
                if len(lines) == 2:
                    read_some.set()
                if len(lines) == 6:
                    break
            child.send_signal(signal.SIGKILL)
        finally:
            child.wait(30)
            read_some.set()
            killed.set()
        assert len(lines) == 6, "the reader stopped before it was killed"
        state = lines[-1]["state"]
        assert state["feed"]["watermark"]["samples"] == 36  # past the first 20: read from polled commits
        ds = ShardDataset(f"{srv.url}/ds", follow=True, cache_dir=cache, seed=3, **FAST)
        with Loader(ds, 6, num_workers=2) as L:
            L.load_state_dict(state)
            rest = [k for b in L for k in b["__key__"]]
        writer.join(60)
        served = srv.bytes_sent(".tar")
    before = [k for ln in lines for k in ln["keys"]]
    assert sorted(before + rest) == _keys(83)  # every committed sample once, none twice
    shards = sum(os.path.getsize(os.path.join(root, n)) for n in os.listdir(root) if n.endswith(".tar"))
    assert served >= shards  # every shard came from the server (through the cache), none read in place


def test_remote_follow_delivers_what_local_follow_does(tmp_path):
    """The same ended stream followed in place and over HTTP (with replay and a window):
    the same batches, in the same order (the dealing is the local follow's)."""
    root = _live(str(tmp_path / "srv" / "ds"))
    _write_local(root, 47, per=4, pause=0)
    kw = dict(follow=True, seed=5, replay=0.25, window=3, **FAST)
    with RangeServer(str(tmp_path / "srv")) as srv:
        local = [list(b["__key__"]) for b in Loader(ShardDataset(root, **kw), 8)]
        remote = [list(b["__key__"]) for b in Loader(ShardDataset(f"{srv.url}/ds", cache_dir=str(tmp_path / "c"),
                                                                  **kw), 8)]
    assert remote == local and len(local) > 5


def test_http_follow_rides_out_server_errors_and_counts_polls(tmp_path):
    """503s, 500s and resets on the log and the shards while following: retried or
    polled again, never a lost or repeated sample. While nothing is committed a poll
    costs one request (the next entry), and no entry is fetched twice."""
    root = _live(str(tmp_path / "srv" / "ds"))
    with RangeServer(str(tmp_path / "srv")) as srv:
        # 7 503s in a row outlast one fetch's retries (5): that poll reports no news, the next goes on
        srv.faults += [Fault(".json", "503", times=7, skip=2), Fault(".json", "500", times=2, skip=6),
                       Fault(".tar", "reset", times=2), Fault(".tar", "503", times=2, skip=3)]
        writer = threading.Thread(target=_write_local, args=(root, 40), kwargs={"per": 4, "pause": 0.05})
        writer.start()
        ds = ShardDataset(f"{srv.url}/ds", follow=True, cache_dir=str(tmp_path / "c"), **FAST)
        with Loader(ds, 5, num_workers=2) as L:
            got = [k for b in L for k in b["__key__"]]
        writer.join(60)
        assert sorted(got) == _keys(40) and len(got) == 40
        assert all(f.times == 0 for f in srv.faults), "a fault was never hit"
        # idle: a follower of a stream with no new commit asks for the next entry only
        _write_local(str(tmp_path / "srv" / "idle"), 6, per=3, end=False)
        ds = ShardDataset(f"{srv.url}/idle", follow=True, cache_dir=str(tmp_path / "c"), poll_s=0.05,
                          idle_timeout_s=1.0)
        L = Loader(ds, 4)
        it = iter(L)
        next(it)
        before = dict(srv.requests)
        t0 = time.monotonic()
        with pytest.raises(ShardError, match="no commit arrived for"):
            next(it)
        waited = time.monotonic() - t0
        asked = Counter({p: n - before.get(p, 0) for p, n in srv.requests.items() if n > before.get(p, 0)})
        assert set(asked) == {"idle/_log/000000000003.json"}, asked  # one object, never the log again
        assert 1.0 <= waited < 3.0 and asked["idle/_log/000000000003.json"] <= waited / 0.05 + 2
        L.close()


def test_http_follow_before_the_dataset_exists_and_a_hole(tmp_path):
    """A follower started before its writer waits for the dataset (idle timeout
    semantics of a local folder); a hole in the served log is damage, named."""
    srv_root = tmp_path / "srv"
    srv_root.mkdir()
    with RangeServer(str(srv_root)) as srv:
        ds = ShardDataset(f"{srv.url}/late", follow=True, cache_dir=str(tmp_path / "c"), **FAST)
        assert ds.index.num_samples == 0
        writer = threading.Timer(0.5, _write_local, args=(str(srv_root / "late"), 12))
        writer.start()
        with Loader(ds, 5) as L:
            got = [k for b in L for k in b["__key__"]]
        writer.join()
        assert sorted(got) == _keys(12)
        with pytest.raises(ShardError, match="no dataset appeared here"):
            L = Loader(ShardDataset(f"{srv.url}/never", follow=True, cache_dir=str(tmp_path / "c"), poll_s=0.05,
                                    idle_timeout_s=0.3), 4)
            next(iter(L))
        _write_local(str(srv_root / "holed"), 12, per=3)
        os.unlink(srv_root / "holed" / LOG_DIR / "000000000002.json")
        with pytest.raises(ShardError, match="commit 2 is missing"):
            ShardDataset(f"{srv.url}/holed", follow=True, cache_dir=str(tmp_path / "c"), **FAST)


def test_follow_refuses_what_it_cannot_do(tmp_path):
    root = _live(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match="only a URL is followed through it"):
        ShardDataset(root, follow=True, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="locality=True is not available with follow=True"):
        ShardDataset("http://127.0.0.1:9/ds", follow=True, cache_dir=str(tmp_path / "c"), locality=True)


# -- S3 ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3(moto_endpoint):
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="follow")
    return moto_endpoint


def _append_s3(url: str, opts: dict, stage: str, n: int, prefix: str, per: int = 4, end: bool = False,
               pause: float = 0.0):
    with RemoteAppender(url, opts, stage_dir=stage, prefix=prefix, max_shard_samples=per) as w:
        for i in range(n):
            w.write({"__key__": f"{prefix}-{i:05d}", "cls": i})
            if (i + 1) % per == 0:
                time.sleep(pause)
        if end:
            w.end_stream()


def test_s3_follow_two_ranks_resume_mid_stream_exactly_once(s3, tmp_path):
    """Two RemoteAppenders write one S3 prefix while two ranks follow it through
    one node cache; the ranks stop mid-stream, fresh datasets resume from their
    states (a later writer ends the stream): every committed sample once."""
    url, opts = "s3://follow/two", s3_options(s3)
    cache = str(tmp_path / "cache")
    a = threading.Thread(target=_append_s3, args=(url, opts, str(tmp_path), 18, "a"), kwargs={"pause": 0.05})
    b = threading.Thread(target=_append_s3, args=(url, opts, str(tmp_path), 14, "b"), kwargs={"pause": 0.05})
    a.start()
    b.start()

    def loaders():
        return [Loader(ShardDataset(url, follow=True, rank=r, world_size=2, cache_dir=cache, storage_options=opts,
                                    seed=2, **FAST), 3) for r in range(2)]

    first = loaders()  # may start before the first commit: it waits for the dataset
    got, _ = step_together(first, steps=3)
    states = [L.state_dict() for L in first]
    for L in first:
        L.close()
    a.join(60)
    b.join(60)
    _append_s3(url, opts, str(tmp_path), 7, "c", end=True)
    second = loaders()
    for L, s in zip(second, states):
        L.load_state_dict(s)
    rest, taken = step_together(second)
    for L in second:
        L.close()
    assert states[0]["feed"]["watermark"]["samples"] == 18
    assert len(set(taken)) == 1  # the end ends both ranks at the same step
    delivered = Counter(k for ks in got + rest for k in ks)
    want = _keys(18, "a") + _keys(14, "b") + _keys(7, "c")
    assert sorted(delivered) == sorted(want)
    assert sum(delivered.values()) - len(want) <= 1  # only the tail's padding (39 samples, 2 ranks) repeats


def test_s3_follow_a_rewritten_prefix_is_another_stream(s3, tmp_path):
    """The mirror of an old stream at the same prefix is not served: a new
    follower reads only the new stream and refuses the old stream's state."""
    import s3fs

    url, opts = "s3://follow/rewritten", s3_options(s3)
    cache = str(tmp_path / "cache")
    _append_s3(url, opts, str(tmp_path), 12, "old", end=True)
    L = Loader(ShardDataset(url, follow=True, cache_dir=cache, storage_options=opts, **FAST), 4)
    it = iter(L)
    next(it)
    state = L.state_dict()
    L.close()
    s3fs.S3FileSystem(**opts).rm("follow/rewritten", recursive=True)
    _append_s3(url, opts, str(tmp_path), 5, "new", end=True)
    ds = ShardDataset(url, follow=True, cache_dir=cache, storage_options=opts, **FAST)
    assert sorted(k for b in Loader(ds, 4) for k in b["__key__"]) == _keys(5, "new")
    with pytest.raises(ValueError, match="state belongs to stream"):
        Loader(ShardDataset(url, follow=True, cache_dir=cache, storage_options=opts, **FAST), 4).load_state_dict(state)
