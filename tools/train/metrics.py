"""`shardfeed train --tensorboard DIR --prometheus-port N`: each rank's loader stats, exported.

Every rank exports its own loader's stats (loader/metrics_export.py) at each
--log-every step and at the run's last step: to ``DIR/rank<r>`` (TensorBoard
draws the ranks as runs on the same charts) and on port ``N + local rank``
(one scrape target per rank, each series labelled with its rank).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from shardfeed.loader.metrics_export import INSTALL, TensorBoardExporter

if TYPE_CHECKING:
    from shardfeed.loader.metrics_export import StatsExporter


def add_arguments(p) -> None:
    p.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="write each rank's loader stats (samples/s, data stall, time per stage, cache) as "
                        "TensorBoard scalars to DIR/rank<r> at every log step (needs the metrics extra)")
    p.add_argument("--prometheus-port", type=int, default=None, metavar="N",
                   help="serve each rank's loader stats for Prometheus at :N+<local rank>/metrics (needs the "
                        "metrics extra)")


def check(args) -> None:
    """Before any rank starts: the options make sense and the packages they need are installed."""
    port = args.prometheus_port
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"--prometheus-port {port} must be a port number, 1 to 65535 (rank r serves on N+r)")
    for flag, wanted, module, package in (("--tensorboard", args.tensorboard, "torch.utils.tensorboard", "tensorboard"),
                                          ("--prometheus-port", port, "prometheus_client", "prometheus_client")):
        if wanted is not None:
            try:
                importlib.import_module(module)
            except ImportError:
                raise ValueError(f"{flag} needs {package}, which is not installed: {INSTALL}") from None


class RankMetrics:
    """The exporters of one rank; ``step`` writes at log steps, ``close`` at the end."""

    def __init__(self, args, rank: int):
        self.every = args.log_every
        self.exporters: list[StatsExporter] = []
        self.last = None
        if args.tensorboard:

            self.exporters.append(TensorBoardExporter(os.path.join(args.tensorboard, f"rank{rank}")))
        if args.prometheus_port is not None:
            from shardfeed.loader.metrics_export import PrometheusExporter

            port = args.prometheus_port + int(os.environ.get("LOCAL_RANK", rank))
            try:
                self.exporters.append(PrometheusExporter(port))
            except OSError as e:
                raise ValueError(f"--prometheus-port: rank {rank}: {e}") from None

    def step(self, step: int, loader, force: bool = False, log=None) -> None:
        """At a log step, the loader's stats to every exporter and the step log's last window (loss,
        samples/s, stall) to TensorBoard as ``train/...``."""
        if self.exporters and (force or step % self.every == 0) and step != self.last:
            for e in self.exporters:
                e.log(loader, step)
            if log is not None and log.records and log.records[-1]["step"] == step:
                rec = log.records[-1]
                self.write(step, {"train/loss": rec["loss"], "train/samples_per_s": rec["samples_per_s"],
                                  "train/data_stall": rec["stall"]})
            self.last = step

    def write(self, step: int, values: dict) -> None:
        """The trainer's own scalars (loss, accuracy) to the TensorBoard exporter, if there is one."""
        for e in self.exporters:
            if isinstance(e, TensorBoardExporter):
                e.scalars(step, {k: v for k, v in values.items() if v is not None})

    def close(self, step: int, loader) -> None:
        """Write the last step (when it was no log step) and release files and ports."""
        self.step(step, loader, force=True)
        for e in self.exporters:
            e.close()
