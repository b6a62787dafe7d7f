"""`shardfeed ingest` and `shardfeed compact` on real files, with Loaders
following the live dataset while it grows (ingest runs as a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from shardfeed.formats import open_index
from shardfeed.formats.commit_log import read_commits
from shardfeed.formats.index import INDEX_NAME
from shardfeed.loader import Loader, ShardDataset
from shardfeed.tools import cli


def _jsonl(path, start: int, n: int) -> list[str]:
    with open(path, "w") as f:
        for i in range(start, start + n):
            f.write(json.dumps({"id": f"r{i:05d}", "cls": i % 7, "txt": f"row {i}"}) + "\n")
    return [f"r{i:05d}" for i in range(start, start + n)]


def _ingest_proc(*argv) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardfeed.tools.ingest", *map(str, argv), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _follow_keys(root, world=1, batch_size=8, **kw) -> list[list[str]]:
    """Each rank's delivered keys, ranks stepped together, until the end commit."""
    loaders = [Loader(ShardDataset(str(root), follow=True, rank=r, world_size=world, poll_s=0.02,
                                   idle_timeout_s=60, **kw), batch_size) for r in range(world)]
    its = [iter(L) for L in loaders]
    out = [[] for _ in range(world)]
    while True:
        got = [next(it, None) for it in its]
        if all(g is None for g in got):
            return out
        assert all(g is not None for g in got), "ranks must end at the same step"
        for r, b in enumerate(got):
            out[r] += list(b["__key__"])


def test_ingest_publishes_shards_a_follower_reads_while_it_runs(tmp_path):
    """Two ranks follow DST while `shardfeed ingest` (a separate process) fills
    it 25 samples a shard: every row arrives once, and the first batch comes
    before the ingest ends (shards are published as they fill)."""
    keys = _jsonl(tmp_path / "a.jsonl", 0, 400)
    dst = tmp_path / "live"
    os.makedirs(dst / "_log")
    p = _ingest_proc(tmp_path / "a.jsonl", dst, "--max-shard-samples", 25, "--field", "cls=cls",
                     "--field", "txt=txt", "--key-column", "id", "--end")
    got = _follow_keys(dst, world=2, batch_size=10, shuffle="none")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "ingested 400 samples into 16 published shards" in out and "stream ended by commit 17" in out
    assert sorted(got[0] + got[1]) == keys and len(got[0]) == len(got[1]) == 200
    view = read_commits(str(dst))
    assert [s for s, _ in view.shards] == list(range(1, 17)) and view.end == 17


def test_compact_while_following_and_ingesting(tmp_path):
    """`shardfeed compact` runs over and over while an ingest appends and a
    reader follows: the reader still gets every sample once, in commit order,
    and the final index.arrow holds every shard."""
    keys = _jsonl(tmp_path / "a.jsonl", 0, 300)
    dst = tmp_path / "live"
    os.makedirs(dst / "_log")
    p = _ingest_proc(tmp_path / "a.jsonl", dst, "--max-shard-samples", 10, "--key-column", "id", "--end")
    stop, runs = threading.Event(), []

    def compact_loop():
        while not stop.is_set():
            runs.append(cli.main(["compact", str(dst)]))
            time.sleep(0.01)

    t = threading.Thread(target=compact_loop, name="compact-loop", daemon=True)
    t.start()
    try:
        [got] = _follow_keys(dst, batch_size=7, shuffle="none")
    finally:
        stop.set()
        t.join(30)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert got == keys  # commit order, every sample once, the 6-sample tail included
    assert runs and set(runs) == {0}
    assert cli.main(["compact", str(dst)]) == 0
    idx = open_index(str(dst))
    assert idx.num_samples == 300 and idx.meta["log_seq"] == 30
    assert os.path.exists(dst / INDEX_NAME)


def test_ingest_follow_src_takes_files_as_they_land(tmp_path, capsys):
    """--follow-src: files renamed into SRC later are ingested once each; keys
    of each file keep its name so rows numbered alike in two files stay apart."""
    src, dst = tmp_path / "in", tmp_path / "live"
    src.mkdir()
    _jsonl(src / "a.jsonl", 0, 30)

    def land():
        time.sleep(0.3)
        _jsonl(src / ".b.jsonl.part", 30, 20)
        os.rename(src / ".b.jsonl.part", src / "b.jsonl")

    t = threading.Thread(target=land, name="land-file")
    t.start()
    rc = cli.main(["ingest", str(src), str(dst), "--follow-src", "--poll-s", "0.05", "--idle-exit-s", "1.5",
                   "--max-shard-samples", "16", "--end", "-q"])
    t.join()
    assert rc == 0
    assert "ingested 50 samples" in capsys.readouterr().out
    [got] = _follow_keys(dst, batch_size=5, shuffle="none")
    assert got == [f"a/{i:010d}" for i in range(30)] + [f"b/{i:010d}" for i in range(20)]


def test_two_ingests_append_to_one_dataset(tmp_path):
    """Two ingest processes at once: both sets of rows are published, no commit lost."""
    ka = _jsonl(tmp_path / "a.jsonl", 0, 100)
    kb = _jsonl(tmp_path / "b.jsonl", 1000, 100)
    dst = tmp_path / "live"
    procs = [_ingest_proc(tmp_path / f"{x}.jsonl", dst, "--max-shard-samples", 5, "--key-column", "id",
                          "--prefix", x) for x in "ab"]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    view = read_commits(str(dst))
    assert [s for s, _ in view.shards] == list(range(1, 41))
    assert cli.main(["compact", str(dst)]) == 0
    from shardfeed.formats import open_shard

    idx = open_index(str(dst))
    got = [k for i in range(len(idx)) for k in open_shard(idx, i).table.keys]
    assert sorted(got) == sorted(ka + kb)


@pytest.mark.parametrize("argv, message", [
    (["ingest", "{src}", "{dst_file}"], "holds files but no dataset"),
    (["ingest", "{src}", "{dst}", "--max-shard-samples", "0"], "must be a positive number"),
    (["ingest", "{src}/a.jsonl", "{dst}", "--follow-src"], "is not a folder"),
    (["compact", "{src}"], "has no _log/ commit log"),
])
def test_bad_arguments_name_the_problem(tmp_path, capsys, argv, message):
    src = tmp_path / "in"
    src.mkdir()
    _jsonl(src / "a.jsonl", 0, 3)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("x")
    fill = {"src": str(src), "dst": str(tmp_path / "live"), "dst_file": str(tmp_path / "full")}
    assert cli.main([a.format(**fill) for a in argv]) == 2
    assert message in capsys.readouterr().err
