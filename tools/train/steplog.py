"""What the trainer reports: a line every N steps, a summary, a PNG plot.

Every rank counts its own window (samples, data stall, cache hits/misses,
bytes fetched); at a log step one all_reduce adds them up and rank 0 prints

    step 40 (epoch 1): loss 1.234, 1,850 samples/s, data stall 3.1%, cache hits 92% (12/13 shards), fetched 4.1 MB

The records (one per log line) travel in the checkpoint, so the plot of a
resumed run continues the first one's curves.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from shardfeed.tools.size_options import human_bytes as format_bytes


def cache_counters(stats: dict) -> tuple[float, float, float]:
    """(hits, misses, bytes fetched) of the loader's node-local cache over its
    life (``Loader.stats()["total"]``, see loader/stats.py); zeros when the
    loader reads local files. Hits and misses count shard opens by readers;
    bytes fetched include the prefetcher's."""
    t = stats["total"]
    return float(t["cache_hits"]), float(t["cache_misses"]), float(t["bytes_fetched"])


# The run's start-up (workers starting, jitted code loading, the first shards fetched) stalls far more than
# its steady state (the demo: 80% over its first 10 steps, 0.4-3% after): the summary gives the two apart. A
# log window counts as start-up when it begins before this many steps of this process.
STARTUP_STEPS = 10

# what the summary says of the prefetcher: samples it brought, shards it gave up for room, samples readers
# fetched themselves (the prefetcher was late); Loader.stats()["total"] keys
AHEAD = ("prefetch_samples", "prefetch_skipped", "late_samples")


class StepLog:
    def __init__(self, every: int, rank: int, history: list | None = None, out=print):
        self.every, self.rank, self.out = every, rank, out
        self.records: list[dict] = list(history or [])
        self._losses: list[float] = []
        self._mark = None
        self.started = time.perf_counter()
        self.totals = {"samples": 0.0, "wait_s": 0.0, "wall_s": 0.0, "hits": 0.0, "misses": 0.0, "fetched": 0.0,
                       **dict.fromkeys(AHEAD, 0.0)}
        self.startup = {"steps": 0, "wait_s": 0.0, "wall_s": 0.0}  # the windows that began in the first steps
        self._steps = 0  # steps this process took (a resumed run starts up again)
        self.run = 0  # which run of the job wrote a record: one more at each resume (the plot marks it)

    def start(self, loader) -> None:
        """Begin a window at the loader's current counters (after a resume, too)."""
        self._mark = (time.perf_counter(), self._counts(loader))
        self._losses.clear()

    @staticmethod
    def _counts(loader) -> list[float]:
        s = loader.stats()
        return [float(s["samples"]), float(s["wait_s"]), *cache_counters(s),
                *(float(s["total"].get(k, 0)) for k in AHEAD)]

    def step(self, step: int, epoch: int, loss, loader, device, force: bool = False) -> None:
        """Called by every rank after each step with the global mean loss (a
        tensor: read only at log steps, so a GPU step never waits for it);
        collective at log steps and forced calls (every rank reaches them at
        the same step). ``loss=None``: no step, only close the window."""
        if loss is not None:
            self._losses.append(loss)
            self._steps += 1
        if not force and step % self.every:
            return
        if self._mark is None or not self._losses:
            return
        t0, before = self._mark
        now, counts = time.perf_counter(), self._counts(loader)
        delta = torch.tensor([c - b for c, b in zip(counts, before)], dtype=torch.float64, device=device)
        if dist.is_initialized():
            dist.all_reduce(delta)
        samples, wait, hits, misses, fetched, *ahead = delta.tolist()
        world = dist.get_world_size() if dist.is_initialized() else 1
        dt = max(now - t0, 1e-9)
        rec = {"step": step, "epoch": epoch, "loss": float(torch.stack(self._losses).mean()),
               "samples_per_s": samples / dt, "stall": wait / world / dt,
               "cache_hit": hits / (hits + misses) if hits + misses else None, "fetched": fetched, "run": self.run}
        self.records.append(rec)
        for k, v in (("samples", samples), ("wait_s", wait / world), ("wall_s", dt), ("hits", hits),
                     ("misses", misses), ("fetched", fetched), *zip(AHEAD, ahead)):
            self.totals[k] += v
        if self._steps - len(self._losses) < STARTUP_STEPS:
            self.startup["steps"] = self._steps
            self.startup["wait_s"] += wait / world
            self.startup["wall_s"] += dt
        if self.rank == 0:
            self.out(self.line(rec), flush=True)
        self._mark = (now, counts)
        self._losses.clear()

    @staticmethod
    def line(rec: dict) -> str:
        cache = "cache -" if rec["cache_hit"] is None else f"cache hits {rec['cache_hit']:.0%}"
        return (f"step {rec['step']} (epoch {rec['epoch']}): loss {rec['loss']:.3f}, "
                f"{rec['samples_per_s']:,.0f} samples/s, data stall {rec['stall']:.1%}, {cache}, "
                f"fetched {format_bytes(int(rec['fetched']))}")

    def resumed(self, history: list) -> None:
        """Continue the records of the run(s) a checkpoint saved; what follows is the next run."""
        self.records = list(history)
        self.run = max((r.get("run", 0) for r in self.records), default=-1) + 1

    def accuracy(self, value: float, held_out: bool) -> None:
        """The evaluation after an epoch, on that epoch's last record (the plot's accuracy panel)."""
        if self.records:
            self.records[-1].update(accuracy=value, held_out=held_out)

    def summary(self, steps: int) -> str:
        t = self.totals
        wall = max(t["wall_s"], 1e-9)
        lookups = t["hits"] + t["misses"]
        cache = (f"cache hit rate {t['hits'] / lookups:.0%} ({int(t['hits'])}/{int(lookups)}), fetched "
                 f"{format_bytes(int(t['fetched']))}" if lookups else "no cache (local files)")
        if lookups and (t["prefetch_samples"] or t["prefetch_skipped"] or t["late_samples"]):
            cache += (f" (prefetched {int(t['prefetch_samples']):,} samples, {int(t['prefetch_skipped']):,} shards "
                      f"skipped for room, {int(t['late_samples']):,} samples fetched late by readers)")
        last = self.records[-1]["loss"] if self.records else float("nan")
        return (f"summary: {steps} steps, {int(t['samples']):,} samples in {wall:.1f}s of training steps "
                f"({t['samples'] / wall:,.0f} samples/s), data stall {t['wait_s'] / wall:.1%}{self._stall_parts()}, "
                f"{cache}, last loss {last:.3f}")

    def _stall_parts(self) -> str:
        """The stall of the start-up and of the steps after it, when the run had both."""
        up, t = self.startup, self.totals
        steady_s = t["wall_s"] - up["wall_s"]
        if not up["steps"] or steady_s <= 0:
            return ""
        return (f" (start-up, the first {up['steps']} steps: {up['wait_s'] / max(up['wall_s'], 1e-9):.1%} of "
                f"{up['wall_s']:.1f}s; after it: {(t['wait_s'] - up['wait_s']) / steady_s:.1%})")

    def plot(self, path: str) -> str:
        """Loss, samples/s, data stall and (once evaluated) accuracy over steps, with the points
        where a stopped run was resumed, as a PNG at ``path``
        (MissingExtra when matplotlib, of the ``bench`` extra, is not installed)."""
        from shardfeed.tools.extras import require

        matplotlib = require("matplotlib", "the training plot (--plot)")
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = panels(self.records)
        fig, axes = plt.subplots(len(rows), 1, figsize=(7, 2.3 * len(rows)), sharex=True)
        for ax, (key, label, scale) in zip(axes, rows):
            have = [r for r in self.records if r.get(key) is not None]
            ax.plot([r["step"] for r in have], [r[key] * scale for r in have], marker=".", linewidth=1)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        for r0, r1 in zip(self.records, self.records[1:]):
            if r1["epoch"] != r0["epoch"]:
                for ax in axes:
                    ax.axvline(r0["step"], color="grey", alpha=0.3, linewidth=0.8)
        for s in resume_steps(self.records):
            for ax in axes:
                ax.axvline(s, color="tab:red", linestyle="--", linewidth=1)
        axes[-1].set_xlabel("step (grey: epoch boundaries; red dashes: resumed from a checkpoint)")
        fig.suptitle("shardfeed train")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return path


def panels(records: list) -> list[tuple[str, str, float]]:
    """(record key, label, scale) of each plot panel: accuracy once an evaluation recorded one."""
    rows = [("loss", "loss", 1), ("samples_per_s", "samples/s", 1), ("stall", "data stall %", 100)]
    acc = [r for r in records if r.get("accuracy") is not None]
    if acc:
        rows.append(("accuracy", "held-out accuracy %" if acc[-1].get("held_out") else "training accuracy %", 100))
    return rows


def resume_steps(records: list) -> list[int]:
    """The steps a stopped run's records end at, where a resumed run went on (its checkpoint's step)."""
    return [r0["step"] for r0, r1 in zip(records, records[1:]) if r1.get("run", 0) != r0.get("run", 0)]


def compare_plot(path: str, runs: dict[str, list], title: str = "shardfeed train") -> str:
    """Loss and accuracy over steps of several runs' records on one figure (the demo's global shuffle
    against ``--shuffle none``), as a PNG at ``path`` (MissingExtra without matplotlib)."""
    from shardfeed.tools.extras import require

    matplotlib = require("matplotlib", "the comparison plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for name, records in runs.items():
        axes[0].plot([r["step"] for r in records], [r["loss"] for r in records], marker=".", linewidth=1, label=name)
        acc = [r for r in records if r.get("accuracy") is not None]
        axes[1].plot([r["step"] for r in acc], [100 * r["accuracy"] for r in acc], marker="o", linewidth=1,
                     label=name)
        for s in resume_steps(records):
            axes[0].axvline(s, color="tab:red", linestyle="--", linewidth=1)
    axes[0].set_ylabel("loss")
    axes[1].set_ylabel("accuracy % (each epoch)")
    axes[1].set_xlabel("step (red dashes: resumed from a checkpoint)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
