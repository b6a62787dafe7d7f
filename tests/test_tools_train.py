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
def test_dual_batch_ranks_take_equal_steps_cover_the_epoch_once_and_loss_falls(tmp_path):
    """Ranks with batches of 24 and 8 (global 32): the same number of steps,
    every sample of each epoch once, a log line per 5 steps, loss going down,
    a summary and a plot."""
    _write(tmp_path / "train", 640, 0)
    _write(tmp_path / "eval", 200, 1)
    out = subprocess.run([EXE, "train", str(tmp_path / "train"), "--eval-data", str(tmp_path / "eval"),
                          "--ranks", "2", "--epochs", "3", "--batch-size", "24,8", "--image-size", "16",
                          "--log-every", "5", "--trace", str(tmp_path / "trace"), "--plot", str(tmp_path / "p.png")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    logs = re.findall(r"step (\d+) \(epoch (\d)\): loss ([\d.]+), ([\d,]+) samples/s, data stall ([\d.]+)%",
                      out.stdout)
    assert [int(m[0]) for m in logs] == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60], out.stdout
    losses = [float(m[2]) for m in logs]
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    for rank, batch in ((0, 24), (1, 8)):
        rows = [line.split(" ") for line in (tmp_path / "trace" / f"rank{rank}-of-2.txt").read_text().splitlines()]
        assert [int(r[0]) for r in rows] == list(range(1, 61))  # 640 / 32 = 20 steps per epoch on each rank
        assert {len(r[2].split(",")) for r in rows} == {batch}
    for epoch in range(3):
        keys = [k for rank in (0, 1) for line in (tmp_path / "trace" / f"rank{rank}-of-2.txt").read_text().splitlines()
                if line.split(" ")[1] == str(epoch) for k in line.split(" ")[2].split(",")]
        assert sorted(keys) == [f"{i:09d}" for i in range(640)]
    assert re.search(r"epoch 2: held-out accuracy [\d.]+% on 200 samples \(chance 25.0%\)", out.stdout), out.stdout
    assert re.search(r"summary: 60 steps, 1,920 samples in .* data stall [\d.]+%, no cache", out.stdout)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
