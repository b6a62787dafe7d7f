"""`convert --part I/N` + `--merge`, and the write-time shuffle (keyed permutation, bucket passes)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index, open_shard
from shardfeed.tools.cli import main


def _files(root) -> dict[str, bytes]:
    return {n: open(os.path.join(root, n), "rb").read() for n in sorted(os.listdir(root))}


def _samples(root) -> list[dict]:
    idx = open_index(str(root))
    out = []
    for i in range(len(idx)):
        with open_shard(idx, i) as r:
            out += [dict(s) for s in r]
    return out


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"i": i, "c": i // 50}) + "\n" for i in range(503)))
    return path


@pytest.mark.parametrize("seed", [7])
def test_parts_merged_equal_processes_run_and_one_run(tmp_path, jsonl, seed):
    opts = ["--max-shard-samples", "40"] + (["--shuffle-seed", str(seed)] if seed is not None else [])
    for i in range(2):
        assert main(["convert", "-q", str(jsonl), str(tmp_path / f"p{i}"), "--part", f"{i}/2", *opts]) == 0
        assert not (tmp_path / f"p{i}" / "index.arrow").exists()  # a part is not a dataset
    # given in any order
    assert main(["convert", "-q", "--merge", str(tmp_path / "merged"), *(str(tmp_path / f"p{i}") for i in (1, 0))]) == 0
    assert main(["convert", "-q", str(jsonl), str(tmp_path / "procs"), "--processes", "2", *opts]) == 0
    assert main(["convert", "-q", str(jsonl), str(tmp_path / "one"), *opts]) == 0
    assert _files(tmp_path / "merged") == _files(tmp_path / "procs")
    assert _samples(tmp_path / "merged") == _samples(tmp_path / "one")
    assert open_index(str(tmp_path / "merged")).meta["convert"]["shuffle_seed"] == seed


def test_merge_refuses_missing_duplicate_and_foreign_parts(tmp_path, jsonl, capsys):
    for i in range(2):
        assert main(["convert", "-q", str(jsonl), str(tmp_path / f"p{i}"), "--part", f"{i}/2"]) == 0
    assert main(["convert", "-q", str(jsonl), str(tmp_path / "other"), "--part", "1/2", "--shuffle-seed", "1"]) == 0
    assert main(["convert", "-q", "--merge", str(tmp_path / "m"), str(tmp_path / "p0")]) == 2
    assert "parts [1] of 2 are missing" in capsys.readouterr().err
    assert main(["convert", "-q", "--merge", str(tmp_path / "m"), str(tmp_path / "p0"), str(tmp_path / "p0")]) == 2
    assert "given twice" in capsys.readouterr().err
    assert main(["convert", "-q", "--merge", str(tmp_path / "m"), str(tmp_path / "p0"), str(tmp_path / "other")]) == 2
    assert "different conversions" in capsys.readouterr().err
    assert main(["convert", "-q", "--merge", str(tmp_path / "m"), str(jsonl)]) == 2
    assert "not a convert part" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    assert main(["convert", "-q", str(jsonl), str(tmp_path / "x"), "--part", "2/2"]) == 2
    assert "--part '2/2'" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_shuffled_output_is_a_permutation_and_buckets_equal_permute(tmp_path, fmt):
    """Class-ordered input; the bucket passes (tiny buckets) give the very dataset the permutation gives."""
    src = str(tmp_path / "src")
    with ShardWriter(src, max_shard_samples=100, compression="zstd") as w:  # compressed: read front to back
        for i in range(1000):
            w.write(dict(labelled_sample(i), cls=i // 100))
    base = ["--max-shard-samples", "128", "--format", fmt, "--shuffle-seed", "5"]
    assert main(["convert", "-q", src, str(tmp_path / "perm"), *base, "--shuffle-mode", "permute"]) == 0
    from shardfeed.tools.convert.job import ConvertOptions, convert
    from shardfeed.tools.convert.order import BucketShuffle
    from shardfeed.tools.convert.source_kinds import open_source

    opts = ConvertOptions(format=fmt, max_shard_samples=128, shuffle_seed=5, shuffle_mode="buckets",
                          bucket_samples=97)
    convert(open_source(src), str(tmp_path / "buckets"), opts)
    assert _files(tmp_path / "buckets") == _files(tmp_path / "perm")
    assert main(["convert", "-q", src, str(tmp_path / "auto"), *base]) == 0  # auto: buckets for .tar.zst
    assert _files(tmp_path / "auto") == _files(tmp_path / "perm")
    got = _samples(tmp_path / "perm")
    keys = [s["__key__"] for s in got]
    assert sorted(keys) == [f"{i:08d}" for i in range(1000)] and keys != sorted(keys)
    by_key = {s["__key__"]: s for s in _samples(src)}
    for s in got:
        want = by_key[s["__key__"]]
        assert s["bin"] == want["bin"] and int(s["cls"]) == int(want["cls"])
    # the first shard is no longer one class
    assert len({int(s["cls"]) for s in got[:128]}) == 10
    assert BucketShuffle(str(tmp_path / "b"), 10, 1, 4).buckets == 3


def test_shuffle_order_changes_with_seed_and_is_stable(tmp_path, jsonl):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert main(["convert", "-q", str(jsonl), str(tmp_path / name), "--shuffle-seed", str(seed)]) == 0
    keys = {n: [s["__key__"] for s in _samples(tmp_path / n)] for n in "abc"}
    assert keys["a"] == keys["b"] != keys["c"]
    assert sorted(keys["a"]) == sorted(keys["c"])


def test_inspect_warns_on_class_ordered_shards_until_write_shuffled(tmp_path, capsys):
    src = str(tmp_path / "src")
    with ShardWriter(src, max_shard_samples=100) as w:
        for i in range(1000):
            w.write(dict(labelled_sample(i), cls=i // 100))  # one class per shard
    assert main(["inspect", src, "--json", "--samples", "0"]) == 0
    stats = json.loads(capsys.readouterr().out)["class_stats"]
    assert stats["class_ordered"] and stats["classes"] == 10
    assert [r["classes"] for r in stats["per_shard"]] == [1] * 10
    assert main(["inspect", src, "--samples", "0"]) == 0
    assert "shards are class-ordered" in capsys.readouterr().out
    assert main(["convert", "-q", src, str(tmp_path / "mixed"), "--max-shard-samples", "100",
                 "--shuffle-seed", "0"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "mixed"), "--json", "--samples", "0"]) == 0
    stats = json.loads(capsys.readouterr().out)["class_stats"]
    assert not stats["class_ordered"] and stats["shard_entropy_ratio"] > 0.9
    assert main(["inspect", str(tmp_path / "mixed"), "--samples", "0"]) == 0
    assert "class-ordered" not in capsys.readouterr().out
