"""Ray Data on a real local Ray instance (2 CPUs, started once for this module)."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow  # one Ray start (~3-20 s on a loaded machine) and Ray Data warm-up
ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")

from conftest import labelled_sample  # noqa: E402
from shardfeed.formats import ShardWriter, open_index, open_shard, verify_shard  # noqa: E402
from shardfeed.tools.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _samples(root) -> list[dict]:
    idx = open_index(str(root))
    out = []
    for i in range(len(idx)):
        with open_shard(idx, i) as r:
            out += [dict(s) for s in r]
    return out


def _rows(n: int) -> list[dict]:
    return [{"__key__": s["__key__"], "cls": s["cls"], "txt": s["txt"], "bin": s["bin"]}
            for s in (labelled_sample(i) for i in range(n))]


def test_datasink_round_trip_verifies(ray_local, tmp_path):
    from shardfeed.formats.ray_data import ShardDatasink

    ds = ray.data.from_items(_rows(300), override_num_blocks=4)
    ds.write_datasink(ShardDatasink(str(tmp_path / "out"), max_shard_samples=40))
    idx = open_index(str(tmp_path / "out"))
    assert idx.num_samples == 300 and len(idx) >= 8  # at least one shard per write task and 40 a shard
    for i in range(len(idx)):
        verify_shard(idx, i)
    got = {s["__key__"]: s for s in _samples(tmp_path / "out")}
    for row in _rows(300):
        s = got[row["__key__"]]
        assert s["bin"] == row["bin"] and int(s["cls"]) == row["cls"] and s["txt"].decode() == row["txt"]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the stage became the dataset


def test_failing_write_task_publishes_nothing(ray_local, tmp_path):
    from shardfeed.formats.ray_data import ShardDatasink

    rows = _rows(200)
    rows[150]["__key__"] = "../escape"  # the writer refuses a path-like key: that task fails
    ds = ray.data.from_items(rows, override_num_blocks=4)
    with pytest.raises(Exception, match="path-like"):
        ds.write_datasink(ShardDatasink(str(tmp_path / "out"), max_shard_samples=20))
    assert os.listdir(tmp_path) == []  # no dataset, no stage


def test_datasource_equals_the_samples(ray_local, tmp_path):
    from shardfeed.formats.ray_data import ShardDatasource

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=30) as w:
        for i in range(250):
            w.write(labelled_sample(i))
    source = ShardDatasource(root)
    assert len(source.get_read_tasks(3)) == 3
    rows = ray.data.read_datasource(source, override_num_blocks=3).take_all()
    want = _samples(root)
    assert sorted(rows, key=lambda r: r["__key__"]) == want


def test_convert_engine_ray_equals_processes(ray_local, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(300)))
    opts = ["--max-shard-samples", "32", "--shuffle-seed", "2", "--processes", "2"]
    assert main(["convert", "-q", str(src), str(tmp_path / "ray"), "--engine", "ray", *opts]) == 0
    assert main(["convert", "-q", str(src), str(tmp_path / "local"), *opts]) == 0
    for name in sorted(os.listdir(tmp_path / "local")):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


def test_datasink_append_commits_to_a_growing_dataset(ray_local, tmp_path):
    """Ingest: a Ray job adds its shards to a live dataset through the commit log."""
    from shardfeed.formats.ray_data import ShardDatasink

    root = str(tmp_path / "live")
    with ShardWriter(root, append=True, max_shard_samples=50) as w:
        for i in range(100):
            w.write(labelled_sample(i))
    rows = [r for r in _rows(250) if r["__key__"] >= f"{100:08d}"]
    ray.data.from_items(rows, override_num_blocks=2).write_datasink(
        ShardDatasink(root, max_shard_samples=40, append=True))
    assert sorted(s["__key__"] for s in _samples(root)) == [f"{i:08d}" for i in range(250)]
    assert [n for n in os.listdir(tmp_path) if n != "live"] == []  # the stage is gone


def test_datasink_append_records_the_sample_fields(ray_local, tmp_path, capsys):
    """A dataset grown only by Ray appends lists its fields, as one grown by
    ShardWriter(append=True) does: inspect finds the labels, compact keeps them."""
    from shardfeed.formats.open_dataset import compact
    from shardfeed.formats.ray_data import ShardDatasink

    root = str(tmp_path / "live")
    ray.data.from_items(_rows(60), override_num_blocks=2).write_datasink(
        ShardDatasink(root, max_shard_samples=20, append=True))
    assert sorted(open_index(root).fields) == ["bin", "cls", "txt"]
    assert main(["inspect", "--json", "--samples", "0", root]) == 0
    info = json.loads(capsys.readouterr().out)
    assert sorted(info["fields"]) == ["bin", "cls", "txt"] and info["samples"] == 60 and "class_stats" in info
    compact(root)
    assert sorted(open_index(root, follow_log=False).fields) == ["bin", "cls", "txt"]


def test_old_import_path_still_works():
    """shardfeed.tools.convert.ray_data was the documented path before the classes moved into formats/."""
    from shardfeed.formats import ray_data
    from shardfeed.tools.convert.ray_data import ShardDatasink, ShardDatasource

    assert ShardDatasink is ray_data.ShardDatasink and ShardDatasource is ray_data.ShardDatasource
