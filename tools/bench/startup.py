"""`shardfeed bench startup`: what a fresh process pays for its first batch, ``import torch`` aside.

    shardfeed bench startup [--samples 65536] [--size 2048] [--batch-size 256] [--repeat 5] [--out DIR]

Writes a local tar dataset (``--samples`` of ``--size`` bytes, 4,096 a shard), then for each order
(``global``, ``none``) starts ``--repeat`` fresh interpreters, each: ``import torch`` (not timed: every
torch program pays it), then timed from there, in wall and CPU seconds (``time.process_time``):
``from shardfeed.loader import Loader, ShardDataset``, the dataset and Loader (0 workers) and the
first batch. Each also reports the next 20 batches' CPU time, and whether a full (generation 2)
collection ran during start-up or during those 20 batches: start-up pauses the collector
(formats/base/lazy.py), so a pass due to torch's objects shows there, not in the start-up figure. A run
that imported numba (the compiled kernels did not serve: run ``shardfeed warm``) is counted.

Bytecode: shardfeed's modules are compiled first (``shardfeed warm`` does the same), as an installed
package has them (pip compiles them at install), and the children may write caches of anything else.
Without this an environment with ``PYTHONDONTWRITEBYTECODE=1`` and a checkout without ``__pycache__``
makes every child compile every shardfeed module from source (measured: about twice the import).

Figures are medians over the fresh processes, with the 1-minute load average before and after (a busy
machine stretches wall time first).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ORDERS = ("global", "none")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip().split("\n\n")[0]
    parser.add_argument("--samples", type=int, default=1 << 16, help="samples in the dataset (default: %(default)s)")
    parser.add_argument("--size", type=int, default=2048, help="payload bytes a sample (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per order (default: %(default)s)")
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")


def write_dataset(folder: str, samples: int, size: int) -> str:
    """The dataset (written once per size and count; an existing index is reused)."""
    from shardfeed.formats import ShardWriter

    if not os.path.exists(os.path.join(folder, "index.arrow")):
        with ShardWriter(folder, format="tar", max_shard_samples=4096) as w:
            for i in range(samples):
                w.write({"__key__": f"{i:08d}", "bin": bytes([i % 251]) * size, "cls": i % 1000})
    return folder


def first_batch(job: dict) -> dict:
    """One fresh process's start-up (fresh.run loads this file by path, so nothing of shardfeed is imported
    before the timing): ``import torch`` untimed, then the import, the Loader and the first batch timed."""
    import gc
    import time

    import torch  # noqa: F401 (every torch program pays it: not timed)

    full = []
    gc.callbacks.append(lambda phase, info: full.append(time.perf_counter()) if phase == "start"
                        and info["generation"] == 2 else None)
    t0, c0 = time.perf_counter(), time.process_time()
    from shardfeed.loader import Loader, ShardDataset
    t1, c1 = time.perf_counter(), time.process_time()
    loader = Loader(ShardDataset(job["folder"], shuffle=job["order"]), job["batch_size"])
    it = iter(loader)
    batch = next(it)
    t2, c2 = time.perf_counter(), time.process_time()
    if len(batch["__key__"]) != job["batch_size"]:
        return {"status": f"error: a first batch of {len(batch['__key__'])}, not {job['batch_size']}"}
    for _ in range(20):
        next(it)
    t3, c3 = time.perf_counter(), time.process_time()
    loader.close()
    return {"status": "ok", "import_s": t1 - t0, "import_cpu_s": c1 - c0, "first_s": t2 - t0,
            "first_cpu_s": c2 - c0, "next20_cpu_s": c3 - c2, "full_gc_in_start": sum(t <= t2 for t in full),
            "full_gc_in_next20": sum(t2 < t <= t3 for t in full), "numba": "numba" in sys.modules}


def fresh(folder: str, order: str, batch_size: int) -> dict:
    from shardfeed.tools.bench import fresh as runner

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return runner.run("shardfeed.tools.bench.startup:first_batch",
                      {"folder": folder, "order": order, "batch_size": batch_size}, timeout=300, by_path=True, env=env)


def summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    row = {"runs": len(runs), "ok": len(ok)}
    for k in ("import_s", "import_cpu_s", "first_s", "first_cpu_s", "next20_cpu_s"):
        row[k] = statistics.median(r[k] for r in ok) if ok else None
    for k in ("full_gc_in_start", "full_gc_in_next20", "numba"):
        row[k] = sum(r[k] for r in ok)
    return row


def main(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    folder = write_dataset(os.path.join(out, "data", f"startup-tar-{args.size}B-{args.samples}"), args.samples,
                           args.size)
    from shardfeed.tools.warm import compile_bytecode

    compile_bytecode()
    load_before = os.getloadavg()[0]
    runs = {o: [] for o in ORDERS}
    for _ in range(args.repeat):
        for o in ORDERS:  # alternating, so a load spike falls on both
            runs[o].append(fresh(folder, o, args.batch_size))
    load_after = os.getloadavg()[0]
    rows = {o: summary(rs) for o, rs in runs.items()}
    report = {"samples": args.samples, "size": args.size, "batch_size": args.batch_size, "repeat": args.repeat,
              "machine": f"{os.cpu_count()} cores, 1-min load {load_before:.1f} before, {load_after:.1f} after",
              "rows": rows, "runs": runs}
    lines = [f"`shardfeed bench startup`: {args.samples:,} x {args.size:,} B local tar, batch {args.batch_size}, "
             f"0 workers, median of {args.repeat} fresh processes after `import torch` ({report['machine']})", "",
             "| shuffle | import ms (CPU) | first batch ms, import included (CPU) | next 20 batches CPU ms "
             "| full GC passes: start-up / next 20 | runs with numba |", "|---|--:|--:|--:|--:|--:|"]
    for o, r in rows.items():
        if not r["ok"]:
            lines.append(f"| {o} | failed: {runs[o][0]['status']} | | | | |")
            continue
        lines.append(f"| {o} | {r['import_s'] * 1e3:.0f} ({r['import_cpu_s'] * 1e3:.0f}) | {r['first_s'] * 1e3:.0f} "
                     f"({r['first_cpu_s'] * 1e3:.0f}) | {r['next20_cpu_s'] * 1e3:.0f} | {r['full_gc_in_start']} / "
                     f"{r['full_gc_in_next20']} | {r['numba']} |")
    text = "\n".join(lines)
    print(text)
    from shardfeed.tools.bench import results

    results.write(out, {"bench_startup.json": report, "bench_startup.md": text + "\n"})
    return 0 if all(r["ok"] == r["runs"] for r in rows.values()) else 1
