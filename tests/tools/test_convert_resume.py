"""A conversion killed outright (SIGKILL) continues on rerun: same bytes, finished shards kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from shardfeed.tools.cli import main

SHARDFEED = os.path.join(os.path.dirname(sys.executable), "shardfeed")


def _files(root) -> dict[str, bytes]:
    return {name: open(os.path.join(root, name), "rb").read() for name in sorted(os.listdir(root))}


def _stage(parent) -> str:
    stages = [n for n in os.listdir(parent) if ".convert-" in n]
    assert len(stages) == 1, stages
    return os.path.join(parent, stages[0])


def _recorded(stage) -> dict[str, int]:
    """part-local shard path -> inode, for every shard the manifests record."""
    out = {}
    for part in sorted(n for n in os.listdir(stage) if n.startswith("part-")):
        path = os.path.join(stage, part, "done.jsonl")
        if not os.path.exists(path):
            continue
        for line in open(path).read().splitlines():
            rec = json.loads(line)
            if "name" in rec:
                out[f"{part}/{rec['name']}"] = os.stat(os.path.join(stage, part, rec["name"])).st_ino
    return out


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--shuffle-seed", "3"]], ids=["shuffled"])
def test_sigkill_then_rerun_is_byte_identical_and_keeps_finished_shards(tmp_path, extra):
    rows = "".join(json.dumps({"i": i, "t": "x" * 200}) + "\n" for i in range(20_000))
    src = tmp_path / "in.jsonl"
    src.write_text(rows)
    work = tmp_path / "work"
    work.mkdir()
    args = [str(src), str(work / "out"), "--max-shard-samples", "400", *extra]
    proc = subprocess.Popen([SHARDFEED, "convert", "-q", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()  # finished before the kill: make the input bigger
        assert time.monotonic() < deadline
        stages = [n for n in os.listdir(work) if ".convert-" in n]
        if stages and len(_recorded(os.path.join(work, stages[0]))) >= 3:
            break
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert not (work / "out").exists()
    stage = _stage(work)
    before = _recorded(stage)
    assert main(["convert", "-q", *args]) == 0
    # an uninterrupted run, somewhere else
    assert main(["convert", "-q", str(src), str(tmp_path / "ref"), "--max-shard-samples", "400", *extra]) == 0
    assert _files(work / "out") == _files(tmp_path / "ref")
    assert os.listdir(work) == ["out"]  # the stage became the dataset
    # each shard recorded before the kill is the very file published (same inode): never rewritten
    from shardfeed.formats import open_index

    idx = open_index(str(work / "out"))
    inodes = {os.stat(idx.path(i)).st_ino for i in range(len(idx))}
    assert set(before.values()) <= inodes
    assert len(before) >= 3


def test_rerun_with_other_arguments_starts_afresh(tmp_path):
    """A killed run's stage is for its own arguments: another conversion into DST removes it."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(50)))
    from shardfeed.formats.staging import stage_path

    old = stage_path(str(tmp_path / "out"), "0123456789abcdef")
    os.makedirs(os.path.join(old, "part-000"))
    assert main(["convert", "-q", str(src), str(tmp_path / "out")]) == 0
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out"]


def test_live_run_with_same_arguments_is_refused(tmp_path):
    """Two runs with the same arguments would write into one stage: the second is refused."""
    from shardfeed.formats import ShardError
    from shardfeed.formats.staging import stage_path
    from shardfeed.tools.convert.job import ConvertOptions, convert, run_key
    from shardfeed.tools.convert.resume import StageLock
    from shardfeed.tools.convert.source_kinds import open_source

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(50)))
    source, opts, dst = open_source(str(src)), ConvertOptions(), str(tmp_path / "out")
    lock = StageLock(stage_path(dst, run_key(source, opts)))  # a live run holds it
    try:
        with pytest.raises(ShardError, match="another conversion with the same arguments"):
            convert(source, dst, opts)
    finally:
        lock.release()
    assert convert(source, dst, opts).samples == 50


def test_cut_manifest_line_is_dropped(tmp_path):
    from shardfeed.tools.convert.resume import append_manifest, read_manifest

    (tmp_path / "shard-000000.tar").write_bytes(b"x")
    append_manifest(str(tmp_path), {"name": "shard-000000.tar", "format": "tar", "samples": 1, "bytes": 1,
                                    "hash": "h", "fields": ["json"]})
    with open(tmp_path / "done.jsonl", "a") as f:
        f.write('{"name": "shard-0000')  # the kill came mid-line
    shards, fields, done = read_manifest(str(tmp_path))
    assert [s.name for s in shards] == ["shard-000000.tar"] and fields == ["json"] and not done
    append_manifest(str(tmp_path), {"done": True})
    assert read_manifest(str(tmp_path))[2]
