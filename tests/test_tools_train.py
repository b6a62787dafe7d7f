"""The reference trainer and the demo, end to end on 2 gloo ranks."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))


def _write(root, n, seed):
    with ShardWriter(str(root), max_shard_samples=100) as w:
        for s in image_samples(n, 4, 16, seed=seed):
            w.write(s)


@pytest.mark.slow
@pytest.mark.distributed
def test_train_two_ranks_learns_and_reports_stall(tmp_path):
    _write(tmp_path / "train", 600, 0)
    _write(tmp_path / "eval", 200, 1)
    out = subprocess.run([EXE, "train", str(tmp_path / "train"), "--eval-data", str(tmp_path / "eval"),
                          "--ranks", "2", "--epochs", "3", "--batch-size", "32", "--image-size", "16",
                          "--lr", "0.1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = re.findall(r"epoch (\d): (\d+) steps/rank, ([\d,]+) samples/s, data stall ([\d.]+)s of ([\d.]+)s "
                       r".*accuracy ([\d.]+)%", out.stdout)
    assert [int(m[0]) for m in lines] == [0, 1, 2], out.stdout
    # 600 samples over 2 ranks in batches of 32: ceil(300 / 32) steps on each rank.
    assert all(int(m[1]) == 10 for m in lines)
    assert all(0 <= float(m[3]) <= float(m[4]) for m in lines)
    # 4 classes: chance is 25%; the synthetic classes are easy to tell apart.
    assert float(lines[-1][5]) >= 80.0, out.stdout


@pytest.mark.slow
def test_demo_without_training_reads_every_label_back(tmp_path):
    out = subprocess.run([EXE, "demo", "--out", str(tmp_path / "demo"), "--samples", "300", "--shard-samples",
                          "64", "--no-train"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train: wrote 300 samples in 5 shards" in out.stdout
    assert re.search(r"read 300 samples back through Loader, 2 workers, global shuffle, decoding PNG: "
                     r"[\d,]+ samples/s \([\d,]+ in the first epoch.*\), every label checked", out.stdout), out.stdout


def _train(*argv):
    return subprocess.run([EXE, "train", *map(str, argv)], capture_output=True, text=True, timeout=120)


def _assert_one_line_error(out, *words):
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardfeed train: error: "), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    for w in words:
        assert w in lines[0], lines[0]


def test_train_on_missing_folder_is_one_line_rc_2_before_spawning(tmp_path):
    """It printed the error once per rank, then torch.multiprocessing's 30-line traceback, rc 1."""
    _assert_one_line_error(_train(tmp_path / "nope"), str(tmp_path / "nope"), "not found")


def test_train_on_data_without_image_and_cls_names_what_it_has(tmp_path):
    with ShardWriter(str(tmp_path / "text"), max_shard_samples=10) as w:
        for i in range(20):
            w.write({"__key__": f"{i:04d}", "txt": f"line {i}", "json": {"i": i}})
    _assert_one_line_error(_train(tmp_path / "text"), str(tmp_path / "text"), "image field", "cls field",
                           "txt, json")


def test_train_checks_eval_data_and_options_too(tmp_path):
    _write(tmp_path / "train", 40, 0)
    _assert_one_line_error(_train(tmp_path / "train", "--eval-data", tmp_path / "gone"), str(tmp_path / "gone"))
    with ShardWriter(str(tmp_path / "nolabel"), max_shard_samples=10) as w:
        for s in image_samples(20, 2, 8, seed=0):
            s.pop("cls")
            w.write(s)
    out = _train(tmp_path / "nolabel")
    _assert_one_line_error(out, "cls field")
    assert "image field" not in out.stderr  # it has one: only the missing field is named
    _assert_one_line_error(_train(tmp_path / "train", "--ranks", "0"), "--ranks 0")
