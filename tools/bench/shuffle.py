"""`shardfeed bench shuffle`: shuffle quality against I/O cost, and plan scale.

Quality: a dataset written in class order (the worst case: 100 classes,
100,000 samples, 50 shards of 2,000, batch 256, as in PEERS.md), each order
measured by shardfeed.shuffling.plan_quality on 1 and 8 ranks, mean of two
seeds. A sweep of window and buffer sizes gives the plot of quality
against shards resident per rank. Locality: the share of samples read from
a node that does not own their shard, plain round-robin dealing against
locality-aware dealing (Yang & Cong), 4 nodes x 4 ranks. Scale: building a
`global` plan over 100,000 shards of 10,000 samples (10**9 samples) and
generating 10 million positions.

Writes shuffle_quality.md, shuffle_quality.png and shuffle_scale.md to --out.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import tracemalloc

import numpy as np

from shardfeed.shuffling import Permutation, Topology, make_plan
from shardfeed.shuffling.plan_quality import perfect_entropy, plan_quality
from shardfeed.tools.text import show_progress

NUM_CLASSES, NUM_SHARDS, SHARD_SAMPLES, BATCH = 100, 50, 2_000, 256
SCALE_SHARDS, SCALE_SHARD_SAMPLES, SCALE_POSITIONS = 100_000, 10_000, 10_000_000

# (order, label, options) of the quality table: each order at typical settings.
TABLE = [
    ("none", "stored order", {}),
    ("shard", "buffer 1,000", {"buffer_size": 1_000}),
    ("shard", "buffer 10,000", {"buffer_size": 10_000}),
    ("block", "window 8 shards", {"block_shards": 8}),
    ("block", "window 16 shards", {"block_shards": 16}),
    ("global", "one permutation", {}),
]
SWEEP = ([("block", {"block_shards": w}) for w in (1, 2, 4, 8, 16, 25, 50)]
         + [("shard", {"buffer_size": b}) for b in (100, 1_000, 5_000, 10_000, 50_000)]
         + [("none", {}), ("global", {})])
TRADE_OFF = (
    "Shuffle quality costs resident shards. On class-ordered shards a batch can only mix the "
    "classes its source window holds: `none` reads one shard at a time and its batches hold one "
    "or two classes; `shard` (WebDataset's shard shuffle plus a buffer) mixes only what the buffer "
    "holds, about 7 classes at a 1,000-sample buffer and 34 at 10,000, and on 8 ranks each rank's "
    "buffer sees only its own shards; `block` mixes exactly its window (16 shards: ~31 of 100 "
    "classes, entropy ~0.76 of perfect) while keeping at most that many shards resident per rank, "
    "and every rank reads a different window, so a node-local cache a fraction of the dataset's "
    "size suffices; `global` is indistinguishable from a perfect shuffle (entropy 1.00, 92 classes "
    "per batch) but every rank touches every shard every epoch, so it needs random access to the "
    "whole dataset through a cache, which locality-aware dealing makes affordable across nodes "
    "(each node reads a few percent of its samples from shards it does not own, instead of "
    "(nodes-1)/nodes). Spearman correlation near 0 is not evidence of mixing: `shard` and `block` "
    "score near 0 and still mix a fraction of the classes. Choose `global` when the storage "
    "behind the cache allows random reads, `block` with the largest window the cache holds when "
    "it does not, and write shards pre-shuffled when neither is good enough."
)


RESIDENT_NOTE = (
    "Shards opened and peak resident count a shard on a rank from its first to its last delivery "
    "there, as a cache serving reads by sample id must keep it. For `shard`, a streaming reader that "
    "copies samples into the buffer instead keeps one shard open plus the buffer's samples in memory; "
    "the column then shows how long the buffer's stragglers keep old shards in use."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if not any("--out" in a.option_strings for a in parser._actions):
        parser.add_argument("--out", default="bench-results", help="output folder (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="one seed, fewer sweep points, smaller scale run")
    parser.add_argument("--seeds", type=int, default=2, help="seeds averaged per quality row (default: %(default)s)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")


def class_ordered_labels() -> tuple[np.ndarray, np.ndarray]:
    counts = np.full(NUM_SHARDS, SHARD_SAMPLES, dtype=np.int64)
    n = NUM_SHARDS * SHARD_SAMPLES
    return counts, np.arange(n) * NUM_CLASSES // n


def quality_row(counts, labels, order, options, world, seeds, perfect) -> dict:
    rows = [plan_quality(make_plan(counts, order, seed, 0, Topology(0, world), **options), labels, BATCH, perfect)
            for seed in range(seeds)]
    return {k: float(np.mean([r[k] for r in rows])) if rows[0][k] is not None else None for k in rows[0]}


def locality_rows(seeds: int) -> list[tuple]:
    # 4 nodes x 4 ranks; each node owns 16 of 64 shards.
    topo = Topology(0, 16, ranks_per_node=4)
    counts = np.full(64, 2_000, dtype=np.int64)
    labels = np.zeros(int(counts.sum()), dtype=np.int64)
    out = []
    for bs in (32, 64, 128):
        plain = np.mean([plan_quality(make_plan(counts, "global", s, 0, topo), labels, bs, 1.0)["remote_fraction"]
                         for s in range(seeds)])
        local = np.mean([plan_quality(make_plan(counts, "global", s, 0, topo, locality=True, batch_size=bs),
                                      labels, bs, 1.0)["remote_fraction"] for s in range(seeds)])
        out.append((bs, plain, local))
    return out


def _rss() -> int:
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except ImportError:  # psutil is in the bench extra: without it, read /proc
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def scale(positions: int) -> list[tuple[str, str, str]]:
    counts = np.full(SCALE_SHARDS, SCALE_SHARD_SAMPLES, dtype=np.int64)
    topo = Topology(3, 8)
    make_plan(np.full(4, 4), "global", 0, 0, Topology(0, 2)).positions(0, 2)  # compile (or load) the jit first
    gc.collect()
    rss0 = _rss()
    tracemalloc.start()
    t0 = time.perf_counter()
    plan = make_plan(counts, "global", 0, 1, topo)
    build = time.perf_counter() - t0
    _, build_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_build = _rss() - rss0
    plan.positions(0, 16)

    def timed(fn):
        # CPU seconds of this (single-threaded) process measure one core's
        # work even when other jobs share the cores; wall time is shown too.
        c0, w0 = time.process_time(), time.perf_counter()
        n = fn()
        return n, time.process_time() - c0, time.perf_counter() - w0

    def plan_run(p, limit):
        def run():
            done = 0
            for chunk in p.chunks():
                done += chunk.shape[0]
                if done >= limit:
                    break
            return done
        return run

    done, gen_cpu, gen_wall = timed(plan_run(plan, positions))
    rss_gen = _rss() - rss0
    perm = Permutation(int(counts.sum()), 12345)
    perm.range(0, 16)

    def perm_run():
        for a in range(0, positions, 1 << 20):
            perm.range(a, min(positions, a + (1 << 20)))
        return positions

    _, raw_cpu, raw_wall = timed(perm_run)
    rows = [
        ("global plan build, 10^9 samples / 100,000 shards, rank 3 of 8", f"{build * 1e3:.1f} ms", "< 1 s"),
        ("memory added by the plan (RSS / traced peak)", f"{rss_build / 2**20:.1f} MiB / {build_peak / 2**20:.1f} MiB", "< 100 MB"),
        ("RSS added after generating the positions", f"{rss_gen / 2**20:.1f} MiB", "< 100 MB"),
        (f"global plan.chunks(): {positions:,} positions, one core",
         f"{done / gen_cpu / 1e6:.1f} M/s per CPU-second ({done / gen_wall / 1e6:.1f} M/s wall)", ">= 20 M/s"),
        (f"Permutation.range: {positions:,} positions, one core",
         f"{positions / raw_cpu / 1e6:.1f} M/s per CPU-second ({positions / raw_wall / 1e6:.1f} M/s wall)", ">= 20 M/s"),
    ]
    for order in ("block", "shard"):
        p = make_plan(counts, order, 0, 1, topo)
        p.positions(0, 16)
        n, cpu, wall = timed(plan_run(p, positions // 5))
        rows.append((f"{order} plan.chunks(): {n:,} positions (for comparison)",
                     f"{n / cpu / 1e6:.1f} M/s per CPU-second ({n / wall / 1e6:.1f} M/s wall)", ""))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows.append(("machine load while measuring (1-min load average / cores)", f"{load:.1f} / {os.cpu_count()}", ""))
    return rows


def _fmt(v, digits=2):
    if v is None:
        return "–"
    return f"{v:,.0f}" if digits == 0 else f"{v:.{digits}f}"


def quality_markdown(table) -> str:
    lines = ["| order | setting | ranks | entropy / perfect | classes per batch | largest class share | shards per batch | Spearman | shards opened | peak resident per rank |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for (order, label, world), q in table:
        lines.append(f"| {order} | {label} | {world} | {_fmt(q['entropy_ratio'])} | {_fmt(q['distinct_classes'], 1)} | "
                     f"{_fmt(q['largest_class_share'])} | {_fmt(q['distinct_shards'], 1)} | {_fmt(q['spearman'])} | "
                     f"{_fmt(q['shards_opened'], 0)} | {_fmt(q['peak_resident'], 0)} |")
    return "\n".join(lines)


def plot(points, path) -> None:
    from shardfeed.tools.bench.results import figure, save

    _, fig, ((ax,),) = figure(figsize=(7, 4.5))
    styles = {"none": ("k", "s"), "shard": ("tab:orange", "^"), "block": ("tab:blue", "o"), "global": ("tab:green", "*")}
    for order in ("block", "shard", "none", "global"):
        pts = sorted((q["peak_resident"], q["entropy_ratio"], label) for o, label, q in points if o == order)
        if not pts:
            continue
        color, marker = styles[order]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=order, ms=8 if order == "global" else 5)
        for x, y, label in pts:
            # global sits on top of block W=50 (same residency, same quality): label it above.
            ax.annotate(label, (x, y), fontsize=7, xytext=(-30, 6) if order == "global" else (3, -9),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("peak shards resident per rank (log)")
    ax.set_ylabel("batch label entropy / perfect shuffle")
    ax.set_ylim(0, 1.08)
    ax.set_title(f"Shuffle quality vs resident shards\nclass-ordered data: {NUM_CLASSES} classes, "
                 f"{NUM_SHARDS} shards x {SHARD_SAMPLES:,}, batch {BATCH}, 1 rank")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    save(fig, path, dpi=120)


def main(args) -> int:
    from tqdm import tqdm

    out = getattr(args, "out", "bench-results") or "bench-results"
    quick = bool(getattr(args, "quick", False))
    seeds = 1 if quick else max(1, int(getattr(args, "seeds", 2) or 2))
    make_png = not getattr(args, "no_plot", False)
    os.makedirs(out, exist_ok=True)
    counts, labels = class_ordered_labels()
    perfect = perfect_entropy(labels, BATCH, NUM_CLASSES)
    sweep = SWEEP[::2] + [SWEEP[-1]] if quick else SWEEP
    tasks = [("table", t, w) for t in TABLE for w in (1, 8)] + [("sweep", s, 1) for s in sweep] + [("locality", None, 0), ("scale", None, 0)]
    table, points, loc, scale_rows = [], [], [], []
    t_start = time.perf_counter()
    with tqdm(tasks, desc="bench shuffle", unit="step", leave=False, disable=not show_progress()) as bar:
        for kind, spec, world in bar:
            if kind == "table":
                order, label, options = spec
                bar.set_postfix_str(f"{order} {label} x{world}")
                table.append(((order, label, world), quality_row(counts, labels, order, options, world, seeds, perfect)))
            elif kind == "sweep":
                order, options = spec
                bar.set_postfix_str(f"sweep {order} {options}")
                label = {"block": f"W={options.get('block_shards')}", "shard": f"buf={options.get('buffer_size')}"}.get(order, order)
                points.append((order, label, quality_row(counts, labels, order, options, 1, seeds, perfect)))
            elif kind == "locality":
                bar.set_postfix_str("locality")
                loc = locality_rows(seeds)
            else:
                bar.set_postfix_str("scale")
                positions = getattr(args, "scale_positions", None) or (SCALE_POSITIONS // 5 if quick else SCALE_POSITIONS)
                scale_rows = scale(int(positions))

    qmd = quality_markdown(table)
    lmd = "\n".join(["| per-rank batch | remote reads, plain dealing | remote reads, locality-aware |", "|--:|--:|--:|"]
                    + [f"| {bs} | {p:.1%} | {q:.1%} |" for bs, p, q in loc])
    smd = "\n".join(["| measure | result | target |", "|---|--:|--:|"] + [f"| {a} | {b} | {c} |" for a, b, c in scale_rows])
    header = (f"Class-ordered dataset: {NUM_CLASSES} classes written class by class, {NUM_SHARDS} shards of "
              f"{SHARD_SAMPLES:,} samples, per-rank batch {BATCH}, mean of {seeds} seed(s). A perfect shuffle "
              f"has mean batch entropy {perfect:.3f} nats.")
    quality_doc = (f"# Shuffle quality\n\n{header}\n\n{qmd}\n\n{RESIDENT_NOTE}\n\n## Locality-aware dealing\n\n"
                   "Share of samples a rank reads from a shard its node does not own (4 nodes x 4 ranks, "
                   "64 shards, shard k owned by node k mod 4); the samples of every global batch are the "
                   "same in both columns.\n\n"
                   f"{lmd}\n\n## Trade-off\n\n{TRADE_OFF}\n")
    from shardfeed.tools.bench import results

    results.write(out, {"shuffle_quality.md": quality_doc, "shuffle_scale.md": f"# Shuffle plan scale\n\n{smd}\n"})
    if make_png:
        plot(points, os.path.join(out, "shuffle_quality.png"))
    print(f"## Shuffle quality\n\n{header}\n\n{qmd}\n\n## Locality-aware dealing (4 nodes x 4 ranks)\n\n{lmd}\n\n"
          f"## Scale\n\n{smd}\n")
    best = {o: q["entropy_ratio"] for (o, label, w), q in table if w == 1}
    print(f"bench shuffle: {len(table)} quality rows, {len(points)} sweep points in {time.perf_counter() - t_start:.0f} s; "
          f"entropy/perfect none {best.get('none', float('nan')):.2f}, block {best.get('block', float('nan')):.2f}, "
          f"global {best.get('global', float('nan')):.2f}; results in {out}/shuffle_quality.md, shuffle_quality.png, shuffle_scale.md")
    return 0
