"""`shardfeed bench mix`: what mixing costs, and what the coverage audit holds.

Overhead: a 3-source Mixture (sizes 1:2:3, weights 0.5/0.3/0.2, exact counts)
against one dataset of the same total samples and payload, read in the same
run by one Loader each (0 workers, batch 256, global shuffle), passes
alternated, best of ``--repeats``; then the same mixture with ``audit=True``.
The ratio is what to read: both sides share the machine's noise.

Audit memory: one bit per sample per source per epoch on each rank
(numpy packbits), so 10**9 samples take 10**9 / 8 bytes = 125 MB per rank per
epoch, whatever the world size; measured here as the recorder's bitmap bytes
per sample of the mixture.

Writes mix.md to --out.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, Mixture, ShardDataset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip()
    parser.add_argument("--samples", type=int, default=120_000, help="total samples (default: %(default)s)")
    parser.add_argument("--payload", type=int, default=256, help="payload bytes per sample (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="passes of each side (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="24,000 samples, 2 passes")
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")


def _write(root: str, first: int, n: int, payload: int) -> str:
    pool = np.random.default_rng(0).integers(0, 256, payload + 4096, dtype=np.uint8).tobytes()
    with ShardWriter(root, max_shard_samples=4096) as w:
        for i in range(first, first + n):
            w.write({"__key__": f"{i:010d}", "cls": i % 1000, "bin": pool[i % 4096:i % 4096 + payload]})
    return root


def _rate(loader: Loader) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = sum(len(b["__key__"]) for b in loader)
    return n / (time.perf_counter() - t0), n


def main(args: argparse.Namespace) -> int:
    total, repeats = (24_000, 2) if args.quick else (args.samples, args.repeats)
    parts = [total // 6, total // 3, total - total // 6 - total // 3]
    with tempfile.TemporaryDirectory(prefix="shardfeed-bench-mix-") as tmp:
        one = _write(os.path.join(tmp, "one"), 0, total, args.payload)
        roots, first = [], 0
        for j, n in enumerate(parts):
            roots.append(_write(os.path.join(tmp, f"src{j}"), first, n, args.payload))
            first += n
        sides = {
            "one dataset": lambda: Loader(ShardDataset(one, seed=1), args.batch),
            "3-source mixture": lambda: Loader(Mixture(roots, weights=[0.5, 0.3, 0.2], epoch_samples=total,
                                                       seed=1), args.batch),
            "mixture + audit": lambda: Loader(Mixture(roots, weights=[0.5, 0.3, 0.2], epoch_samples=total,
                                                      seed=1), args.batch, audit=True),
        }
        loaders = {name: make() for name, make in sides.items()}
        for L in loaders.values():  # warm: jitted code, page cache
            _rate(L)
        best = {name: 0.0 for name in sides}
        for _ in range(repeats):
            for name, L in loaders.items():
                best[name] = max(best[name], _rate(L)[0])
        audit = loaders["mixture + audit"]._audit
        bitmap_bytes = sum(b.nbytes for b in next(iter(audit.epochs.values()))["bits"])
        for L in loaders.values():
            L.close()
    base = best["one dataset"]
    bits_per_sample = bitmap_bytes * 8 / total
    lines = ["# Mixing overhead and audit memory", "",
             f"{total:,} samples of {args.payload} B, batch {args.batch}, 0 workers, best of {repeats} passes "
             "(`shardfeed bench mix`)", "",
             "| reader | samples/s | vs one dataset |", "|---|---:|---:|"]
    for name, r in best.items():
        lines.append(f"| {name} | {r:,.0f} | {r / base:.2f}x |")
    lines += ["", f"Audit: {bits_per_sample:.3f} bits per sample per epoch per rank (measured: "
                  f"{bitmap_bytes:,} B of bitmaps for {total:,} samples); at 10^9 samples: "
                  f"{1e9 * bits_per_sample / 8 / 1e6:,.0f} MB per rank per epoch."]
    text = "\n".join(lines) + "\n"
    from shardfeed.tools.bench import results

    results.write(args.out, {"mix.md": text})
    print(text, end="")
    print(f"bench mix: wrote {os.path.join(args.out, 'mix.md')}")
    return 0
