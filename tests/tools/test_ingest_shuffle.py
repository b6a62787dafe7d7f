"""`shardfeed ingest --shuffle-seed S` shuffles at write time like convert, and an
ingest whose published shards are class-ordered says so, as `inspect` does."""

from __future__ import annotations

import json

from shardfeed.formats import ShardWriter, open_index, open_shard
from shardfeed.tools import cli

N, CLASSES = 200, 10


def _class_ordered_jsonl(path) -> list[str]:
    """Rows sorted by class (20 of class 0, then 20 of class 1, ...): the input a shuffle must fix."""
    with open(path, "w") as f:
        for i in range(N):
            f.write(json.dumps({"id": f"r{i:05d}", "cls": i * CLASSES // N, "txt": f"row {i}"}) + "\n")
    return [f"r{i:05d}" for i in range(N)]


def _ingest(src, dst, *extra) -> int:
    return cli.main(["ingest", str(src), str(dst), "--max-shard-samples", "20", "-q", *map(str, extra)])


def _jsonl_ingest(src, dst, *extra) -> int:
    return _ingest(src, dst, "--key-column", "id", "--field", "cls=cls", "--field", "txt=txt", *extra)


def _keys(root) -> list[str]:
    idx = open_index(str(root))
    return [k for i in range(len(idx)) for k in open_shard(idx, i).table.keys]


def test_shuffle_seed_writes_a_fixed_random_order(tmp_path, capsys):
    keys = _class_ordered_jsonl(tmp_path / "rows.jsonl")
    assert _jsonl_ingest(tmp_path / "rows.jsonl", tmp_path / "plain") == 0
    assert _keys(tmp_path / "plain") == keys
    assert _jsonl_ingest(tmp_path / "rows.jsonl", tmp_path / "s3", "--shuffle-seed", 3) == 0
    assert _jsonl_ingest(tmp_path / "rows.jsonl", tmp_path / "s3b", "--shuffle-seed", 3) == 0
    assert _jsonl_ingest(tmp_path / "rows.jsonl", tmp_path / "s4", "--shuffle-seed", 4) == 0
    s3 = _keys(tmp_path / "s3")
    assert sorted(s3) == keys and s3 != keys
    assert _keys(tmp_path / "s3b") == s3
    assert _keys(tmp_path / "s4") != s3
    capsys.readouterr()


def test_shuffle_seed_of_a_source_read_front_to_back_gives_the_same_order(tmp_path):
    """A zstd tar dataset is read front to back (bucket shuffle); same rows, same seed, same order."""
    keys = _class_ordered_jsonl(tmp_path / "rows.jsonl")
    with ShardWriter(str(tmp_path / "zst"), max_shard_samples=50, compression="zstd") as w:
        for i, k in enumerate(keys):
            w.write({"__key__": k, "cls": i * CLASSES // N, "txt": f"row {i}"})
    assert _jsonl_ingest(tmp_path / "rows.jsonl", tmp_path / "a", "--shuffle-seed", 7) == 0
    assert _ingest(tmp_path / "zst", tmp_path / "b", "--shuffle-seed", 7) == 0
    assert _keys(tmp_path / "b") == _keys(tmp_path / "a") != keys
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ingest-shuffle-")]  # buckets removed


def test_class_ordered_ingest_warns_and_a_shuffled_one_does_not(tmp_path, capsys):
    _class_ordered_jsonl(tmp_path / "rows.jsonl")
    assert _jsonl_ingest(tmp_path / "rows.jsonl", tmp_path / "plain") == 0
    err = capsys.readouterr().err
    assert "shardfeed ingest: warning: the 10 shards published are class-ordered" in err, err
    assert "--shuffle-seed" in err
    assert _jsonl_ingest(tmp_path / "rows.jsonl", tmp_path / "mixed", "--shuffle-seed", 0) == 0
    assert "warning" not in capsys.readouterr().err
