"""`shardfeed train --balance --slow-rank`: sizes follow the measured speed, and the training is
the same as with static sizes (the loss weighting counts every step's samples)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from shardfeed.formats import ShardWriter
from shardfeed.loader.step_timer import ComputeTimer
from shardfeed.tools.train.balancing import SlowRank, parse_slow_rank
from shardfeed.tools.train.model import SmallCNN
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two 2-rank runs of one epoch (20 steps) with rank 1 simulated 3x slower: balanced, and at the static 16/16."""
    tmp = tmp_path_factory.mktemp("balance")
    with ShardWriter(str(tmp / "train"), max_shard_samples=100) as w:
        for s in image_samples(640, 4, 16, seed=0):
            w.write(s)
    out = {}
    for name, extra in (("balanced", ["--balance", "--balance-every", "5"]), ("static", [])):
        got = subprocess.run([EXE, "train", str(tmp / "train"), "--ranks", "2", "--epochs", "1", "--batch-size", "16",
                              "--image-size", "16", "--slow-rank", "1:3", "--plot", "none", "--log-every", "10",
                              "--workers", "0", *extra], capture_output=True, text=True, timeout=300)
        assert got.returncode == 0, got.stderr[-3000:]
        out[name] = got.stdout
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_balanced_sizes_converge_towards_the_speed_ratio(runs):
    out = runs["balanced"]
    assert "simulation: rank 1 repeats its forward/backward work 2 extra time(s) per step" in out
    changes = re.findall(r"balance: step \d+: batch sizes (\d+),(\d+) -> (\d+),(\d+)", out)
    assert changes, out
    first, last = [int(x) for x in changes[0][:2]], [int(x) for x in changes[-1][2:]]
    assert first == [16, 16] and sum(last) == 32
    # rank 1 does 3x the work per step: a quarter of the global batch (8) or less, as its fixed
    # per-step work (large beside 16-px images) is 3x too. (One way only is the proposal's property,
    # tested under controlled noise, as is the exact quarter. Here a busy machine adds the same time to
    # both ranks' steps, which pulls the measured ratio towards 1: a full suite beside a busy core ended
    # at 22/10 and 21/11. So: at least half the way from the static 16 to the speed's 8.)
    assert 2 <= last[1] <= 12 and int(changes[0][3]) < 16, changes


@pytest.mark.slow
@pytest.mark.distributed
def test_balancing_trains_the_same_model_as_static_sizes(runs):
    """Each global step holds the same samples whatever the split (the rest of the epoch is dealt
    again from the consumed position) and each rank's loss is weighted by its share: the balanced
    run ends with the static run's loss and accuracy (up to the order of float sums)."""
    def result(out):
        loss = float(re.search(r"last loss ([\d.]+)", out)[1])
        acc = [float(a) for a in re.findall(r"held-out accuracy ([\d.]+)%", out)]
        return loss, acc
    loss_b, acc_b = result(runs["balanced"])
    loss_s, acc_s = result(runs["static"])
    assert abs(loss_b - loss_s) < 0.01 and acc_b == pytest.approx(acc_s, abs=0.5), (runs["balanced"], runs["static"])


def test_slow_rank_repeats_the_work_and_the_timer_sees_it():
    torch.set_num_threads(1)
    x, y = torch.rand(16, 3, 16, 16), torch.randint(0, 4, (16,))

    def fastest_step(factor):
        model = SmallCNN(4)
        if factor > 1:
            SlowRank(model, factor)
        timer = ComputeTimer(model)
        times = []
        for _ in range(9):
            F.cross_entropy(model(x), y).backward()
            times.append(timer.take())
        with torch.no_grad():
            model(x)
        assert timer.take() is None  # an evaluation forward is no training step
        return min(times)  # a busy machine only adds to a step: the fastest of 9 is the work's own time
    assert 1.8 < fastest_step(3) / fastest_step(1) < 4


def test_slow_rank_option_is_checked():
    assert parse_slow_rank("1:3", 2) == (1, 3) and parse_slow_rank(None, 2) is None
    for bad in ("2:3", "1:0", "1", "a:b"):
        with pytest.raises(ValueError, match="--slow-rank"):
            parse_slow_rank(bad, 2)


@pytest.mark.slow
@pytest.mark.distributed
def test_bench_balance_writes_its_tables(tmp_path):
    """`shardfeed bench balance` end to end on a tiny run: both tables, the moved slowdown line."""
    got = subprocess.run([EXE, "bench", "balance", "--factors", "3", "--steps", "16", "--warmup", "2", "--every", "4",
                          "--rounds", "1", "--batch", "64", "--sweep-step", "16", "--hidden", "64",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    text = (tmp_path / "balance.md").read_text()
    assert "| 3x |" in text and "compute-bound samples/s" in text and "wall samples/s" in text
    assert re.search(r"static \d+,\d+|\(\d+,\d+\)", text) and "moved from rank 1 to rank 0 at step 16" in text


def test_the_demo_balance_phase_reports_both_runs(tmp_path):
    """demo_balance runs equal, then --balance, with rank 1 slowed, and reads their summaries (the runs
    stand in here: the whole demo runs them for real)."""
    from argparse import Namespace

    from shardfeed.tools.train.demo_balance import balance_phase

    cmds = []

    def run(cmd, tag):
        cmds.append(cmd)
        if "--balance" in cmd:
            return 0, "balance: step 10: batch sizes 32,32 -> 46,18 (...)\nsummary: 16 steps (395 samples/s), x"
        return 0, "summary: 16 steps, 1,000 samples in 6.3s (160 samples/s), x"
    line = balance_phase(Namespace(batch_size=32), lambda args, data, *extra: ["train", data, *extra], run,
                         "data", str(tmp_path))
    assert all("--slow-rank" in c and c[c.index("--slow-rank") + 1] == "1:3" for c in cmds) and len(cmds) == 2
    assert line.startswith("one rank 3x slower (simulated): 160 samples/s at equal sizes 32,32, 395 with --balance "
                           "(sizes 46,18): 2.47x")
    assert balance_phase(Namespace(batch_size=32), lambda *a: [], lambda cmd, tag: (1, ""), "d", "o") is None
