"""`shardfeed reshard`: shard size and format change, samples preserved, payloads never decoded."""

from __future__ import annotations

import os

import pytest

from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index, open_shard, verify_shard
from shardfeed.tools.cli import main


def _samples(root) -> list[dict]:
    idx = open_index(str(root))
    out = []
    for i in range(len(idx)):
        with open_shard(idx, i) as r:
            out += [dict(s) for s in r]
    return out


def test_tar_to_parquet_to_tar_round_trip(tmp_path):
    src = str(tmp_path / "src")
    with ShardWriter(src, max_shard_samples=50) as w:
        for i in range(230):
            w.write(labelled_sample(i))
    assert main(["reshard", "-q", src, str(tmp_path / "pq"), "--format", "parquet",
                 "--max-shard-samples", "100", "--processes", "2"]) == 0
    pq = open_index(str(tmp_path / "pq"))
    assert list(pq.counts) == [100, 100, 30] and set(pq.formats) == {"parquet"}
    assert main(["reshard", "-q", str(tmp_path / "pq"), str(tmp_path / "back"), "--max-shard-samples", "50"]) == 0
    back = open_index(str(tmp_path / "back"))
    for i in range(len(back)):
        verify_shard(back, i)
    assert _samples(tmp_path / "back") == _samples(src)  # the same bytes, member for member
    assert [open(os.path.join(src, n), "rb").read() == open(os.path.join(tmp_path / "back", n), "rb").read()
            for n in back.names] == [True] * len(back)


def test_reshard_refuses_non_shard_input(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"v": 1}\n')
    assert main(["reshard", "-q", str(tmp_path / "a.jsonl"), str(tmp_path / "out")]) == 2
    assert "not shards" in capsys.readouterr().err
    assert main(["reshard", "-q", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "missing" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["arrow"])
def test_shard_size_change_keeps_order(tmp_path, fmt):
    src = str(tmp_path / "src")
    with ShardWriter(src, max_shard_samples=7) as w:
        for i in range(40):
            w.write(labelled_sample(i))
    assert main(["reshard", "-q", src, str(tmp_path / "out"), "--format", fmt, "--max-shard-bytes", "2KiB"]) == 0
    got = _samples(tmp_path / "out")
    assert [s["__key__"] for s in got] == [f"{i:08d}" for i in range(40)]
    assert len(open_index(str(tmp_path / "out"))) > 1
