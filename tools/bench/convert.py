"""`shardfeed bench convert`: conversion throughput, write-time shuffle memory and the quality it buys.

1. throughput: a dataset of 2 KiB and one of 100 KiB samples (random bytes,
   so compression cannot flatter) re-sharded by `convert` with 1 and 2
   processes and with ``--engine ray`` (2 parts on a local 2-CPU Ray
   instance, its start included), samples/s and MB/s of shard bytes written;
2. memory: peak RSS of generating the write order of 10^8 samples in a
   fresh process, the keyed permutation a range at a time vs the
   materialised permutation convert used before;
3. quality: a class-ordered dataset (100 classes, 50 shards of 2,000) written
   shuffled, then read in the cheapest order (``shard``: shard order shuffled,
   1,000-sample buffer): distinct classes per batch of 256 against a perfect
   shuffle's. The write order is a pure function of the seed, so the shards'
   labels are computed, not written.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip()
    parser.add_argument("--quick", action="store_true", help="smaller datasets, 10^7 samples for memory")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine row")
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")


def order_peak(job: dict) -> dict:
    """Peak RSS of making the write order of ``job["n"]`` samples, and its growth over the baseline, in a
    fresh process (fresh.run, this file loaded by path: nothing of shardfeed in the baseline): the keyed
    permutation a range at a time, or the materialised one."""
    import resource

    n = job["n"]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if job["how"] == "permutation":
        from shardfeed.tools.convert.order import OutputOrder
        order = OutputOrder(n, 0)
        order.ids(0, 10)  # jit warm-up before the baseline
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        acc = 0
        for a in range(0, n, 1 << 20):
            acc ^= int(order.ids(a, min(n, a + (1 << 20)))[0])
    else:
        order = np.random.default_rng(0).permutation(n).astype(np.int64)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"status": "ok", "peak_rss": peak * 1024, "growth": (peak - base) * 1024}


def order_memory(n: int) -> list[dict]:
    from shardfeed.tools.bench import fresh

    rows = []
    for how in ("permutation", "materialised"):
        t0 = time.perf_counter()
        out = fresh.run("shardfeed.tools.bench.convert:order_peak", {"n": n, "how": how}, timeout=3600,
                        by_path=True)
        if out["status"] != "ok":
            raise RuntimeError(f"bench convert: the write order of {n:,} samples ({how}): {out['status']}")
        rows.append({"how": how, "samples": n, "peak_rss": out["peak_rss"], "growth": out["growth"],
                     "seconds": time.perf_counter() - t0})
    return rows


def _source(root: str, n: int, size: int) -> None:
    from shardfeed.formats import ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(root, max_shard_bytes=64 << 20) as w:
        for i in range(n):
            w.write({"__key__": f"{i:09d}", "cls": i % 100, "bin": rng.bytes(size)})


def throughput(tmp: str, quick: bool, ray: bool) -> list[dict]:
    from shardfeed.tools.convert.job import ConvertOptions, convert
    from shardfeed.tools.convert.source_kinds import open_source

    rows = []
    for size, n in ((2 << 10, 20_000 if quick else 100_000), (100 << 10, 400 if quick else 2_000)):
        src = os.path.join(tmp, f"src-{size}")
        _source(src, n, size)
        runs = [("1 process", "local", 1), ("2 processes", "local", 2)] + ([("ray, 2 parts", "ray", 2)] if ray else [])
        for label, engine, procs in runs:
            dst = os.path.join(tmp, "out")
            opts = ConvertOptions(max_shard_bytes=32 << 20, processes=procs, engine=engine, shuffle_seed=0)
            result = convert(open_source(src), dst, opts)
            rows.append({"sample": size, "samples": n, "run": label, "seconds": result.seconds,
                         "samples_s": n / result.seconds, "mb_s": result.bytes / 1e6 / result.seconds})
            shutil.rmtree(dst)
        shutil.rmtree(src)
    return rows


def quality(seeds: int = 2) -> dict:
    from shardfeed.shuffling import Topology, make_plan
    from shardfeed.shuffling.plan_quality import perfect_entropy, plan_quality
    from shardfeed.tools.bench.shuffle import BATCH, NUM_CLASSES, class_ordered_labels
    from shardfeed.tools.convert.order import OutputOrder

    counts, labels = class_ordered_labels()
    n = len(labels)
    perfect = perfect_entropy(labels, BATCH, NUM_CLASSES)
    ref = [plan_quality(make_plan(counts, "global", s, 0, Topology(0, 1)), labels, BATCH, perfect)
           for s in range(seeds)]
    stored = [plan_quality(make_plan(counts, "shard", s, 0, Topology(0, 1), buffer_size=1_000), labels, BATCH,
                           perfect) for s in range(seeds)]
    written = labels[OutputOrder(n, 1234).ids(0, n)]
    shuffled = [plan_quality(make_plan(counts, "shard", s, 0, Topology(0, 1), buffer_size=1_000), written, BATCH,
                             perfect) for s in range(seeds)]
    mean = lambda rows: float(np.mean([r["distinct_classes"] for r in rows]))  # noqa: E731
    return {"perfect": mean(ref), "class_ordered_shards": mean(stored), "write_shuffled_shards": mean(shuffled)}


def main(args) -> int:
    from shardfeed.tools.size_options import human_bytes

    os.makedirs(args.out, exist_ok=True)
    ray = not args.no_ray
    if ray:
        try:
            import ray as _  # noqa: F401
        except ImportError:
            print("bench convert: Ray is not installed; skipping the Ray row (from the clone: pip install -e '.[ray]')")
            ray = False
    results = {}
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        results["throughput"] = throughput(tmp, args.quick, ray)
    for r in results["throughput"]:
        print(f"{human_bytes(r['sample']):>9} x {r['samples']:>7}  {r['run']:<13} {r['samples_s']:>10,.0f} samples/s "
              f"{r['mb_s']:>8.1f} MB/s")
    results["order_memory"] = order_memory(10**7 if args.quick else 10**8)
    for r in results["order_memory"]:
        print(f"write order of {r['samples']:.0e} samples, {r['how']:<12}: peak RSS {human_bytes(r['peak_rss'])} "
              f"(+{human_bytes(r['growth'])} for the order), {r['seconds']:.1f} s")
    q = results["quality"] = quality()
    print(f"shard order, 1,000-sample buffer: {q['write_shuffled_shards']:.1f} distinct classes per batch over "
          f"write-shuffled shards, {q['class_ordered_shards']:.1f} over class-ordered ones, perfect "
          f"{q['perfect']:.1f} ({100 * q['write_shuffled_shards'] / q['perfect']:.1f}% of perfect)")
    from shardfeed.tools.bench import results as report_writer

    report_writer.write(args.out, {"bench_convert.json": results}, say="convert")
    return 0
