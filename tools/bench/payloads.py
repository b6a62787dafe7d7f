"""Payload forms side by side: raw uint16 tokens vs .npy tokens vs plain bytes
(2 KiB samples, samples/s), and byte fields as bytes / tensor views / a
jagged tensor (100 KiB samples, MB/s); stored order, 0 and 2 workers.

    shardfeed bench payloads [--samples-2k 32768] [--samples-100k 2048] [--repeats 5] [--out DIR]

Each variant is one Loader kept across epochs (workers stay up, page cache
warm); epochs of the variants alternate, the first of each is discarded,
and the median of the rest is reported, so load on a shared machine hits
every variant alike. The consumer touches each batch's field (shape of a
tensor, length of a list) as a trainer would before handing it on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from shardfeed.formats import ShardWriter


def _write(root: str, n: int, make) -> str:
    t0 = time.perf_counter()
    with ShardWriter(root, max_shard_bytes=64 << 20) as w:
        for i in range(n):
            w.write(make(i))
    print(f"wrote {n:,} samples to {root} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return root


def _token_sample(field: str, tokens: int):
    base = np.arange(tokens, dtype=np.int64) * 7

    def make(i: int) -> dict:
        t = ((base + i * 131) % 50000).astype(np.uint16)
        return {"__key__": f"{i:08d}", field: t if field != "bin" else t.tobytes()}
    return make


def _blob_sample(nbytes: int):
    blob = np.random.default_rng(0).integers(0, 256, nbytes + 4096, dtype=np.uint8).tobytes()

    def make(i: int) -> dict:
        off = i % 4096
        return {"__key__": f"{i:08d}", "bin": blob[off:off + nbytes]}
    return make


def _touch(batch, field: str) -> int:
    v = batch[field]
    return int(v.shape[0]) if hasattr(v, "shape") else len(v)


def _measure(variants: dict, workers: int, repeats: int) -> dict:
    """{name: [epoch seconds]} for loaders of every variant, epochs alternating."""
    from shardfeed.loader import Loader, ShardDataset

    loaders = {name: (Loader(ShardDataset(root, shuffle="none"), batch_size=256, num_workers=workers,
                             bytes_as=bytes_as), field)
               for name, (root, field, bytes_as) in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for r in range(repeats + 1):
            names = list(loaders)
            names = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
            for name in names:
                ld, field = loaders[name]
                t0 = time.perf_counter()
                n = 0
                for b in ld:
                    n += _touch(b, field)
                dt = time.perf_counter() - t0
                if r:  # the first epoch starts workers and warms caches
                    times[name].append(dt)
    finally:
        for ld, _ in loaders.values():
            ld.close()
    return times


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples-2k", type=int, default=32768, help="2 KiB samples (default: %(default)s)")
    p.add_argument("--samples-100k", type=int, default=2048, help="100 KiB samples (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed epochs per variant (default: %(default)s)")
    p.add_argument("--workers", default="0,2", help="worker counts, comma-separated (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="4,096 x 2 KiB and 256 x 100 KiB, 3 repeats, 0 workers")
    p.add_argument("--json", help="also write the figures here (default: bench_payloads.json under --out)")
    p.add_argument("--dir", help="folder for the datasets (default: a temporary one, removed)")


def main(a: argparse.Namespace | list[str] | None = None) -> int:
    if not isinstance(a, argparse.Namespace):
        p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        add_arguments(p)
        p.add_argument("--out", help="folder for bench_payloads.json (default: none)")
        a = p.parse_args(a)
    if a.quick:
        a.samples_2k, a.samples_100k, a.repeats, a.workers = 4096, 256, 3, "0"
    out = getattr(a, "out", None)
    if out and not a.json:
        os.makedirs(out, exist_ok=True)
        a.json = os.path.join(out, "bench_payloads.json")
    tmp = a.dir or tempfile.mkdtemp(prefix="shardfeed-payloads-")
    report = {"rows": []}
    try:
        small = {
            "raw uint16 (tokens.uint16)": (_write(f"{tmp}/raw", a.samples_2k, _token_sample("tokens.uint16", 1024)),
                                           "tokens.uint16", "bytes"),
            "npy uint16 (npy)": (_write(f"{tmp}/npy", a.samples_2k, _token_sample("npy", 1024)), "npy", "bytes"),
            "plain bytes (bin)": (_write(f"{tmp}/bin", a.samples_2k, _token_sample("bin", 1024)), "bin", "bytes"),
        }
        big_root = _write(f"{tmp}/big", a.samples_100k, _blob_sample(100 << 10))
        big = {f"bytes_as={form}": (big_root, "bin", form) for form in ("bytes", "tensor", "jagged")}
        print("| samples | workers | variant | median | min..max |")
        print("|---|--:|---|--:|---|")
        for workers in [int(w) for w in a.workers.split(",")]:
            for label, variants, n, per in (("2 KiB", small, a.samples_2k, None),
                                            ("100 KiB", big, a.samples_100k, 100 << 10)):
                times = _measure(variants, workers, a.repeats)
                for name, ts in times.items():
                    rates = [n / t for t in ts] if per is None else [n * per / t / 1e6 for t in ts]
                    unit = "samples/s" if per is None else "MB/s"
                    med = statistics.median(rates)
                    report["rows"].append({"size": label, "workers": workers, "variant": name, "unit": unit,
                                           "median": med, "rates": rates})
                    print(f"| {label} | {workers} | {name} | {med:,.0f} {unit} | "
                          f"{min(rates):,.0f}..{max(rates):,.0f} |", flush=True)
        if a.json:
            from shardfeed.tools.bench import results

            results.write(os.path.dirname(os.path.abspath(a.json)), {os.path.basename(a.json): report})
        print(f"bench payloads: {len(report['rows'])} variants measured"
              + (f", figures in {a.json}" if a.json else ""))
    finally:
        if not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
