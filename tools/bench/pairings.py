"""`shardfeed bench pairings`: every shard format under every order, with and without a cache.

Issue 13 asks for "no pathological pairing of format and order": Parquet and
compressed tars under the default ``global`` order within 2x of tar (and
Arrow) under ``global``, with or without a cache dir, at 0 and 2 workers.
This measures the whole matrix side by side in one run:

    {tar, arrow, parquet, tar.zst, tar.gz} x {global, none}
      x {no cache, cache_dir over the local folder, HTTP URL + cache_dir} x {0, 2 workers}

at 2 KiB, plus tar and Parquet at 100 KiB (stored order was Parquet's slow
case) read in place. Every configuration is a fresh process
(``ShardDataset`` + ``Loader``, batch 256, the consumer checking every
sample's key, class and bytes against an order-independent digest,
tools/bench/samples.py); the whole-pass rate includes building the dataset
and loader, the steady rate runs from the end of the first batch. A cached
configuration reads a warm cache: one untimed pass per dataset and cache
kind fills it first (its rate is the "fill" column). The HTTP server is a
loopback server (tools/bench/throttled_http.py without a limit).

Writes ``bench_pairings.md`` and ``bench_pairings.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time

from tqdm import tqdm

from shardfeed.tools.text import show_progress

FORMATS = ("tar", "arrow", "parquet", "tar.zst", "tar.gz")
ORDERS = ("global", "none")
CACHES = ("none", "dir", "http")
WORKERS = (0, 2)
SHARDS = 8
BATCH = 256
TARGET = 0.5  # within 2x of tar: at least half its rate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-results", help="output folder (default bench-results)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp folder under --out)")
    parser.add_argument("--samples", type=int, default=16_384, help="2 KiB samples per dataset")
    parser.add_argument("--large-samples", type=int, default=2_048,
                        help="100 KiB samples for the tar / Parquet rows (0: leave them out)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of " + ",".join(FORMATS))
    parser.add_argument("--orders", default=",".join(ORDERS), help="comma-separated orders")
    parser.add_argument("--caches", default=",".join(CACHES), help="comma-separated subset of none,dir,http")
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per configuration (median)")
    parser.add_argument("--quick", action="store_true", help="small datasets (a smoke test, figures meaningless)")


# -- datasets -------------------------------------------------------------------
def write_dataset(folder: str, fmt: str, count: int, size: int) -> None:
    """``count`` benchmark samples as ``fmt`` shards; tar.gz is a tar dataset
    gzipped shard by shard, its sidecars and index rewritten (ShardWriter writes
    no gzip: such shards come from elsewhere)."""
    from shardfeed.formats import ShardWriter
    from shardfeed.tools.bench.samples import SampleSpec

    spec = SampleSpec(count, size)
    per = -(-count // SHARDS)
    kind, compression = {"tar": ("tar", None), "tar.gz": ("tar", None), "tar.zst": ("tar", "zstd"),
                         "parquet": ("parquet", None), "arrow": ("arrow", None)}[fmt]
    with ShardWriter(folder, format=kind, max_shard_samples=per, compression=compression) as w:
        for sample in spec:
            w.write(sample)
    if fmt == "tar.gz":
        gzip_dataset(folder)


def gzip_dataset(folder: str) -> None:
    """Turn a tar dataset into a .tar.gz one in place: shards, sidecars, index."""
    from shardfeed.formats import ShardInfo, open_index, write_index
    from shardfeed.formats.own_tables import read_sidecar
    from shardfeed.formats.readers import hash_file
    from shardfeed.formats.sidecar import SIDECAR_SUFFIX, write_sidecar

    idx = open_index(folder)
    rows = []
    for i in range(len(idx)):
        src = idx.path(i)
        dst = src[:-len(".tar")] + ".tar.gz"
        with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=6) as g:
            shutil.copyfileobj(f, g)
        table, _ = read_sidecar(src + SIDECAR_SUFFIX, src)
        digest = hash_file(dst)
        write_sidecar(dst + SIDECAR_SUFFIX, table, os.path.getsize(dst), digest)
        os.unlink(src)
        os.unlink(src + SIDECAR_SUFFIX)
        rows.append(ShardInfo(idx.names[i][:-len(".tar")] + ".tar.gz", "tar.gz", int(idx.counts[i]),
                              os.path.getsize(dst), digest))
    write_index(folder, rows, idx.fields)


# -- one configuration, in a fresh process --------------------------------------
def one_pass(job: dict) -> dict:
    """One configuration's timed pass (run in a fresh process by fresh.run)."""
    from shardfeed.loader import Loader, ShardDataset
    from shardfeed.tools.bench.samples import ContentCheck

    check = ContentCheck()
    first_s = steady_start = None
    first = {}
    start = time.perf_counter()
    ds = ShardDataset(job["source"], shuffle=job["order"], seed=0, cache_dir=job["cache_dir"])
    loader = Loader(ds, batch_size=job["batch"], num_workers=job["workers"])
    for batch in loader:
        got = time.perf_counter()
        check.add(batch["__key__"], batch["bin"], batch["cls"])
        if first_s is None:
            first_s, steady_start, first = got - start, time.perf_counter(), check.result()
    end = time.perf_counter()
    out = {"whole_s": end - start, "first_batch_s": first_s, **check.result()}
    if steady_start is not None and check.count > first["count"]:
        out.update(steady_s=end - steady_start, steady_count=check.count - first["count"])
    wrong = check.mismatch(job["expected"])
    out["status"] = f"FAILED: wrong content ({wrong})" if wrong else "ok"
    return out


def _spawn(job: dict) -> dict:
    from shardfeed.tools.bench import fresh

    return fresh.run("shardfeed.tools.bench.pairings:one_pass", job, timeout=600)


# -- the matrix -----------------------------------------------------------------
def configurations(args) -> list[dict]:
    formats = _pick(args.formats, FORMATS, "format")
    orders = _pick(args.orders, ("global", "none", "shard", "block"), "order")
    caches = _pick(args.caches, CACHES, "cache")
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    rows = [{"size": 2048, "format": f, "order": o, "cache": c, "workers": w}
            for o, c, w, f in itertools.product(orders, caches, workers, formats)]
    if args.large_samples:
        rows += [{"size": 100 << 10, "format": f, "order": o, "cache": "none", "workers": w}
                 for o, w, f in itertools.product(orders, workers, ("tar", "parquet"))]
    return rows


def _pick(text: str, allowed, what: str) -> list[str]:
    from shardfeed.tools.bench.report import csv_choices

    try:
        return csv_choices(text, allowed, what)
    except ValueError as e:
        raise SystemExit(f"bench pairings: {e}") from None


def main(args: argparse.Namespace) -> int:
    from shardfeed.tools.bench.samples import SampleSpec
    from shardfeed.tools.bench.throttled_http import ThrottledServer

    if args.quick:
        args.samples = min(args.samples, 2_048)
        args.large_samples = min(args.large_samples, 512)
    os.makedirs(args.out, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="bench-pairings-", dir=args.out)
    configs = configurations(args)
    t_start = time.perf_counter()
    counts = {2048: args.samples, 100 << 10: args.large_samples}
    try:
        data = {}
        for size, fmt in sorted({(c["size"], c["format"]) for c in configs}):
            folder = os.path.join(work, "data", f"{size}-{fmt}")
            if not os.path.exists(os.path.join(folder, "index.arrow")):
                shutil.rmtree(folder, ignore_errors=True)
                write_dataset(folder, fmt, counts[size], size)
            data[(size, fmt)] = folder
        expected = {size: SampleSpec(n, size).expected() for size, n in counts.items() if n}
        results = []
        with ThrottledServer(os.path.join(work, "data"), 1e12) as server:
            fills = {}
            steps = tqdm(total=len(configs) * args.repeats, desc="bench pairings", unit="run",
                         disable=not show_progress())
            for c in configs:
                folder = data[(c["size"], c["format"])]
                source = folder if c["cache"] != "http" else f"{server.url}/{os.path.basename(folder)}"
                cache_dir = None if c["cache"] == "none" else os.path.join(work, "cache", c["cache"],
                                                                           os.path.basename(folder))
                job = {"source": source, "order": c["order"], "cache_dir": cache_dir, "workers": c["workers"],
                       "batch": BATCH, "expected": expected[c["size"]]}
                if cache_dir is not None and cache_dir not in fills:  # fill the cache, untimed
                    fills[cache_dir] = _spawn(dict(job, order="none", workers=0))
                runs = []
                for _ in range(args.repeats):
                    runs.append(_spawn(job))
                    steps.update()
                results.append({**c, **_summary(runs, counts[c["size"]]),
                                "fill": _rate(fills.get(cache_dir), counts[c["size"]])})
            steps.close()
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    _ratios(results)
    text = render(results, args, counts)
    from shardfeed.tools.bench.results import write

    write(args.out, {"bench_pairings.md": text,
                     "bench_pairings.json": {"samples": counts, "batch": BATCH, "results": results}})
    print(text)
    ok = sum(r["status"] == "ok" for r in results)
    print(f"bench pairings: {len(results)} configurations, {ok} content-checked ok; "
          f"{time.perf_counter() - t_start:.0f} s -> {os.path.join(args.out, 'bench_pairings.md')}")
    return 0 if ok == len(results) else 1


def _rate(run: dict | None, count: int) -> float | None:
    if not run or run.get("status") != "ok":
        return None
    return count / run["whole_s"]


def _summary(runs: list[dict], count: int) -> dict:
    bad = [r["status"] for r in runs if r.get("status") != "ok"]
    if bad:
        return {"status": bad[0], "whole": None, "steady": None, "first_batch_s": None}
    steady = [r["steady_count"] / r["steady_s"] for r in runs if r.get("steady_s")]
    return {"status": "ok", "whole": statistics.median(count / r["whole_s"] for r in runs),
            "steady": statistics.median(steady) if steady else None,
            "first_batch_s": statistics.median(r["first_batch_s"] for r in runs)}


def _ratios(results: list[dict]) -> None:
    """Each row's rates as a fraction of tar's under the same size, order, cache and workers."""
    tar = {(r["size"], r["order"], r["cache"], r["workers"]): r for r in results if r["format"] == "tar"}
    for r in results:
        base = tar.get((r["size"], r["order"], r["cache"], r["workers"]))
        for k in ("whole", "steady"):
            ok = base is not None and r[k] and base[k]
            r[f"{k}_vs_tar"] = r[k] / base[k] if ok else None


def _f(x, fmt="{:,.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(results: list[dict], args, counts: dict) -> str:
    L = ["# shardfeed format x order pairings", "",
         f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}. {counts[2048]:,} x 2 KiB samples"
         + (f" and {counts[100 << 10]:,} x 100 KiB" if counts[100 << 10] else "")
         + f" in {SHARDS} shards per dataset, batch {BATCH}, each configuration a fresh process (median of "
         f"{args.repeats}), content-checked. Cache: `dir` = a local folder read through cache_dir, `http` = "
         "the same over a loopback HTTP URL; both warm (filled by an untimed pass, `fill` /s). "
         "`vs tar`: the rate over tar's under the same size, order, cache and workers.", "",
         "| size | order | cache | workers | format | whole /s | steady /s | first batch s | whole vs tar "
         "| steady vs tar | fill /s | status |",
         "|---|---|---|--:|---|--:|--:|--:|--:|--:|--:|---|"]
    for r in results:
        L.append(f"| {'2KiB' if r['size'] == 2048 else '100KiB'} | {r['order']} | {r['cache']} | {r['workers']} | "
                 f"{r['format']} | {_f(r['whole'])} | {_f(r['steady'])} | {_f(r['first_batch_s'], '{:.3f}')} | "
                 f"{_f(r['whole_vs_tar'], '{:.2f}')} | {_f(r['steady_vs_tar'], '{:.2f}')} | {_f(r['fill'])} | "
                 f"{r['status']} |")
    L += ["", "Targets (issue 13): each format within 2x of tar (>= 0.50 of its rate), whole pass and steady, "
          "under the same order, cache and workers.", "",
          "| format | order | configurations | met | worst whole vs tar | worst steady vs tar |",
          "|---|---|--:|--:|--:|--:|"]
    groups = {}
    for r in results:
        if r["format"] != "tar":
            groups.setdefault((r["format"], r["order"], r["size"]), []).append(r)
    for (fmt, order, size), rows in groups.items():
        met = sum(1 for r in rows if (r["whole_vs_tar"] or 0) >= TARGET and (r["steady_vs_tar"] or 0) >= TARGET)
        worst_w = min((r["whole_vs_tar"] for r in rows if r["whole_vs_tar"] is not None), default=None)
        worst_s = min((r["steady_vs_tar"] for r in rows if r["steady_vs_tar"] is not None), default=None)
        label = fmt if size == 2048 else f"{fmt} (100 KiB)"
        L.append(f"| {label} | {order} | {len(rows)} | {met} | {_f(worst_w, '{:.2f}')} | {_f(worst_s, '{:.2f}')} |")
    return "\n".join(L) + "\n"
