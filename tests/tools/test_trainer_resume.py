"""The reference trainer's checkpoints: a run stopped at step k and resumed
ends with the uninterrupted run's weights; resumed by another number of
ranks, it trains on exactly the rest of the epoch. Real 2-rank gloo jobs
on real shards."""

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from shardfeed.formats import ShardWriter
from shardfeed.tools.train.synth import image_samples

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

EXE = str(Path(sys.executable).with_name("shardfeed"))
N, BATCH, STOP = 192, 16, 8  # 6 steps per epoch on 2 ranks; stop mid epoch 1 (its step 2)
DONE = 2 * (N // (2 * BATCH))


def _start(data, ck, *argv):
    return subprocess.Popen([EXE, "train", str(data), "--classes", "4", "--batch-size", str(BATCH), "--epochs", "2",
                             "--workers", "0", "--log-every", "5", "--checkpoint", str(ck), "--plot", "none",
                             *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(*procs):
    """stdout of each job; two independent jobs run at once (most of a tiny job is start-up)."""
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stdout[-2000:] + stderr[-3000:]
        outs.append(stdout)
    return outs


def _trace(folder):
    """[(step, epoch, keys)] of every rank's trace file in ``folder``."""
    rows = []
    for f in sorted(Path(folder).glob("rank*.txt")):
        for line in f.read_text().splitlines():
            step, epoch, keys = line.split(" ")
            rows.append((int(step), int(epoch), f.name, keys.split(",")))
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    with ShardWriter(str(tmp / "data"), max_shard_samples=64) as w:
        for s in image_samples(N, 4, 16, seed=0):
            w.write(s)
    full, part = _wait(_start(tmp / "data", tmp / "full.pt", "--ranks", "2"),
                       _start(tmp / "data", tmp / "part.pt", "--ranks", "2", "--max-steps", STOP,
                              "--trace", tmp / "t-part", "--audit"))
    shutil.copy(tmp / "part.pt", tmp / "other.pt")
    shutil.copytree(tmp / "part.pt.audit", tmp / "other.pt.audit")
    resumed, other = _wait(_start(tmp / "data", tmp / "part.pt", "--ranks", "2", "--resume"),
                           _start(tmp / "data", tmp / "other.pt", "--ranks", "1", "--resume",
                                  "--trace", tmp / "t-other", "--audit"))
    return tmp, {"full": full, "part": part, "resumed": resumed, "other": other}


def test_stopped_and_resumed_run_ends_with_the_uninterrupted_weights(runs):
    tmp, out = runs
    assert f"stopped after step {STOP}" in out["part"]
    assert f"resumed from {tmp / 'part.pt'} at step {STOP} (epoch 1, step {STOP - DONE // 2} of it" in out["resumed"]
    full = torch.load(tmp / "full.pt", weights_only=True)
    resumed = torch.load(tmp / "part.pt", weights_only=True)
    assert full["step"] == resumed["step"] == DONE
    assert full["loader"] == resumed["loader"]
    for name, value in full["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    momentum = [s["momentum_buffer"] for s in full["optimizer"]["state"].values()]
    assert all(torch.allclose(a["momentum_buffer"], b, atol=1e-6)
               for a, b in zip(resumed["optimizer"]["state"].values(), momentum))
    assert resumed["scheduler"]["last_epoch"] == full["scheduler"]["last_epoch"] == DONE


def test_resume_with_another_world_size_trains_on_the_rest_of_the_epoch_once(runs):
    tmp, out = runs
    before = [r for r in _trace(tmp / "t-part") if r[1] == 1]
    after = [r for r in _trace(tmp / "t-other") if r[1] == 1]
    assert {r[2] for r in after} == {"rank0-of-1.txt"}
    # 2 ranks took steps 7-8 of epoch 1 (2 x 2 x 16 samples); 1 rank takes the rest in batches of 16.
    k = STOP - DONE // 2
    assert len(before) == 2 * k and sum(len(r[3]) for r in before) == k * 2 * BATCH
    seen = Counter(k for r in before + after for k in r[3])
    assert len(seen) == N and set(seen.values()) == {1}
    assert len(after) == (N - k * 2 * BATCH) // BATCH
    assert "saved by 2 ranks, now 1" in out["other"]


def test_audit_records_of_a_run_and_its_resume_by_another_world_size_cover_both_epochs(runs):
    """--audit: the stopped 2-rank run's records (to step STOP) and the 1-rank resume's record
    (from STOP) merge into two whole epochs; without the resume's record epoch 1 is partial."""
    tmp, _ = runs
    names = sorted(p.name for p in (tmp / "other.pt.audit").iterdir())
    assert names == [f"steps-0000000-{STOP:07d}-rank{r}-of-2.json" for r in (0, 1)] + \
        [f"steps-{STOP:07d}-{STOP + (N - (STOP - DONE // 2) * 2 * BATCH) // BATCH:07d}-rank0-of-1.json"]
    out = subprocess.run([EXE, "audit", *sorted(map(str, (tmp / "other.pt.audit").iterdir()))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok: 2 epoch(s), 1 source(s), 3 records" in out.stdout, out.stdout + out.stderr
    assert re.search(rf"\n\s+1 .* {N} +{N} +0 +0 +0  finished", out.stdout), out.stdout


def test_checkpoint_is_replaced_atomically_and_says_its_step(runs):
    tmp, _ = runs
    import json

    info = json.loads((tmp / "full.pt.json").read_text())
    assert info["step"] == DONE and info["epoch"] == 2 and info["epoch_step"] == 0 and info["world_size"] == 2
    assert not list(tmp.glob("*.tmp"))  # no temporaries left beside the checkpoints
