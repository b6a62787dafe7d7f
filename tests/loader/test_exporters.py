"""The loader's stats where teams watch training: TensorBoard event files and a Prometheus endpoint.

Each test reads what a real exporter wrote (TensorBoard's own event reader,
an HTTP GET of prometheus_client's server); skipped where the optional
package (the ``metrics`` extra) is not installed.
"""

from __future__ import annotations

import socket
import urllib.request

import pytest

from shardfeed.loader import BatchSchedule, Loader, ShardDataset, Stage
from shardfeed.loader.exporters import loader_metrics


def test_loader_metrics_name_rates_stages_cache_and_batch_sizes(make_dataset):
    ds = ShardDataset(make_dataset(40, shard_samples=10), rank=1, world_size=2)
    with Loader(ds, BatchSchedule([Stage([6, 2])])) as loader:
        for _ in loader:
            pass
        got = loader_metrics(loader)
    assert got["loader/samples"] == 10 and got["loader/batches"] == 5
    assert got["loader/batch_size"] == 2 and got["loader/batch_size/rank0"] == 6
    for key in ("samples_per_s", "stall_fraction", "read_s", "decode_s", "collate_s", "bytes_read", "cache_hits",
                "bytes_fetched", "requests", "late_samples"):
        assert f"loader/{key}" in got, key


def test_tensorboard_event_files_hold_the_loader_scalars(make_dataset, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from shardfeed.loader.exporters import TensorBoardExporter

    tb = TensorBoardExporter(str(tmp_path / "tb"))
    with Loader(ShardDataset(make_dataset(40, shard_samples=10)), 8) as loader:
        for step, _ in enumerate(loader, 1):
            tb.export(loader, step, {"train/loss": 1.0 / step})
    tb.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"loader/samples_per_s", "loader/stall_fraction", "loader/decode_s", "train/loss"} <= set(tags)
    samples = events.Scalars("loader/samples")
    assert [e.step for e in samples] == [1, 2, 3, 4, 5] and [e.value for e in samples] == [8, 16, 24, 32, 40]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_serves_the_loader_gauges_by_rank(make_dataset):
    prometheus_client = pytest.importorskip("prometheus_client")
    from shardfeed.loader.exporters import PrometheusExporter

    port = _free_port()
    prom = PrometheusExporter(port=port, registry=prometheus_client.CollectorRegistry(), addr="127.0.0.1")
    try:
        ds = ShardDataset(make_dataset(40, shard_samples=10), rank=1, world_size=2)
        with Loader(ds, 4) as loader:
            for step, _ in enumerate(loader, 1):
                prom.export(loader, step)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        prom.close()
    assert 'shardfeed_loader_samples{rank="1"} 20.0' in text, text
    assert 'shardfeed_step{rank="1"} 5.0' in text and 'shardfeed_loader_stall_fraction{rank="1"}' in text
