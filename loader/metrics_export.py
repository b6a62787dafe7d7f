"""Exporters of a Loader's stats to where training is watched: TensorBoard and Prometheus.

    from shardfeed.loader.metrics_export import TensorBoardExporter

    with TensorBoardExporter("runs/rank0") as exporter:        # or PrometheusExporter(port=9108)
        for step, batch in enumerate(loader, 1):
            ...                                             # the training step
            if step % 50 == 0:
                exporter.log(loader, step)

Each ``log(loader, step)`` reads ``loader.stats()`` once and writes three kinds of values, all of this
rank (``rank`` label in Prometheus; one TensorBoard folder per rank):

- over the window since the previous ``log()`` (the first: since the Loader started), ``WINDOW``:
  samples/s, data stall, and the worker time per batch of each stage (read, decode, which includes the
  transform, collate) and of the main process's transfer; a ``log()`` with no batch delivered since the
  previous one writes none of them;
- the Loader's lifetime counters, every key of ``stats()["total"]`` except its two rates (samples,
  batches, seconds per stage, bytes read, errors skipped, and the node-local cache's hits, misses, bytes
  fetched, requests, late samples, prefetch counts: zeros when the data is local);
- ``GAUGES``: this rank's batch size in the current stage, and the epoch.

TensorBoard tags: ``shardfeed/NAME`` for the window values and gauges, ``shardfeed_total/NAME`` for the
counters. Prometheus: ``shardfeed_NAME`` gauges and ``shardfeed_NAME_total`` counters, ``_s`` spelled
``_seconds``; a scrape sees the values of the last ``log()``.

tensorboard and prometheus_client are the ``metrics`` extra, imported only by the exporter that uses
them; without them the exporter's constructor raises ImportError naming the install command.
"""

from __future__ import annotations

import importlib
import os
import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardfeed.loader.loader import Loader

INSTALL = "pip install 'shardfeed[metrics]' (from a clone: pip install -e '.[metrics]')"

# the window's values: name -> (counter divided, by counter)
WINDOW = {
    "samples_per_s": ("samples", "elapsed_s"),
    "stall_fraction": ("wait_s", "elapsed_s"),
    "read_s_per_batch": ("read_s", "batches"),
    "decode_s_per_batch": ("decode_s", "batches"),  # the transform runs inside the decode stage
    "collate_s_per_batch": ("collate_s", "batches"),
    "transfer_s_per_batch": ("transfer_s", "batches"),
}
GAUGES = ("batch_size", "epoch")
_RATES = ("samples_per_s", "stall_fraction")  # stats()["total"]'s derived values, not counters


class Reading:
    """What one ``log()`` writes: ``window`` (empty when no batch came since the previous log),
    ``totals`` (stats()["total"]'s counters) and ``gauges``, each a dict name -> float."""

    __slots__ = ("window", "totals", "gauges")

    def __init__(self, window: dict, totals: dict, gauges: dict):
        self.window, self.totals, self.gauges = window, totals, gauges

    def __repr__(self) -> str:
        return f"Reading(window={self.window!r}, totals={self.totals!r}, gauges={self.gauges!r})"


class StatsExporter(ABC):
    """Sends a Loader's stats somewhere at each ``log(loader, step)``.

    A subclass implements ``write(step, rank, reading)`` and, if it holds a
    resource, ``close()`` (safe to call twice). The window of each log is
    measured from the previous log of the same rank; a Loader whose counters
    went back (another Loader) starts the window at zero.
    """

    def __init__(self):
        self._before: dict[int, dict] = {}  # rank -> its counters at its previous log

    def log(self, loader: Loader, step: int) -> Reading:
        """Write ``loader``'s stats at ``step`` (the training step: TensorBoard's x axis)."""
        feed = loader.feed
        reading = self.read(loader.stats(), batch_size=feed.batch_size(), epoch=loader.epoch, rank=feed.rank)
        self.write(step, feed.rank, reading)
        return reading

    def read(self, stats: dict, batch_size: int, epoch: int, rank: int = 0) -> Reading:
        """The Reading of a ``stats()`` snapshot of ``rank``'s Loader; that rank's next window starts at it."""
        totals = {k: float(v) for k, v in stats["total"].items() if k not in _RATES}
        before = self._before.get(rank)
        if before is None or any(totals[k] < before[k] for k in ("samples", "batches", "elapsed_s")):
            before = dict.fromkeys(totals, 0.0)
        self._before[rank] = totals
        window = {}
        if totals["batches"] > before["batches"] and totals["elapsed_s"] > before["elapsed_s"]:
            window = {name: (totals[num] - before[num]) / (totals[den] - before[den])
                      for name, (num, den) in WINDOW.items()}
        return Reading(window, totals, {"batch_size": float(batch_size), "epoch": float(epoch)})

    @abstractmethod
    def write(self, step: int, rank: int, reading: Reading) -> None:
        """Send one reading."""

    def close(self) -> None:
        """Release what the exporter holds (files, a server); safe to call twice. A subclass calls this too."""
        self._before.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _require(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = {"torch.utils.tensorboard": "tensorboard"}.get(module, module)
        raise ImportError(f"{what} needs {package}, which is not installed: {INSTALL}") from e


class TensorBoardExporter(StatsExporter):
    """Scalars in an event file under ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``),
    flushed at each log so a running TensorBoard shows them at once. One folder per rank
    (``runs/rank0``, ``runs/rank1``): TensorBoard draws the ranks as runs on the same charts."""

    def __init__(self, log_dir: str):
        super().__init__()
        tb = _require("torch.utils.tensorboard", "TensorBoardExporter")
        self.log_dir = os.fspath(log_dir)
        self._writer = tb.SummaryWriter(log_dir=self.log_dir)

    def write(self, step: int, rank: int, reading: Reading) -> None:
        if self._writer is None:
            raise RuntimeError(f"TensorBoardExporter({self.log_dir!r}) is closed")
        add = self._writer.add_scalar
        for name, value in (*reading.window.items(), *reading.gauges.items()):
            add(f"shardfeed/{name}", value, step)
        for name, value in reading.totals.items():
            add(f"shardfeed_total/{name}", value, step)
        self._writer.flush()

    def scalars(self, step: int, values: dict) -> None:
        """The caller's own numbers beside the loader's (a trainer's ``train/loss``, ``eval/accuracy``)."""
        if self._writer is None:
            raise RuntimeError(f"TensorBoardExporter({self.log_dir!r}) is closed")
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        super().close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def prometheus_name(name: str, counter: bool = False) -> str:
    """``read_s_per_batch`` -> ``shardfeed_read_seconds_per_batch``; a counter ends in ``_total``."""
    name = re.sub(r"_s(?=_|$)", "_seconds", name).replace("_per_seconds", "_per_second")
    return f"shardfeed_{name}" + ("_total" if counter else "")


class PrometheusExporter(StatsExporter):
    """Gauges and counters with a ``rank`` label in a ``prometheus_client`` registry
    (``self.registry``, its own unless one is given). ``port``: also serve them over
    HTTP at ``addr:port/metrics`` (0: a free port, then ``self.port`` says which);
    None: serve nothing (``prometheus_client.generate_latest(exporter.registry)``
    renders them, or the registry is passed to a server the program already runs)."""

    def __init__(self, port: int | None = None, addr: str = "0.0.0.0", registry=None):
        super().__init__()
        prom = _require("prometheus_client", "PrometheusExporter")
        self._latest: dict[int, Reading] = {}  # rank -> its last reading
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.registry.register(_Collector(self._latest))
        self.port, self._server = None, None
        if port is not None:
            try:
                self._server, _thread = prom.start_http_server(port, addr=addr, registry=self.registry)
            except OSError as e:
                raise OSError(f"PrometheusExporter cannot serve metrics on {addr}:{port} ({e}); pick a free port, "
                              "or 0 for any") from e
            self.port = self._server.server_address[1]

    def write(self, step: int, rank: int, reading: Reading) -> None:
        window = {**self._latest[rank].window, **reading.window} if rank in self._latest else reading.window
        self._latest[rank] = Reading(window, reading.totals, reading.gauges)  # the gauges keep their last window

    def close(self) -> None:
        super().close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Collector:
    """What a scrape of the registry sees: the last reading of each rank (a custom collector, so
    the values are stats()'s own, not increments kept in step with it)."""

    def __init__(self, latest: dict):
        self.latest = latest

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        latest = dict(self.latest)
        names = {}
        for r in latest.values():
            for kind, values in (("gauge", r.window), ("gauge", r.gauges), ("counter", r.totals)):
                names.update(dict.fromkeys((kind, n) for n in values))
        for kind, name in names:
            counter = kind == "counter"
            family = (CounterMetricFamily if counter else GaugeMetricFamily)(
                prometheus_name(name, counter), _HELP.get(name, f"Loader.stats()['total'][{name!r}]"),
                labels=["rank"])
            for rank, r in sorted(latest.items()):
                values = r.totals if counter else {**r.window, **r.gauges}
                if name in values:
                    family.add_metric([str(rank)], values[name])
            yield family


_HELP = {
    "samples_per_s": "samples delivered per second, over the window between the last two logs",
    "stall_fraction": "share of the window the consumer waited for batches (data stall)",
    "read_s_per_batch": "worker seconds reading shards per batch, over the window",
    "decode_s_per_batch": "worker seconds decoding and transforming per batch, over the window",
    "collate_s_per_batch": "worker seconds collating per batch, over the window",
    "transfer_s_per_batch": "main-process seconds taking a batch from shared memory, over the window",
    "batch_size": "this rank's batch size in the current stage",
    "epoch": "the epoch the loader is reading",
}
