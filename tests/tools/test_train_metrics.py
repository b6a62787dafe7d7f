"""`shardfeed train --tensorboard DIR --prometheus-port N` (tools/train/metrics.py): each rank's loader
stats at every log step and at the last step, read back from the event files and a real scrape."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset
from shardfeed.tools.train.metrics import RankMetrics, check
from shardfeed.tools.train.synth import image_samples

pytest.importorskip("tensorboard")
pytest.importorskip("prometheus_client")

EXE = str(Path(sys.executable).with_name("shardfeed"))


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"log_every": 3, "tensorboard": None, "prometheus_port": None, "ranks": 2, **kw})


def test_rank_metrics_write_at_log_steps_and_the_last_step(make_dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    root = make_dataset(80, shard_samples=20)
    port = _free_port()
    metrics = RankMetrics(_args(tensorboard=str(tmp_path / "tb"), prometheus_port=port), rank=0)
    with Loader(ShardDataset(root, seed=1), batch_size=8) as loader:
        step = 0
        for step, _ in enumerate(loader, 1):  # 10 steps
            metrics.step(step, loader)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'shardfeed_samples_total{rank="0"} 72.0' in text  # the log at step 9
        metrics.close(step, loader)
        samples = loader.stats()["samples"]
    got = _scalars(tmp_path / "tb" / "rank0")
    assert [s for s, _ in got["shardfeed_total/samples"]] == [3, 6, 9, 10]
    assert got["shardfeed_total/samples"][-1] == (10, samples) and samples == 80
    assert got["shardfeed/batch_size"] == [(s, 8.0) for s in (3, 6, 9, 10)]
    with pytest.raises(OSError):  # close() gave the port back
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)


def test_rank_metrics_on_a_taken_port_names_the_rank_and_port(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(ValueError, match=rf"--prometheus-port: rank 1: PrometheusExporter cannot serve metrics "
                                             rf"on 0\.0\.0\.0:{taken} .*pick a free port"):
            RankMetrics(_args(prometheus_port=taken - 1), rank=1)


def test_check_refuses_a_bad_port_and_names_the_missing_extra(monkeypatch):
    with pytest.raises(ValueError, match="--prometheus-port 70000 must be a port number"):
        check(_args(prometheus_port=70000))
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ValueError, match=r"--prometheus-port needs prometheus_client, which is not installed: "
                                         r"pip install 'shardfeed\[metrics\]'"):
        check(_args(prometheus_port=9100))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ValueError, match=r"--tensorboard needs tensorboard, which is not installed: "
                                         r"pip install 'shardfeed\[metrics\]'"):
        check(_args(tensorboard="runs"))
    check(_args())  # neither flag: nothing is needed


@pytest.mark.slow
@pytest.mark.distributed
def test_train_tensorboard_writes_each_ranks_stats(tmp_path):
    """Two ranks with batches of 12 and 4: each rank's folder holds its own batch size and share of
    the samples, at every --log-every step and the last one."""
    with ShardWriter(str(tmp_path / "train"), max_shard_samples=50) as w:
        for s in image_samples(96, 4, 16, seed=0):
            w.write(s)
    out = subprocess.run([EXE, "train", str(tmp_path / "train"), "--ranks", "2", "--epochs", "2", "--batch-size",
                          "12,4", "--workers", "0", "--log-every", "4", "--plot", "none",
                          "--tensorboard", str(tmp_path / "tb")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for rank, batch in ((0, 12), (1, 4)):
        got = _scalars(tmp_path / "tb" / f"rank{rank}")
        steps = [4, 8, 12]  # 96 samples, global batch 16: 6 steps an epoch
        assert got["shardfeed/batch_size"] == [(s, batch) for s in steps]
        assert got["shardfeed_total/samples"] == [(s, s * batch) for s in steps]
        assert [s for s, _ in got["shardfeed/samples_per_s"]] == steps
        assert all(0 <= v <= 1 for _, v in got["shardfeed/stall_fraction"])


def test_train_options_carry_the_flags_and_check_them_before_any_rank_starts():
    from shardfeed.tools.train.options import add_arguments, check_options

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["data", "--tensorboard", "runs", "--prometheus-port", "9100"])
    assert (args.tensorboard, args.prometheus_port) == ("runs", 9100)
    check_options(args)
    args.prometheus_port = 0
    with pytest.raises(ValueError, match=r"--prometheus-port 0 must be a port number, 1 to 65535"):
        check_options(args)
