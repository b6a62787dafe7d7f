"""`convert --processes N` and `--part I/N` write the shards 1 process writes, under a byte limit too:
the parts start at a 1-process run's shard boundaries, planned by measuring the samples first."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.writer import approx_sample_bytes
from shardfeed.tools.cli import main
from shardfeed.tools.convert.part_bounds import parts_at, shard_ends


def _files(root) -> dict[str, bytes]:
    return {n: open(os.path.join(root, n), "rb").read() for n in sorted(os.listdir(root))}


@pytest.fixture
def jsonl(tmp_path):
    """Rows of uneven sizes (text of 0..3000 bytes), so a byte limit cuts shards of uneven counts."""
    rng = np.random.default_rng(5)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"i": i, "c": i % 7, "t": "x" * int(rng.integers(0, 3000))}) + "\n"
                            for i in range(400)))
    return path


def _convert(src, dst, *opts) -> int:
    return main(["convert", "-q", str(src), str(dst), "--field", "c=cls", "--field", "t=txt", *map(str, opts)])


@pytest.mark.parametrize("fmt,extra", [("tar", ["--shuffle-seed", 3]), ("parquet", [])])
def test_three_processes_write_the_shards_of_one(tmp_path, jsonl, fmt, extra):
    opts = ["--format", fmt, "--max-shard-bytes", "40KiB", *extra]
    assert _convert(jsonl, tmp_path / "one", *opts) == 0
    assert _convert(jsonl, tmp_path / "three", "--processes", 3, *opts) == 0
    one = open_index(str(tmp_path / "one"))
    assert len(one) > 6 and len(set(one.counts.tolist())) > 2  # uneven shards: the cut is not by count
    assert _files(tmp_path / "three") == _files(tmp_path / "one")


def test_parts_merged_equal_one_process_under_a_byte_limit(tmp_path, jsonl):
    opts = ["--max-shard-bytes", "30KiB", "--max-shard-samples", 25]
    for i in range(3):
        assert _convert(jsonl, tmp_path / f"p{i}", "--part", f"{i}/3", *opts) == 0
    assert main(["convert", "-q", "--merge", str(tmp_path / "merged"), *(str(tmp_path / f"p{i}") for i in range(3))]) == 0
    assert _convert(jsonl, tmp_path / "one", *opts) == 0
    assert _files(tmp_path / "merged") == _files(tmp_path / "one")


@pytest.mark.parametrize("fmt", ["tar", "parquet", "arrow"])
def test_planned_boundaries_are_the_writers(tmp_path, fmt):
    """shard_ends over approx_sample_bytes gives the counts ShardWriter cuts,
    with long keys (PAX headers), int, text, bytes and JSON fields."""
    rng = np.random.default_rng(1)
    samples = [{"__key__": ("k" * int(rng.integers(1, 300))) + f"{i:05d}", "cls": i % 3,
                "txt": "é" * int(rng.integers(0, 700)), "bin": bytes(int(rng.integers(0, 2000))),
                "json": {"i": i}} for i in range(300)]
    with ShardWriter(str(tmp_path / fmt), format=fmt, max_shard_bytes=9000, max_shard_samples=17) as w:
        for s in samples:
            w.write(dict(s))
    sizes = np.asarray([approx_sample_bytes(fmt, s) for s in samples])
    ends = shard_ends(sizes, 9000, 17)
    assert np.diff(np.concatenate([[0], ends])).tolist() == [s.samples for s in w.shards]
    assert len(set(np.diff(ends).tolist())) > 2


def test_parts_are_cut_at_boundaries_near_equal_counts():
    ends = np.asarray([10, 35, 40, 70, 100])
    assert parts_at(ends, 3) == [(0, 35), (35, 70), (70, 100)]
    assert parts_at(ends, 9) == [(0, 10), (10, 40), (40, 70), (70, 100)]  # never an empty part
    assert parts_at(np.asarray([5]), 3) == [(0, 5)]
