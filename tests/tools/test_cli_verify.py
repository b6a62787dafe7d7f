"""`shardfeed verify`: exit 0 on a good dataset; exit 1 naming each damaged shard."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import flip_byte
from shardfeed.formats import open_index
from shardfeed.tools.cli import main

# the console script installed beside the interpreter running the tests
SHARDFEED = os.path.join(os.path.dirname(sys.executable), "shardfeed")


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_good_dataset_passes(make_dataset, capsys, fmt):
    root = make_dataset(60, shard_samples=20, format=fmt)
    assert main(["verify", root, "--quiet", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "BAD" not in out and "verified 3 shards, 60 samples" in out and "all good" in out


def test_each_damage_is_named(make_dataset, capsys):
    root = make_dataset(100, shard_samples=20)
    idx = open_index(root)
    # shard 1: one payload byte flipped inside sample 5 (located through its sidecar)
    from shardfeed.formats import read_sidecar
    table, _ = read_sidecar(idx.path(1) + ".idx", idx.path(1))
    flip_byte(idx.path(1), int(table.offset[table.member_start[5] + 2]))
    os.truncate(idx.path(2), idx.sizes[2] // 2)  # shard 2: cut in half
    os.unlink(idx.path(3))  # shard 3: gone
    assert main(["verify", root, "--quiet"]) == 1
    out = capsys.readouterr().out
    bad = [line for line in out.splitlines() if line.startswith("BAD ")]
    assert [line.split(":")[0] for line in bad] == [f"BAD {idx.path(i)}" for i in (1, 2, 3)]
    assert "content hash" in bad[0] and "sample 5 ('00000025') fails its checksum" in bad[0]
    assert "truncated" in bad[1]
    assert "missing" in bad[2]
    assert "3 bad shards" in out


def test_wrong_or_missing_sidecar_is_caught(make_dataset, capsys):
    """Shard 0 gets shard 1's sidecar (same size, other offsets); shard 1 loses its sidecar, which
    readers survive by scanning but without the per-sample checksums written with the data."""
    root = make_dataset(40, shard_samples=20)
    idx = open_index(root)
    os.replace(idx.path(1) + ".idx", idx.path(0) + ".idx")
    assert main(["verify", root, "--quiet"]) == 1
    bad = [line for line in capsys.readouterr().out.splitlines() if line.startswith("BAD ")]
    assert bad[0].startswith(f"BAD {idx.path(0)}: ") and "another version of the shard" in bad[0]
    assert bad[1].startswith(f"BAD {idx.path(1)}: ") and "sidecar shard-000001.tar.idx is missing" in bad[1]


def test_broken_index_exits_2(make_dataset, capsys):
    root = make_dataset(10, shard_samples=5)
    with open(os.path.join(root, "index.arrow"), "r+b") as f:
        f.truncate(100)
    assert main(["verify", root]) == 2
    assert "index.arrow" in capsys.readouterr().err


def test_console_script_convert_inspect_verify(tmp_path):
    """The installed `shardfeed` entry point, end to end, in a subprocess."""
    rows = "".join(f'{{"k": "s{i}", "y": {i % 5}, "text": "row {i}"}}\n' for i in range(200))
    (tmp_path / "rows.jsonl").write_text(rows)
    dst = str(tmp_path / "ds")
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def sh(*argv):
        return subprocess.run([SHARDFEED, *argv], capture_output=True, text=True, timeout=120, env=env)

    r = sh("convert", str(tmp_path / "rows.jsonl"), dst, "--key-column", "k", "--field", "y=cls",
           "--field", "text=txt", "--max-shard-bytes", "20KB")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("converted 200 samples into ") and "MB/s" in r.stdout
    n = len(open_index(dst))
    assert n > 2
    r = sh("inspect", dst)
    assert r.returncode == 0 and "fields         cls, txt" in r.stdout and "'row 0'" in r.stdout
    flip_byte(os.path.join(dst, "shard-000001.tar"), 700)
    r = sh("verify", dst)
    assert r.returncode == 1 and f"BAD {os.path.join(dst, 'shard-000001.tar')}" in r.stdout
    assert f"verified {n} shards, 200 samples" in r.stdout and "1 bad shard" in r.stdout
