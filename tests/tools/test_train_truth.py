"""What the reference trainer reports says what it measured.

Regressions: without --eval-data it printed "held-out accuracy 93.3% on 3,000
samples" for the training set; its summary's "data stall 40.3%" was mostly the
run's first steps (80% stall while workers started, 0.4-3% after), with no
word of which.
"""

from __future__ import annotations

import argparse
import re

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.tools.train.loop import run_rank
from shardfeed.tools.train.steplog import STARTUP_STEPS, StepLog
from shardfeed.tools.train.synth import image_samples
from shardfeed.tools.train.train_cmd import add_arguments


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    roots = []
    for name, n, seed in (("train", 96, 0), ("eval", 32, 1)):
        root = str(tmp_path_factory.mktemp("truth") / name)
        with ShardWriter(root, max_shard_samples=32) as w:
            for s in image_samples(n, 4, 8, seed=seed):
                w.write(s)
        roots.append(root)
    return roots


def _train(capsys, *argv) -> str:
    p = argparse.ArgumentParser()
    add_arguments(p)
    run_rank(0, 1, p.parse_args(["--epochs", "1", "--batch-size", "16", "--workers", "0", "--plot", "none",
                                 "--log-every", "2", "--warmup-steps", "0", *argv]))  # argv's options win
    return capsys.readouterr().out


def test_without_eval_data_the_accuracy_is_called_training_accuracy(data, capsys):
    out = _train(capsys, data[0])
    assert "held-out accuracy" not in out, out
    assert re.search(r"epoch 0: training accuracy [\d.]+% on 96 samples .*pass --eval-data for a held-out figure",
                     out), out


def test_with_eval_data_the_accuracy_is_held_out(data, capsys):
    out = _train(capsys, data[0], "--eval-data", data[1])
    assert re.search(r"epoch 0: held-out accuracy [\d.]+% on 32 samples \(chance 25.0%\), 6 steps so far\n", out), out


class FakeLoader:
    """Stats of a loader whose consumer waited 0.8 s a step in the first steps, then 0.01 s."""

    def __init__(self):
        self.samples, self.wait = 0, 0.0

    def take(self, n: int, wait: float) -> None:
        self.samples += n
        self.wait += wait

    def stats(self):
        zero = {"cache_hits": 0, "cache_misses": 0, "bytes_fetched": 0}
        return {"samples": self.samples, "wait_s": self.wait, "total": zero}


def test_the_summary_gives_start_up_and_steady_stall_apart(monkeypatch):
    import torch

    from shardfeed.tools.train import steplog

    clock = [0.0]
    monkeypatch.setattr(steplog.time, "perf_counter", lambda: clock[0])
    loader, log = FakeLoader(), StepLog(5, 0, out=lambda *a, **k: None)
    log.start(loader)
    for step in range(1, 41):
        wait = 0.8 if step <= STARTUP_STEPS else 0.01
        loader.take(8, wait)
        clock[0] += 1.0
        log.step(step, 0, torch.tensor(1.0), loader, None)
    line = log.summary(40)
    assert re.search(r"data stall 20\.[78]% \(start-up", line), line  # 10 x 0.8 + 30 x 0.01 over 40 s
    assert f"(start-up, the first {STARTUP_STEPS} steps: 80.0% of 10.0s; after it: 1.0%)" in line, line


def test_train_tensorboard_holds_loss_loader_stats_and_accuracy(data, capsys, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train(capsys, data[0], "--eval-data", data[1], "--tensorboard", str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb" / "rank0"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/data_stall", "shardfeed/samples_per_s", "shardfeed/decode_s_per_batch",
            "shardfeed/batch_size", "eval/accuracy"} <= tags, tags
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6]


def test_the_plot_shows_accuracy_and_where_a_stopped_run_resumed(data, capsys, tmp_path):
    """--max-steps 4 then --resume: the records say which run wrote them and hold each epoch's accuracy."""
    pytest.importorskip("matplotlib")
    from shardfeed.tools.train import checkpoint
    from shardfeed.tools.train.steplog import panels, resume_steps

    ck, plot = str(tmp_path / "ck.pt"), str(tmp_path / "plot.png")
    common = (data[0], "--eval-data", data[1], "--checkpoint", ck, "--plot", plot)
    _train(capsys, *common, "--max-steps", "4")
    _train(capsys, *common, "--resume")
    records = checkpoint.load(ck)["history"]
    assert resume_steps(records) == [4] and {r["run"] for r in records} == {0, 1}
    assert records[-1]["accuracy"] is not None and records[-1]["held_out"] is True
    assert [p[1] for p in panels(records)][-1] == "held-out accuracy %"
    with open(plot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # the demo's comparison: the same data with --shuffle none, both runs' histories on one figure
    from shardfeed.tools.train.demo import _compare

    base = str(tmp_path / "base.pt")
    _train(capsys, data[0], "--eval-data", data[1], "--checkpoint", base, "--shuffle", "none")
    compared = _compare(ck, base, str(tmp_path / "compared.png"))
    with open(compared, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
