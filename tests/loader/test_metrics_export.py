"""loader/metrics_export.py: a Loader's stats written to TensorBoard and Prometheus, read back from the
event file and from a real scrape of the exposition server, and compared with ``Loader.stats()``."""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request

import pytest

from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.metrics_export import (
    GAUGES,
    WINDOW,
    PrometheusExporter,
    TensorBoardExporter,
    prometheus_name,
)

pytest.importorskip("tensorboard")  # the metrics extra (in the test extra)
pytest.importorskip("prometheus_client")

RATES = ("samples_per_s", "stall_fraction")


def _loader(root, rank=1):
    # rank 1 of 2 with per-rank batch sizes 8 and 4: the exported batch size is this rank's own
    return Loader(ShardDataset(root, rank=rank, world_size=2, seed=3), batch_size=[8, 4])


def _epochs(loader, exporter, epochs: int) -> list[tuple[int, dict]]:
    """Read whole epochs, log after each (the iteration is over, so stats() stands still), and return
    (step, stats) of every log, with a last log after no further batch."""
    got, step = [], 0
    for _ in range(epochs):
        step += sum(1 for _ in loader)
        exporter.log(loader, step)
        got.append((step, loader.stats()))
    exporter.log(loader, step + 1)  # nothing read since the last log: no window values
    got.append((step + 1, loader.stats()))
    return got


def _expected_window(now: dict, before: dict | None) -> dict:
    b = before or dict.fromkeys(now, 0.0)
    return {name: (now[num] - b[num]) / (now[den] - b[den]) for name, (num, den) in WINDOW.items()}


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_event_file_holds_stats_at_each_logged_step(make_dataset, tmp_path):
    root = make_dataset(120, shard_samples=30)
    with _loader(root) as loader, TensorBoardExporter(tmp_path / "rank1") as exporter:
        logs = _epochs(loader, exporter, 2)
        # flushed at each log: a TensorBoard watching the run sees every step before the writer closes
        live = _scalars(tmp_path / "rank1")
    got = _scalars(tmp_path / "rank1")
    assert live == got
    counters = [k for k in logs[0][1]["total"] if k not in RATES]
    assert set(got) == ({f"shardfeed/{n}" for n in (*WINDOW, *GAUGES)}
                        | {f"shardfeed_total/{k}" for k in counters})
    steps = [s for s, _ in logs]
    assert steps == [10, 20, 21]  # 120 samples a global batch of 12: 10 steps an epoch on each rank
    for k in counters:
        assert got[f"shardfeed_total/{k}"] == [(s, pytest.approx(float(st["total"][k]), rel=1e-6)) for s, st in logs]
    assert got["shardfeed_total/samples"][-1][1] == 80  # rank 1's share: 4 of every 12 samples, 2 epochs
    assert got["shardfeed/batch_size"] == [(s, 4.0) for s in steps]
    assert got["shardfeed/epoch"] == [(10, 1.0), (20, 2.0), (21, 2.0)]  # the epoch the loader reads next
    want = [_expected_window(logs[0][1]["total"], None), _expected_window(logs[1][1]["total"], logs[0][1]["total"])]
    for name in WINDOW:  # the log with no batch since the previous one wrote no window value
        assert got[f"shardfeed/{name}"] == [(10, pytest.approx(want[0][name], rel=1e-5)),
                                            (20, pytest.approx(want[1][name], rel=1e-5))], name
    assert 0 < got["shardfeed/stall_fraction"][0][1] <= 1 and got["shardfeed/read_s_per_batch"][0][1] > 0


def _scrape(port: int) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, s.labels["rank"]): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name.startswith("shardfeed_")}


def test_prometheus_scrape_serves_each_ranks_last_log(make_dataset):
    """Two ranks' loaders log into one exporter in turns: a scrape over loopback HTTP sees each rank's
    own counters, window gauges (measured from that rank's previous log) and batch size under its rank
    label; close() stops the server."""
    root = make_dataset(120, shard_samples=30)
    exporter = PrometheusExporter(port=0, addr="127.0.0.1")
    try:
        with _loader(root, rank=0) as r0, _loader(root, rank=1) as r1:
            first, step = {}, 0
            for epoch in range(2):
                for rank, loader in ((0, r0), (1, r1)):
                    n = sum(1 for _ in loader)
                    exporter.log(loader, step + n)
                    if epoch == 0:
                        first[rank] = loader.stats()["total"]
                step += n
            stats = {0: r0.stats()["total"], 1: r1.stats()["total"]}
        got = _scrape(exporter.port)
    finally:
        exporter.close()
    for rank in (0, 1):
        label = str(rank)
        for k, v in stats[rank].items():
            if k not in RATES:
                assert got[(prometheus_name(k, counter=True), label)] == pytest.approx(v), k
        for name, value in _expected_window(stats[rank], first[rank]).items():
            assert got[(prometheus_name(name), label)] == pytest.approx(value), name
    assert got[("shardfeed_samples_total", "0")] == 160 and got[("shardfeed_samples_total", "1")] == 80
    assert (got[("shardfeed_batch_size", "0")], got[("shardfeed_batch_size", "1")]) == (8, 4)
    assert ("shardfeed_stall_fraction", "1") in got and ("shardfeed_wait_seconds_total", "1") in got
    with pytest.raises(urllib.error.URLError):
        _scrape(exporter.port)


def test_prometheus_registry_without_a_server_and_a_taken_port(make_dataset):
    from prometheus_client import generate_latest

    root = make_dataset(40, shard_samples=20)
    exporter = PrometheusExporter()
    assert exporter.port is None
    with _loader(root) as loader:
        sum(1 for _ in loader)
        exporter.log(loader, 1)
        samples = loader.stats()["samples"]
    text = generate_latest(exporter.registry).decode()
    assert f'shardfeed_samples_total{{rank="1"}} {float(samples)}' in text
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=rf"cannot serve metrics on 127\.0\.0\.1:{port} .*pick a free port"):
            PrometheusExporter(port=port, addr="127.0.0.1")


def test_prometheus_names_follow_its_conventions():
    assert prometheus_name("read_s_per_batch") == "shardfeed_read_seconds_per_batch"
    assert prometheus_name("samples_per_s") == "shardfeed_samples_per_second"
    assert prometheus_name("wait_s", counter=True) == "shardfeed_wait_seconds_total"
    assert prometheus_name("bytes_fetched", counter=True) == "shardfeed_bytes_fetched_total"
    assert prometheus_name("samples", counter=True) == "shardfeed_samples_total"


@pytest.mark.parametrize("blocked, exporter", [("torch.utils.tensorboard", TensorBoardExporter),
                                               ("prometheus_client", PrometheusExporter)])
def test_a_missing_extra_names_the_install_command(monkeypatch, tmp_path, blocked, exporter):
    monkeypatch.setitem(sys.modules, blocked, None)  # import raises ImportError, as where it is not installed
    package = "tensorboard" if "tensorboard" in blocked else "prometheus_client"
    with pytest.raises(ImportError, match=rf"{exporter.__name__} needs {package}, which is not installed: pip install "
                                          r"'shardfeed\[metrics\]'"):
        exporter(tmp_path) if exporter is TensorBoardExporter else exporter()


def test_the_window_of_a_new_loader_starts_at_zero(make_dataset):
    """A rank that logs a fresh Loader (counters lower than at its previous log) gets the new Loader's
    own rates since its start, not a negative window."""
    root = make_dataset(40, shard_samples=20)
    exporter = PrometheusExporter()
    for epochs in (2, 1):
        with _loader(root) as loader:
            for _ in range(epochs):
                sum(1 for _ in loader)
            reading = exporter.log(loader, 1)
            total = loader.stats()["total"]
    assert reading.window == pytest.approx(_expected_window(total, None))
    assert reading.window["samples_per_s"] > 0 and reading.totals["samples"] == total["samples"] > 0
