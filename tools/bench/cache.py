"""`shardfeed bench cache`: the node-local cache against a throttled remote.

Each simulated node has its own loopback HTTP server throttled to a fixed
bandwidth (its link) serving the dataset, its own ShardCache, and one
consumer that walks the node's reads (its ranks' batches, step by step, as
cache.simulate models them) through a Prefetcher fed with the plan,
reading each sample's bytes from the cached shard at a fixed rate just under
the link (90%). Nodes run side by side. For each cache size (25%, 50%, 100%
of the dataset, per node), plan (`block` with the window the budget holds,
`global`, `global` with locality-aware dealing) and policy (Belady: the
prefetcher publishes the plan as the cache's lookahead; LRU: it publishes
none, and the cache falls back to least recently used), over two epochs:
bytes fetched per node (x dataset, x the node's share), the simulator's
prediction, stall fraction (time waiting for a shard / epoch time) and
epoch time. Also: cold-fetch throughput of one cache + prefetcher (2
threads) against the link.

Writes cache.md, cache.json and cache.png to --out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

from shardfeed.tools.bench import results

NODES, RANKS_PER_NODE, BATCH = 2, 2, 4
FRACTIONS = (0.25, 0.5, 1.0)
CONSUMER = 0.9  # consumer rate / link bandwidth
AHEAD_SHARDS = 2  # prefetch window, in shards
SETUPS = {  # shards, samples per shard, bytes per sample, link bytes/s
    "full": (48, 8, 128 << 10, 8 << 20),
    "quick": (32, 8, 32 << 10, 8 << 20),
}
PLANS = [("block", {}), ("global", {}), ("global+locality", {"locality": True})]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip()
    results.add_out(parser)
    parser.add_argument("--quick", action="store_true", help="an 8 MiB dataset on an 8 MiB/s link (about a minute)")
    parser.add_argument("--setup", default=None, metavar="SHARDS,SAMPLES,SAMPLE_BYTES,LINK_BYTES_PER_S",
                        help="a dataset and link of your own (tests use a tiny one), e.g. 16,4,2048,2000000")
    parser.add_argument("--fractions", default="0.25,0.5,1.0", metavar="F,F,...",
                        help="cache sizes per node as fractions of the dataset")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")


def write_dataset(root: str, shards: int, per_shard: int, sample_bytes: int) -> None:
    from shardfeed.formats import ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(root, max_shard_samples=per_shard) as w:
        for i in range(shards * per_shard):
            w.write({"__key__": f"{i:08d}", "cls": i % 10,
                     "bin": rng.integers(0, 256, sample_bytes, dtype=np.uint8).tobytes()})


def run_node(index, acc, url: str, cache_dir: str, limit: int, belady: bool, sample_bytes: int, rate: float) -> dict:
    """One node's two epochs: per epoch bytes fetched, stall seconds, seconds."""
    from shardfeed.cache import Prefetcher, ShardCache, ShardRef

    refs = [ShardRef(f"{url}/{index.names[s]}", index.hashes[s], int(index.sizes[s])) for s in acc.shards]
    ahead = AHEAD_SHARDS * int(index.sizes.max())
    epochs = []
    with ShardCache(cache_dir, limit, share_lookahead=False) as cache:
        # LRU: an empty published plan makes every entry "unplanned", evicted least recently used first
        pf = Prefetcher(cache, refs, ahead, threads=2, plan_len=4096 if belady else 0)
        try:
            for e in range(acc.epochs):
                t0, f0, stall = time.monotonic(), cache.stats()["bytes_fetched"], 0.0
                for i in range(int(acc.bounds[e]), int(acc.bounds[e + 1])):
                    t = time.monotonic()
                    with pf.hold(i) as path:
                        stall += time.monotonic() - t
                        t = time.monotonic()
                        want = int(acc.samples[i]) * sample_bytes
                        with open(path, "rb") as f:
                            os.pread(f.fileno(), want, 0)
                    # the rest of the time the consumer spends on these samples
                    spare = want / rate - (time.monotonic() - t)
                    if spare > 0:
                        time.sleep(spare)
                epochs.append({"bytes": cache.stats()["bytes_fetched"] - f0, "stall_s": stall,
                               "seconds": time.monotonic() - t0})
        finally:
            pf.close()
    return {"epochs": epochs}


def run_config(index, root, work, fraction, plan, opts, policy, setup) -> dict:
    from shardfeed.cache.planning.simulate import block_window, plan_accesses, simulate
    from shardfeed.cache.storage.disk_blocks import block_size, empty_cache_bytes, rounded
    from shardfeed.shuffling.spec import Job, PlanSpec
    from shardfeed.tools.bench.throttled_http import ThrottledServer

    _, per_shard, sample_bytes, link = setup
    total = int(index.sizes.sum())
    limit = int(round(fraction * total))
    # the real cache charges the disk's blocks (budget.py): its limit is the same share of the dataset as the
    # disk holds it, plus the cache's own folders, so "100%" holds every shard there as it does in the simulator
    block = block_size(work)
    charged = int(round(fraction * sum(rounded(int(s), block) for s in index.sizes))) + empty_cache_bytes(block)
    job = Job(NODES * RANKS_PER_NODE, (BATCH,) * (NODES * RANKS_PER_NODE), RANKS_PER_NODE)
    order = plan.split("+")[0]
    opts = dict(opts)
    biggest = int(index.sizes.max())
    if order == "block":
        # the prefetcher reserves its window plus the shard in use
        opts["block_shards"] = block_window(index.sizes, limit, RANKS_PER_NODE, (AHEAD_SHARDS + 1) * biggest)
    spec = PlanSpec(index.counts, order, seed=0, **opts)
    results, threads, servers = [None] * NODES, [], []
    for node in range(NODES):
        acc = plan_accesses(spec, job, node, (0, 1))
        sim = simulate(index.sizes, acc, limit, policy).tolist()
        e1, e2 = (set(acc.shards[acc.bounds[k]:acc.bounds[k + 1]].tolist()) for k in (0, 1))
        new_bytes = int(index.sizes[sorted(e2 - e1)].sum())  # epoch 2's shards the node never read before
        server = ThrottledServer(root, link).__enter__()
        servers.append(server)
        cdir = os.path.join(work, f"cache-{node}")
        shutil.rmtree(cdir, ignore_errors=True)

        def go(node=node, acc=acc, sim=sim, new_bytes=new_bytes, url=server.url, cdir=cdir):
            try:
                r = run_node(index, acc, url, cdir, charged, policy == "belady", sample_bytes, CONSUMER * link)
                results[node] = dict(r, sim=sim, new_bytes=new_bytes)
            except BaseException as e:  # noqa: BLE001 - reported by the caller, not lost in a thread
                results[node] = {"error": f"{type(e).__name__}: {e}"}

        threads.append(threading.Thread(target=go, name=f"bench-node-{node}", daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in servers:
        s.__exit__(None, None, None)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"cache bench {plan}/{policy} at {fraction:.0%}: {errors[0]}")
    row = {"fraction": fraction, "plan": plan, "policy": policy, "limit": limit,
           "window": opts.get("block_shards"), "epochs": [],
           "refetched_epoch2": int(sum(max(0, r["epochs"][1]["bytes"] - r["new_bytes"]) for r in results))}
    for e in range(2):
        per = [r["epochs"][e] for r in results]
        secs = float(np.mean([p["seconds"] for p in per]))
        row["epochs"].append({
            "bytes_per_node": float(np.mean([p["bytes"] for p in per])),
            "x_dataset": float(np.mean([p["bytes"] for p in per])) / total,
            "x_share": float(np.mean([p["bytes"] for p in per])) / (total / NODES),
            "sim_x_dataset": float(np.mean([r["sim"][e] for r in results])) / total,
            "stall": float(np.mean([p["stall_s"] / max(p["seconds"], 1e-9) for p in per])),
            "seconds": secs,
        })
    return row


def cold_throughput(index, root, work, link: float) -> dict:
    """One cache, one prefetcher of 2 threads, every shard once, against the link."""
    from shardfeed.cache import Prefetcher, ShardCache, ShardRef
    from shardfeed.tools.bench.throttled_http import ThrottledServer

    cdir = os.path.join(work, "cache-cold")
    shutil.rmtree(cdir, ignore_errors=True)
    with ThrottledServer(root, link) as server, ShardCache(cdir, int(index.sizes.sum()) * 2,
                                                           share_lookahead=False) as cache:
        refs = [ShardRef(f"{server.url}/{n}", h, int(s)) for n, h, s in zip(index.names, index.hashes, index.sizes)]
        t0 = time.monotonic()
        with Prefetcher(cache, refs, AHEAD_SHARDS * int(index.sizes.max()), threads=2) as pf:
            for i in range(len(refs)):
                pf.get(i)
        secs = time.monotonic() - t0
        got = cache.stats()["bytes_fetched"]
    return {"bytes": got, "seconds": secs, "bytes_per_s": got / secs, "link_bytes_per_s": link,
            "of_link": got / secs / link}


def targets(rows) -> list[tuple[str, bool, str]]:
    out = []
    full = [r for r in rows if r["fraction"] == 1.0]
    if full:
        worst_bytes = max(r["epochs"][1]["bytes_per_node"] for r in full)
        worst_stall = max(r["epochs"][1]["stall"] for r in full)
        refetched = max(r["refetched_epoch2"] for r in full)
        zero = [r["plan"] for r in full if r["epochs"][1]["bytes_per_node"] == 0]
        out.append(("at 100%: no bytes fetched in epoch 2",
                    worst_bytes == 0, f"most fetched by a node {worst_bytes:,.0f} B; zero for "
                    f"{', '.join(sorted(set(zero))) or 'none'}; bytes of shards fetched a second time: {refetched:,} "
                    "(a node of a multi-node job first reads some shards in epoch 2)"))
        out.append(("at 100%: no shard fetched twice", refetched == 0, f"{refetched:,} B fetched again"))
        out.append(("at 100%: stall < 5% in epoch 2 (warm)", worst_stall < 0.05, f"worst {worst_stall:.1%}"))
    for plan, _ in PLANS:
        if not any(r["fraction"] == 0.5 and r["plan"] == plan for r in rows):
            continue
        pair = {r["policy"]: r["epochs"][1]["bytes_per_node"] for r in rows if r["fraction"] == 0.5 and r["plan"] == plan}
        saved = 1 - pair["belady"] / pair["lru"] if pair["lru"] else 0.0
        out.append((f"at 50%, {plan}: Belady >= 25% fewer bytes than LRU (epoch 2)", saved >= 0.25,
                    f"{saved:.0%} fewer"))
    share = 1.0 / NODES
    loc = [r for r in rows if r["plan"] == "global+locality" and r["fraction"] == share and r["policy"] == "belady"]
    for r in loc:
        e1, e2 = r["epochs"][0]["x_share"], r["epochs"][1]["x_share"]
        for name, x in (("epoch 1 (cold)", e1), ("epoch 2", e2)):
            out.append((f"global+locality, cache = dataset/nodes: <= 1.1x dataset/nodes fetched per node, {name}",
                        x <= 1.1, f"{x:.2f}x"))
    return out


def markdown(rows, cold, setup, total, checks) -> str:
    shards, per_shard, sample_bytes, link = setup
    from shardfeed.tools.size_options import human_bytes

    lines = [f"Dataset {shards} shards x {per_shard} samples x {human_bytes(sample_bytes)} = {human_bytes(total)}; "
             f"{NODES} nodes x {RANKS_PER_NODE} ranks, batch {BATCH} per rank; each node's link "
             f"{human_bytes(link)}/s, consumer at {CONSUMER:.0%} of it; prefetch window {AHEAD_SHARDS} shards. "
             "Bytes are per node (mean of the nodes), as a multiple of the dataset, [x the node's share]; "
             "sim: cache.simulate's exact prediction for the same sequence and policy.", "",
             "| cache | plan | policy | fetched epoch 1 | fetched epoch 2 | sim e1 / e2 | stall e1 / e2 "
             "| epoch time e1 / e2 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e1, e2 = r["epochs"]
        plan = r["plan"] + (f" (window {r['window']})" if r["window"] else "")
        lines.append(f"| {r['fraction']:.0%} | {plan} | {r['policy']} | {e1['x_dataset']:.2f}x [{e1['x_share']:.2f}x] "
                     f"| {e2['x_dataset']:.2f}x [{e2['x_share']:.2f}x] | {e1['sim_x_dataset']:.2f}x / "
                     f"{e2['sim_x_dataset']:.2f}x | {e1['stall']:.0%} / {e2['stall']:.0%} "
                     f"| {e1['seconds']:.2f} s / {e2['seconds']:.2f} s |")
    lines += ["", f"Remote read throughput (one process, ShardCache + Prefetcher with 2 threads, cold, every shard "
                  f"once): {human_bytes(cold['bytes_per_s'])}/s against the link's {human_bytes(link)}/s "
                  f"({cold['of_link']:.0%}).", "", "Targets:", ""]
    lines += [f"- {'met' if ok else 'MISSED'}: {name} ({detail})" for name, ok, detail in checks]
    return "\n".join(lines) + "\n"


def plot(rows, path: str) -> None:
    _, fig, (axes,) = results.figure(1, 2, figsize=(11, 4))
    labels = [f"{p}\n{pol}" for p, _ in PLANS for pol in ("belady", "lru")]
    x = np.arange(len(labels))
    for k, f in enumerate(sorted({r["fraction"] for r in rows})):
        sel = {(r["plan"], r["policy"]): r for r in rows if r["fraction"] == f}
        got = [sel[(p, pol)]["epochs"][1] for p, _ in PLANS for pol in ("belady", "lru")]
        axes[0].bar(x + (k - 1) * 0.27, [g["x_dataset"] for g in got], 0.27, label=f"cache {f:.0%}")
        axes[1].bar(x + (k - 1) * 0.27, [g["stall"] for g in got], 0.27, label=f"cache {f:.0%}")
    axes[0].set_ylabel("bytes fetched per node, epoch 2 (x dataset)")
    axes[1].set_ylabel("stall fraction, epoch 2")
    for ax in axes:
        ax.set_xticks(x, labels, fontsize=7)
        ax.legend(fontsize=7)
    results.save(fig, path, dpi=120)


def main(args: argparse.Namespace) -> int:
    from shardfeed.formats import open_index
    from shardfeed.tools.text import show_progress

    setup = SETUPS["quick" if args.quick else "full"]
    if getattr(args, "setup", None):
        try:
            setup = tuple(int(float(v)) for v in args.setup.split(","))
        except ValueError:
            setup = ()
        if len(setup) != 4 or min(setup) < 1:
            print(f"bench cache: --setup {args.setup!r} must be four positive numbers: shards, samples per "
                  "shard, bytes per sample, link bytes per second", file=sys.stderr)
            return 2
    try:
        fractions = tuple(float(v) for v in str(getattr(args, "fractions", "0.25,0.5,1.0")).split(","))
    except ValueError:
        fractions = ()
    if not fractions or min(fractions) <= 0:
        print(f"bench cache: --fractions {args.fractions!r} must be positive numbers, e.g. 0.25,0.5,1.0",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardfeed-bench-cache-") as work:
        root = os.path.join(work, "data")
        write_dataset(root, *setup[:3])
        index = open_index(root)
        total = int(index.sizes.sum())
        configs = [(f, p, o, pol) for f in fractions for p, o in PLANS for pol in ("belady", "lru")]
        bar = None
        if show_progress():
            from tqdm import tqdm
            bar = tqdm(total=len(configs), desc="bench cache", unit="run", file=sys.stderr)
        rows = []
        for f, p, o, pol in configs:
            rows.append(run_config(index, root, work, f, p, o, pol, setup))
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()
        cold = cold_throughput(index, root, work, setup[3])
    checks = targets(rows)
    text = markdown(rows, cold, setup, total, checks)
    results.write(args.out, {"cache.md": text, "cache.json": {
        "setup": dict(zip(("shards", "samples_per_shard", "sample_bytes", "link_bytes_per_s"), setup),
                      nodes=NODES, ranks_per_node=RANKS_PER_NODE, batch=BATCH, consumer=CONSUMER),
        "dataset_bytes": total, "rows": rows, "cold": cold,
        "targets": [{"target": n, "met": ok, "detail": d} for n, ok, d in checks]}})
    if not args.no_plot:
        plot(rows, os.path.join(args.out, "cache.png"))
    print(text, end="")
    print(f"bench cache: {len(rows)} runs in {time.monotonic() - t_start:.0f} s; "
          f"{sum(ok for _, ok, _ in checks)} of {len(checks)} targets met; results in {args.out}")
    return 0
