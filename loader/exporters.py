"""Exporters of a Loader's stats to where teams watch training: TensorBoard and Prometheus.

``loader_metrics(loader)`` flattens ``Loader.stats()`` into named numbers
(samples/s, data stall, per-stage read/decode/collate/transfer seconds, bytes
read, cache hits/misses/bytes fetched/requests/late samples, prefetched
samples, this rank's batch size); an ``Exporter`` writes such numbers at a
step. Call ``exporter.export(loader, step)`` every N steps, from one rank or
all (Prometheus labels each series with the rank):

    tb = TensorBoardExporter("runs/exp1")        # pip install tensorboard (shardfeed[metrics])
    prom = PrometheusExporter(port=9100)         # pip install prometheus_client: /metrics on :9100
    for step, batch in enumerate(loader, 1):
        ...
        if step % 50 == 0:
            tb.export(loader, step, {"train/loss": loss.item()})
            prom.export(loader, step)
    tb.close()

Neither package is imported until an exporter is made: training needs neither.
The values are the loader's totals since it was made (counters) and its
current rates, so a dashboard's rate() of a counter and the raw rates agree.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping

INSTALL = "pip install 'shardfeed[metrics]' (from a clone: pip install -e '.[metrics]')"

# Loader.stats()["total"] keys exported, under "loader/<key>"
KEYS = ("samples", "batches", "samples_per_s", "stall_fraction", "wait_s", "read_s", "decode_s", "collate_s",
        "transfer_s", "bytes_read", "errors_skipped", "cache_hits", "cache_misses", "bytes_fetched", "requests",
        "late_samples", "prefetch_samples", "prefetch_skipped", "evictions")


def loader_metrics(loader) -> dict[str, float]:
    """The loader's stats as ``{"loader/<key>": value}``, plus its batch size at this epoch
    (``loader/batch_size``: this rank's; with per-rank sizes also ``loader/batch_size/rank<r>``)."""
    total = loader.stats()["total"]
    out = {f"loader/{k}": float(total[k]) for k in KEYS if k in total and total[k] is not None}
    stage = loader.stage()
    rank = loader.dataset.rank
    if isinstance(stage.batch_size, tuple):
        out["loader/batch_size"] = float(stage.batch_size[rank])
        out.update({f"loader/batch_size/rank{r}": float(b) for r, b in enumerate(stage.batch_size)})
    else:
        out["loader/batch_size"] = float(stage.batch_size)
    return out


class Exporter(ABC):
    """Writes named numbers at a training step."""

    @abstractmethod
    def write(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def export(self, loader, step: int, extra: Mapping[str, float] | None = None) -> None:
        """``loader_metrics(loader)`` and ``extra`` (your loss, accuracy, ...) at ``step``."""
        self.write(step, {**loader_metrics(loader), **(extra or {})})

    def close(self) -> None:  # noqa: B027 - a default: an exporter that holds nothing needs no close
        """Flush and release what the exporter holds; safe to call twice."""


class TensorBoardExporter(Exporter):
    """Scalars in a TensorBoard log folder, through ``torch.utils.tensorboard.SummaryWriter``
    (which needs the ``tensorboard`` package); one tag per metric name."""

    def __init__(self, log_dir: str, **writer_kwargs):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(f"TensorBoard export needs the tensorboard package, which is not installed: "
                              f"{INSTALL}") from e
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=log_dir, **writer_kwargs)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


_registered: dict[tuple[int, str], object] = {}  # (registry id, metric name) -> Gauge: one per registry
_mu = threading.Lock()


class PrometheusExporter(Exporter):
    """Gauges ``<prefix>_<name>{rank="r"}`` (``loader/samples_per_s`` -> ``shardfeed_loader_samples_per_s``)
    and ``<prefix>_step``, in ``registry`` (prometheus_client's default one when None); ``port``
    starts prometheus_client's HTTP server there (``/metrics``) for Prometheus to scrape."""

    def __init__(self, port: int | None = None, registry=None, prefix: str = "shardfeed", rank: int | None = None,
                 addr: str = "0.0.0.0"):
        try:
            import prometheus_client
        except ImportError as e:
            raise ImportError(f"Prometheus export needs the prometheus_client package, which is not installed: "
                              f"{INSTALL}") from e
        self._pc = prometheus_client
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        self.prefix, self.rank = prefix, rank
        self.server = None
        if port is not None:
            self.server = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)

    def _gauge(self, name: str):
        metric = re.sub(r"[^a-zA-Z0-9_]", "_", f"{self.prefix}_{name}")
        key = (id(self.registry), metric)
        with _mu:
            gauge = _registered.get(key)
            if gauge is None:
                gauge = self._pc.Gauge(metric, f"shardfeed {name}", ["rank"], registry=self.registry)
                _registered[key] = gauge
        return gauge

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        rank = str(self.rank if self.rank is not None else 0)
        self._gauge("step").labels(rank=rank).set(step)
        for name, value in metrics.items():
            self._gauge(name).labels(rank=rank).set(value)

    def export(self, loader, step: int, extra: Mapping[str, float] | None = None) -> None:
        if self.rank is None:
            self.rank = loader.dataset.rank
        super().export(loader, step, extra)

    def close(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            if isinstance(server, tuple):  # prometheus_client >= 0.17 returns (server, thread)
                server[0].shutdown()
                server[0].server_close()
