"""CLI argument validation: SRC/DST overlap, durations, numeric bounds, merge
records naming files outside their part. Each case exits 2 with a line
naming the argument, fast; commands that ran forever or for hours on these
values run in a child under a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.tools.cli import main as cli

pytestmark = pytest.mark.hostile(timeout=180)  # bounded time and memory (conftest.py)


def _run(*argv, timeout=40):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "shardfeed.tools.cli", *argv], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def _live(root, n=4):
    w = ShardWriter(str(root), append=True, max_shard_samples=2)
    for i in range(n):
        w.write({"__key__": f"k{i}", "cls": i})
    w.close()


def _jsonl(folder, n=5) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "a.jsonl")
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"t{i}"}) + "\n")
    return path


def test_ingest_follow_src_into_itself_is_refused(tmp_path):
    d = tmp_path / "d"
    _live(d)
    code, out, _ = _run("ingest", str(d), str(d), "--follow-src", "--idle-exit-s", "2", "--poll-s", "0.05", "-q")
    assert code == 2 and "same place" in out, out


@pytest.mark.parametrize("dst", ["sub", "."])
def test_ingest_and_convert_refuse_one_inside_the_other(tmp_path, capsys, dst):
    src = tmp_path / "src"
    _jsonl(src)
    target = str(src / dst) if dst != "." else str(src)
    assert cli(["ingest", str(src), target, "--follow-src", "--idle-exit-s", "1", "-q"]) == 2
    assert "DST" in capsys.readouterr().err
    assert cli(["convert", str(src), target, "-q"]) == 2
    assert "SRC" in capsys.readouterr().err
    assert cli(["convert", str(src / "*.jsonl"), str(src), "-q"]) == 2


def test_a_pattern_may_write_beside_the_files_it_reads(tmp_path):
    src = tmp_path / "src"
    _jsonl(src)
    assert cli(["convert", str(src / "*.jsonl"), str(src / "out"), "-q"]) == 0


def test_reshard_into_its_source_is_refused(tmp_path, capsys):
    d = tmp_path / "d"
    with ShardWriter(str(d), max_shard_samples=2) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "cls": i})
    assert cli(["reshard", str(d), str(d / "again")]) == 2
    assert "inside" in capsys.readouterr().err


def test_same_url_is_refused():
    from shardfeed.tools.arg_bounds import overlap

    assert "same place" in overlap("s3://b/ds", "s3://b/ds/")
    assert "inside" in overlap("s3://b/ds/x", "s3a://b/ds")
    assert overlap("s3://b/ds", "s3://b/ds2") is None


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_ingest_idle_exit_s_must_be_finite_and_not_negative(tmp_path, value):
    src = tmp_path / "src"
    _jsonl(src)
    code, out, took = _run("ingest", str(src), str(tmp_path / "dst"), "--follow-src", "--idle-exit-s", value,
                           "--poll-s", "0.05", "-q")
    assert code == 2 and "--idle-exit-s" in out and took < 30, out


@pytest.mark.parametrize("value", ["nan", "0", "inf"])
def test_ingest_poll_s_must_be_finite_and_positive(tmp_path, value, capsys):
    src = tmp_path / "src"
    _jsonl(src)
    assert cli(["ingest", str(src), str(tmp_path / "dst"), "--follow-src", "--poll-s", value, "-q"]) == 2
    assert "--poll-s" in capsys.readouterr().err


@pytest.fixture
def dataset(tmp_path):
    d = tmp_path / "plan"
    with ShardWriter(str(d), max_shard_samples=10) as w:
        for i in range(50):
            w.write({"__key__": f"k{i:03d}", "cls": i})
    return str(d)


@pytest.mark.parametrize("argv, name", [
    (["--cache-limit", str(10**30)], "--cache-limit"),
    (["--cache-limit", "1e400"], "--cache-limit"),
    (["--cache-limit", "1MB", "--batch-size", str(10**30)], "--batch-size"),
    (["--cache-limit", "1MB", "--epochs", str(10**9)], "--epochs"),
    (["--cache-limit", "1MB", "--world-size", str(10**8)], "--world-size"),
    (["--cache-limit", "1MB", "--seed", "-1"], "--seed"),
    (["--cache-limit", "1MB", "--ranks-per-node", str(10**12)], "--ranks-per-node"),
])
def test_plan_bounds_every_numeric_argument(dataset, argv, name):
    code, out, took = _run("plan", dataset, *argv, timeout=60)
    # refused at once: the time is a fresh interpreter's start (slow on a loaded machine), not the plan's
    assert code == 2 and name in out and "Traceback" not in out and took < 45, out


def test_merge_reads_only_plain_names_inside_the_parts(tmp_path, capsys):
    src = tmp_path / "src"
    _jsonl(src, 8)
    parts = []
    for i in range(2):
        p = str(tmp_path / f"part{i}")
        assert cli(["convert", str(src), p, "--part", f"{i}/2", "--max-shard-samples", "2", "-q"]) == 0
        parts.append(p)
    (tmp_path / "secret.txt").write_text("not yours")
    rec_path = os.path.join(parts[0], "part.json")
    rec = json.load(open(rec_path))
    good = rec["shards"][0]["name"]
    for bad in ("../secret.txt", "/etc/hostname", "shard-000000/../../secret.txt"):
        rec["shards"][0]["name"] = bad
        json.dump(rec, open(rec_path, "w"))
        assert cli(["convert", "--merge", str(tmp_path / "out"), *parts]) == 2
        assert "plain" in capsys.readouterr().err
        assert not os.path.exists(tmp_path / "out")
    rec["shards"][0]["name"] = good
    json.dump(rec, open(rec_path, "w"))
    os.rename(os.path.join(parts[0], good), str(tmp_path / "moved"))
    os.symlink(str(tmp_path / "moved"), os.path.join(parts[0], good))  # a link to a file outside the part
    assert cli(["convert", "--merge", str(tmp_path / "out"), *parts]) == 2
    assert "symbolic link" in capsys.readouterr().err


@pytest.mark.parametrize("argv, name", [
    (["warm", "--keep-days", "inf"], "--keep-days"),
    (["train", "D", "--idle-timeout", "nan"], "--idle-timeout"),
    (["train", "D", "--collective-timeout=-5"], "--collective-timeout"),
    (["bench", "soak", "--minutes", "nan"], "--minutes"),
    (["ingest", "a", "b", "--poll-s=-inf"], "--poll-s"),
])
def test_no_subcommand_takes_a_non_finite_or_negative_number(argv, name, capsys):
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "must be a finite number >= 0" in err and name in err
