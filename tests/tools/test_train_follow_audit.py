"""`shardfeed train --follow --audit`: the records of a followed stream pass `shardfeed audit`.

Regression: train refused --audit with --follow although the Loader's audit
recorder covers followed streams (and the README says so).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))


def _run(*argv, timeout=300):
    return subprocess.run([EXE, *map(str, argv)], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.distributed
def test_follow_audit_records_cover_a_stream_that_ended(tmp_path):
    live = tmp_path / "live"
    w = ShardWriter(str(live), append=True, max_shard_samples=30)  # a growing dataset: 4 commits, then its end
    for s in image_samples(100, 4, 16, seed=0):
        w.write(s)
    w.end_stream()
    ck = tmp_path / "ck.pt"
    out = _run("train", live, "--follow", "--audit", "--checkpoint", ck, "--checkpoint-every", "3", "--ranks", "2",
               "--batch-size", "8", "--plot", "none", "--classes", "4", "--idle-timeout", "60")
    assert out.returncode == 0, out.stderr[-3000:]
    records = sorted((tmp_path / "ck.pt.audit").iterdir())
    # 100 samples in global batches of 16: 6 full steps and a last short one
    assert [r.name for r in records] == [f"steps-0000000-0000007-rank{r}-of-2.json" for r in (0, 1)]
    both = _run("audit", *records, timeout=60)
    assert both.returncode == 0, both.stdout + both.stderr
    assert "stream ended" in both.stdout and "nothing missed" in both.stdout, both.stdout
    assert "   100        100       0        0      0" in both.stdout, both.stdout
    alone = _run("audit", records[0], timeout=60)  # one rank's record misses the other's half of the stream
    assert alone.returncode == 1, alone.stdout + alone.stderr
