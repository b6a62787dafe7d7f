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


EPOCHS, STEPS = 2, 20  # 640 samples / global batch 32 = 20 steps per epoch on each rank


@pytest.fixture(scope="module")
def dual(tmp_path_factory):
    """One 2-rank run with batches of 24 and 8 (global 32), audited; its asserts are split below."""
    tmp = tmp_path_factory.mktemp("dual")
    _write(tmp / "train", 640, 0)
    _write(tmp / "eval", 200, 1)
    out = subprocess.run([EXE, "train", str(tmp / "train"), "--eval-data", str(tmp / "eval"),
                          "--ranks", "2", "--epochs", str(EPOCHS), "--batch-size", "24,8", "--image-size", "16",
                          "--log-every", "5", "--trace", str(tmp / "trace"), "--plot", str(tmp / "p.png"),
                          "--checkpoint", str(tmp / "ck.pt"), "--audit"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp, out.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_dual_batch_ranks_take_equal_steps_and_cover_each_epoch_once(dual):
    """Ranks with batches of 24 and 8: the same number of steps, every sample of each epoch once."""
    tmp, _ = dual
    for rank, batch in ((0, 24), (1, 8)):
        rows = [line.split(" ") for line in (tmp / "trace" / f"rank{rank}-of-2.txt").read_text().splitlines()]
        assert [int(r[0]) for r in rows] == list(range(1, EPOCHS * STEPS + 1))
        assert {len(r[2].split(",")) for r in rows} == {batch}
    for epoch in range(EPOCHS):
        keys = [k for rank in (0, 1) for line in (tmp / "trace" / f"rank{rank}-of-2.txt").read_text().splitlines()
                if line.split(" ")[1] == str(epoch) for k in line.split(" ")[2].split(",")]
        assert sorted(keys) == [f"{i:09d}" for i in range(640)]


@pytest.mark.slow
@pytest.mark.distributed
def test_train_logs_every_n_steps_loss_falls_summary_and_plot(dual):
    tmp, stdout = dual
    logs = re.findall(r"step (\d+) \(epoch (\d)\): loss ([\d.]+), ([\d,]+) samples/s, data stall ([\d.]+)%",
                      stdout)
    assert [int(m[0]) for m in logs] == list(range(5, EPOCHS * STEPS + 1, 5)), stdout
    losses = [float(m[2]) for m in logs]
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    assert re.search(rf"epoch {EPOCHS - 1}: held-out accuracy [\d.]+% on 200 samples \(chance 25.0%\)", stdout), stdout
    assert re.search(rf"summary: {EPOCHS * STEPS} steps, {EPOCHS * 640:,} samples in .* data stall [\d.]+% "
                     r"\(start-up, the first \d+ steps: [\d.]+% of [\d.]+s; after it: [\d.]+%\), no cache", stdout)
    assert (tmp / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.distributed
def test_train_audit_records_beside_the_checkpoint_pass_shardfeed_audit(dual):
    """--audit: one record per rank (the older ones of the run replaced at each checkpoint);
    together they cover both epochs; one rank's record alone misses the other's samples."""
    tmp, _ = dual
    records = sorted((tmp / "ck.pt.audit").iterdir())
    last = EPOCHS * STEPS
    assert [r.name for r in records] == [f"steps-0000000-{last:07d}-rank{r}-of-2.json" for r in (0, 1)]
    both = subprocess.run([EXE, "audit", *map(str, records)], capture_output=True, text=True, timeout=60)
    assert both.returncode == 0, both.stdout + both.stderr
    assert f"ok: {EPOCHS} epoch(s), 1 source(s), 2 records" in both.stdout
    one = subprocess.run([EXE, "audit", str(records[0])], capture_output=True, text=True, timeout=60)
    assert one.returncode == 1 and "160 samples missed" in one.stdout, one.stdout  # rank 1's 8 of 32, 20 steps


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


def test_train_audit_needs_a_checkpoint_and_no_replay(tmp_path):
    _write(tmp_path / "train", 40, 0)
    _assert_one_line_error(_train(tmp_path / "train", "--audit"), "--audit", "--checkpoint")
    _assert_one_line_error(_train(tmp_path / "train", "--audit", "--follow", "--replay", "0.2", "--checkpoint",
                                  tmp_path / "ck.pt"), "--audit", "--replay 0.2")


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


def test_a_rank_killed_mid_run_stops_the_job_with_one_clear_line(tmp_path):
    """A dead rank must not leave the others hanging in a collective: the job
    ends within the collective timeout, naming the rank and how it died."""
    import os
    import signal
    import time

    import psutil

    _write(tmp_path / "train", 4000, 0)
    proc = subprocess.Popen([EXE, "train", str(tmp_path / "train"), "--epochs", "50", "--batch-size", "8",
                             "--collective-timeout", "30", "--log-every", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        ranks = []
        while time.time() < deadline and len(ranks) < 2:
            ranks = [c for c in psutil.Process(proc.pid).children(recursive=True)
                     if "spawn" in " ".join(c.cmdline()) and c.name().startswith("python")]
            time.sleep(0.5)
        assert len(ranks) >= 2, "the two ranks never started"
        time.sleep(8)  # let them train a little
        os.kill(ranks[-1].pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, (out, err)
    lines = [ln for ln in err.splitlines() if ln.startswith("shardfeed train: error:")]
    assert len(lines) == 1 and "was killed by SIGKILL" in lines[0], err
    assert "Traceback" not in err
