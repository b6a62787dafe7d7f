"""Counters of a Loader: throughput, data stall, time per stage, errors."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class LoaderStats:
    samples: int = 0
    batches: int = 0
    wait_s: float = 0.0  # time the consumer spent inside next(): the data stall
    read_s: float = 0.0  # summed over workers
    decode_s: float = 0.0
    collate_s: float = 0.0
    transfer_s: float = 0.0  # main process: rebuilding batches from shared memory
    bytes_read: int = 0
    errors_skipped: int = 0
    started: float | None = field(default=None, repr=False)
    elapsed_s: float = 0.0

    def add_info(self, info: dict, skipped: int) -> None:
        self.read_s += info["read_s"]
        self.decode_s += info["decode_s"]
        self.collate_s += info["collate_s"]
        self.bytes_read += info["bytes"]
        self.errors_skipped += skipped

    def snapshot(self) -> dict:
        now = time.perf_counter()
        elapsed = self.elapsed_s + ((now - self.started) if self.started is not None else 0.0)
        return {
            "samples": self.samples, "batches": self.batches,
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
            "elapsed_s": elapsed, "wait_s": self.wait_s,
            "stall_fraction": self.wait_s / elapsed if elapsed > 0 else 0.0,
            "read_s": self.read_s, "decode_s": self.decode_s, "collate_s": self.collate_s,
            "transfer_s": self.transfer_s, "bytes_read": self.bytes_read, "errors_skipped": self.errors_skipped,
        }
