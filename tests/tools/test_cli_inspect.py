"""`shardfeed inspect`: counts, sizes, fields, previews; text and --json; foreign tars."""

from __future__ import annotations

import json
import os
import pickle

import webdataset as wds

from shardfeed.formats import ShardWriter
from shardfeed.tools.cli import main

WDS_TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "wds-testdata")


def test_inspect_json_reports_counts_sizes_fields(make_dataset, capsys):
    root = make_dataset(100, shard_samples=30)
    assert main(["inspect", root, "--json", "--samples", "2", "--shards"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["indexed"] is True
    assert (info["shards"], info["samples"]) == (4, 100)
    assert info["formats"] == {"tar": 4}
    assert info["fields"] == ["cls", "txt", "bin"]
    assert info["shard_samples"] == {"min": 10, "median": 30, "max": 30}
    assert info["shard_bytes"]["min"] < info["shard_bytes"]["max"]
    assert info["bytes"] == sum(s["bytes"] for s in info["shard_list"])
    first, last = info["examples"]
    assert (first["key"], last["key"]) == ("00000000", "00000099")
    assert last["fields"]["cls"] == "9" and last["fields"]["txt"] == "'sample 99'"
    assert last["fields"]["bin"].startswith("<64 bytes: ")


def test_inspect_text_on_foreign_tars_and_classes(tmp_path, capsys):
    assert main(["inspect", WDS_TESTDATA, "--samples", "3"]) == 0
    out = capsys.readouterr().out
    assert "no index: tars scanned" in out
    assert "1,190" in out and "tar.gz: 1" in out
    assert "png" in out and "<306 bytes: 89 50 4e 47" in out  # sample.tgz's first PNG, shown as bytes


def test_inspect_never_unpickles(tmp_path, capsys):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    with wds.TarWriter(str(tmp_path / "p.tar"), encoder=False) as w:
        w.write({"__key__": "a", "pkl": pickle.dumps(Boom()), "cls": b"1"})
    assert main(["inspect", str(tmp_path / "p.tar"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "pickle: not decoded" in info["examples"][0]["fields"]["pkl"]


def test_inspect_columnar_and_missing(tmp_path, capsys):
    with ShardWriter(str(tmp_path / "pq"), format="parquet", max_shard_samples=4) as w:
        for i in range(10):
            w.write({"__key__": f"k{i}", "cls": i, "json": {"i": i}})
    assert main(["inspect", str(tmp_path / "pq"), "--json", "--samples", "1"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["formats"] == {"parquet": 3} and info["examples"][0]["fields"] == {"cls": "0", "json": '{"i":0}'}
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
