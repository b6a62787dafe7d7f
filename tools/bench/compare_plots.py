"""PNG plots of `shardfeed bench compare` (matplotlib, Agg): throughput bars per
configuration, first-batch latency, shuffle quality and the trainer's
steps/s and data stall. shardfeed's rows are blue, the peers grey."""

from __future__ import annotations

import os

from shardfeed.tools.bench.results import figure, save


def _color(lib: str) -> str:
    return "C0" if lib.startswith("shardfeed") else "C7"


def throughput(report: dict, path: str) -> None:
    """One panel per (size, workers): sizes down, worker counts across."""
    from matplotlib.ticker import NullFormatter
    sizes = sorted({r["size"] for r in report["rows"]}, key=lambda s: int(s[:-3]))
    workers = sorted({r["workers"] for r in report["rows"]})
    most = max(sum(1 for r in report["rows"] if r["size"] == s and r["workers"] == w) for s in sizes for w in workers)
    _, fig, axes = figure(len(sizes), len(workers), figsize=(6.5 * len(workers), (0.3 * most + 1.2) * len(sizes)))
    for (i, s), (j, w) in ((a, b) for a in enumerate(sizes) for b in enumerate(workers)):
        ax = axes[i][j]
        rows = [r for r in report["rows"] if r["size"] == s and r["workers"] == w]
        labels = [f"{r['library']}, {'shuffled' if r['shuffle'] else 'stored'}" for r in rows]
        y = range(len(rows))
        colors = [_color(r["library"]) for r in rows]
        ax.barh([k + 0.2 for k in y], [r.get("steady") or 0 for r in rows], 0.4, color=colors, alpha=0.45)
        ax.barh([k - 0.2 for k in y], [r.get("whole") or 0 for r in rows], 0.4, color=colors)
        ax.set_yticks(list(y), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{s}, {w} workers")
        ax.set_xlabel("samples/s (log; dark: whole pass, pale: steady)")
        for k, r in enumerate(rows):
            if r["status"] != "ok":
                ax.text(0.01, k, r["status"].split(":")[0], fontsize=6, va="center", transform=ax.get_yaxis_transform())
    save(fig, path)


def first_batch(report: dict, path: str) -> None:
    size = "2KiB" if "2KiB" in report["counts"] else next(iter(report["counts"]))
    rows = [r for r in report["rows"] if r.get("first_batch_s") and r["size"] == size]
    _, fig, axes = figure(figsize=(7, 0.3 * len(rows) + 1.5))
    ax = axes[0][0]
    labels = [f"{r['library']}, {r['workers']}w, {'shuffled' if r['shuffle'] else 'stored'}" for r in rows]
    ax.barh(labels, [r["first_batch_s"] for r in rows], color=[_color(r["library"]) for r in rows])
    ax.axvline(0.1, color="red", linestyle="--", label="target 0.1 s")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("seconds from constructing the dataset to the first batch (fresh process)")
    ax.set_title(f"First batch, {size} samples")
    ax.legend(fontsize=8, loc="upper right")
    save(fig, path)


def quality(report: dict, path: str) -> None:
    q = report["quality"]
    rows = q["rows"]
    _, fig, ((a1, a2),) = figure(1, 2, figsize=(11, 0.35 * len(rows) + 2))
    labels = [f"{r['label']}\n{r['setting']}" for r in rows]
    a1.barh(labels, [r.get("classes_per_batch") or 0 for r in rows], color=[_color(r["library"]) for r in rows])
    a1.axvline(q["ideal"]["classes_per_batch"], color="green", linestyle="--",
               label=f"ideal {q['ideal']['classes_per_batch']:.1f}")
    a1.set_xlabel(f"distinct classes per batch of {report['batch_size']} (of {q['classes']})")
    a1.legend(fontsize=8, loc="lower right")
    a2.barh(labels, [r.get("displacement") or 0 for r in rows], color=[_color(r["library"]) for r in rows])
    a2.axvline(1 / 3, color="green", linestyle="--", label="ideal 1/3")
    a2.set_xlabel("mean |read - written position| / n")
    a2.legend(fontsize=8, loc="lower right")
    for ax in (a1, a2):
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
    a2.set_yticklabels([])
    fig.suptitle("Default shuffle on class-ordered data, one epoch")
    save(fig, path)


def train(report: dict, path: str) -> None:
    rows = report["train"]["rows"]
    _, fig, ((a1, a2),) = figure(1, 2, figsize=(10, 0.35 * len(rows) + 2))
    labels = [r["label"] for r in rows]
    colors = [_color(r["library"]) for r in rows]
    a1.barh(labels, [r.get("steps_per_s") or 0 for r in rows], color=colors)
    a1.set_xlabel("reference trainer steps/s (CPU, 1 thread)")
    a2.barh(labels, [100 * (r.get("stall") or 0) for r in rows], color=colors)
    a2.set_xlabel("data stall, % of step time")
    for ax in (a1, a2):
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
    a2.set_yticklabels([])
    fig.suptitle(f"Reference trainer fed by each loader, {report['train']['workers']} workers")
    save(fig, path)


def write_all(report: dict, out: str) -> list[str]:
    """The plots this report has data for; returns their paths."""
    made = []
    for name, fn, needs in (("bench_compare.png", throughput, "rows"), ("bench_compare_first_batch.png",
                            first_batch, "rows"), ("bench_compare_shuffle.png", quality, "quality"),
                            ("bench_compare_train.png", train, "train")):
        if report.get(needs):
            fn(report, os.path.join(out, name))
            made.append(os.path.join(out, name))
    return made
