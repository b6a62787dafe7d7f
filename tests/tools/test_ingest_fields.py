"""A dataset made by `shardfeed ingest` records its fields like one made by convert.

Regression: appended shards' commits carried no field names, so `inspect`
showed `fields -` and `shardfeed train` refused the dataset ("its fields:
none recorded"), before and after `shardfeed compact`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.formats.commit_log import open_stream_index, read_commits
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))


def _run(*argv, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *map(str, argv)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ingest_fields")
    with ShardWriter(str(tmp / "src"), max_shard_samples=40) as w:
        for s in image_samples(96, 4, 16, seed=0):
            w.write(s)
    out = _run("ingest", tmp / "src", tmp / "live", "--max-shard-samples", 32, "-q")
    assert out.returncode == 0, out.stderr
    return tmp


def _inspect_fields(root) -> list[str]:
    out = _run("inspect", root, "--json", "--samples", "0", timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["fields"]


def test_ingest_records_fields_in_the_log_and_index(ingested):
    live = ingested / "live"
    want = list(open_index(str(ingested / "src")).fields)
    assert set(want) >= {"png", "cls"}
    assert list(read_commits(str(live)).fields) == want
    assert list(open_index(str(live)).fields) == want
    assert _inspect_fields(live) == want


@pytest.mark.slow
@pytest.mark.distributed
def test_train_runs_on_an_ingested_dataset_before_and_after_compact(ingested, tmp_path):
    live = ingested / "live"
    for when in ("before", "after"):
        if when == "after":
            out = _run("compact", live, timeout=60)
            assert out.returncode == 0, out.stderr
            assert list(open_index(str(live)).fields) == list(open_index(str(ingested / "src")).fields)
            assert _inspect_fields(live) == list(open_index(str(ingested / "src")).fields)
        out = _run("train", live, "--ranks", "2", "--epochs", "1", "--batch-size", "16", "--workers", "0",
                   "--plot", "none", "--classes", "4")
        assert out.returncode == 0, f"{when} compact: {out.stderr[-2000:]}"
        assert "trained on 2 ranks" in out.stdout, out.stdout


def test_a_bad_fields_list_in_a_commit_is_damage(tmp_path):
    root = tmp_path / "live"
    with ShardWriter(str(root), append=True, max_shard_samples=5) as w:
        for i in range(5):
            w.write({"__key__": f"{i:03d}", "cls": i})
    entry = next((root / "_log").glob("*.json"))
    rec = json.loads(entry.read_text())
    assert rec["fields"] == ["cls"]
    rec["fields"] = "cls"
    entry.write_text(json.dumps(rec))
    with pytest.raises(ShardError, match="bad fields list"):
        open_stream_index(str(root))
