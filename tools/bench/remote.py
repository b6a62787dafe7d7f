"""`shardfeed bench remote`: reading a remote dataset through a cache smaller than it.

One loopback HTTP server shaped like a link to an object store (bandwidth
and a per-request latency, in the server: tools/bench/throttled_http.py)
serves a class-ordered tar dataset (samples written class after class).
Each reader reads it for several epochs in the global order through a cache
of --cache-fraction of the dataset (shards and sidecars), with a fixed
compute time per batch, and we measure on the server's side the bytes and
requests of each epoch, and on the reader's side the epoch time, the data
stall (time waiting for a batch / epoch time) and the classes per batch
(how well the order mixes class-ordered data). Readers: shardfeed as it is
(whole shards while they fit, sample ranges after) at 0 and 2 workers,
shardfeed with whole shards only (the cache before sample ranges), and
MosaicML Streaming and LitData with the same cache limit where they are
installed (a row says "not installed" otherwise). The bound column is
1.1 x (1 - f) x dataset; vs_plan: the epoch's bytes over what `shardfeed
plan` predicts for a warm epoch; in_flight: the server's mean requests in
flight while any was; link_s: what the link alone needs for the epoch,
bytes / bandwidth + requests x latency / in_flight (shardfeed's rows: its
server runs in a process of its own, so it takes no CPU from the reader).

Writes remote.md, remote.csv and remote.png to --out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from shardfeed.tools.bench import results

SETUPS = {  # samples, payload bytes, epochs, link bytes/s, latency s, batch, compute s per batch
    # issue 33's link: 100 MB/s shared, 20 ms a request; a consumer of 2,000 samples/s (32 ms a batch of 64)
    "full": (8000, 8 << 10, 3, 100e6, 0.020, 64, 0.032),
    "quick": (512, 8 << 10, 2, 100e6, 0.020, 8, 0.005),
}
GRID_F, GRID_RANKS = (0.25, 0.5, 0.75, 1.0), (1, 2, 4)
GRID_COLUMNS = ["f", "ranks", "x_dataset", "bound_x", "predicted_x", "requests", "stall", "note"]
COLUMNS = ["reader", "epoch", "bytes_fetched", "x_dataset", "bound_x", "vs_plan", "requests", "in_flight",
           "link_s", "epoch_s", "stall", "classes_per_batch", "note"]
CLASSES = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip()
    results.add_out(parser)
    parser.add_argument("--quick", action="store_true", help="a 5 MB dataset, 2 epochs (under 2 minutes)")
    parser.add_argument("--setup", default=None, metavar="SAMPLES,PAYLOAD,EPOCHS,BYTES_PER_S,LATENCY_S,BATCH,COMPUTE_S",
                        help="a dataset and link of your own (tests use a tiny one)")
    parser.add_argument("--cache-fraction", type=float, default=0.5, metavar="F",
                        help="cache limit as a fraction of the dataset (default %(default)s)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--no-peers", action="store_true",
                        help="leave out MosaicML Streaming, LitData and shardfeed on their S3 link (remote_peers.py)")
    parser.add_argument("--grid", action="store_true",
                        help=f"also shardfeed at cache fractions {GRID_F} x {GRID_RANKS} ranks on one node, with "
                             "`shardfeed plan`'s prediction (grid.md; several minutes)")


def write_dataset(root: str, samples: int, payload: int) -> None:
    from shardfeed.formats import ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(root, max_shard_samples=16) as w:
        for i in range(samples):
            w.write({"__key__": f"{i:08d}", "cls": i * CLASSES // samples,
                     "bin": rng.integers(0, 256, payload, dtype=np.uint8).tobytes()})


def _shardfeed(url, cache_dir, limit, epochs, batch, compute_s, srv, whole_only: bool, workers: int = 0):
    from shardfeed.cache.readers import ranged_reads
    from shardfeed.loader import Loader, ShardDataset

    was = ranged_reads.ENABLED
    ranged_reads.ENABLED = False if whole_only else was  # as it is: the default (or SHARDFEED_CACHE_RANGES)
    rows = []
    try:
        ds = ShardDataset(url, shuffle="global", seed=0, cache_dir=cache_dir, cache_limit_bytes=limit)
        with Loader(ds, batch, num_workers=workers) as loader:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                b0, r0, f0, t0 = srv.bytes_sent, srv.requests, srv.flight(), time.perf_counter()
                classes = []
                for b in loader:
                    classes.append(len(set(b["cls"].tolist())))
                    time.sleep(compute_s)
                took = time.perf_counter() - t0
                st = loader.stats()["epoch"]
                nbytes, requests, f1 = srv.bytes_sent - b0, srv.requests - r0, srv.flight()
                flight = (f1[0] - f0[0]) / (f1[1] - f0[1]) if f1[1] > f0[1] else 0.0
                link = nbytes / srv.rate + requests * srv.latency_s / max(1.0, flight)
                rows.append(dict(epoch=epoch, bytes_fetched=nbytes, requests=requests, in_flight=flight, link_s=link,
                                 epoch_s=took, stall=st["stall_fraction"],
                                 classes_per_batch=float(np.mean(classes)), note=""))
    finally:
        ranged_reads.ENABLED = was
        ranged_reads._policies.clear()
    return rows


def _grid_rank(url, cache_dir, limit, rank, world, epochs, batch, compute_s, barrier, out) -> None:
    from shardfeed.cache import CacheLimitError
    from shardfeed.loader import Loader, ShardDataset

    stalls = []
    try:
        ds = ShardDataset(url, shuffle="global", seed=0, cache_dir=cache_dir, cache_limit_bytes=limit, rank=rank,
                          world_size=world)
        with Loader(ds, batch) as loader:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for _ in loader:
                    time.sleep(compute_s)
                stalls.append(loader.stats()["epoch"]["stall_fraction"])
                barrier.wait()  # the node's epoch is over: the parent reads the server's counters
                barrier.wait()
        out.put((rank, stalls, ""))
    except CacheLimitError as e:
        barrier.abort()
        out.put((rank, stalls, f"refused at start: needs {e.needed_bytes:,} bytes"))


def grid(setup, root: str, data: int, sidecars: int, work: str) -> list[dict]:
    """shardfeed over GRID_F x GRID_RANKS (ranks of one node, forked): epochs after the first, by the server."""
    import multiprocessing as mp
    import threading

    from shardfeed.tools.bench.throttled_http import ThrottledServer

    samples, payload, epochs, rate, latency, batch, compute_s = setup
    rows = []
    ctx = mp.get_context("fork")
    for f in GRID_F:
        limit = int(f * (data + sidecars)) + (64 << 10) * (f >= 1.0)  # all of it: room for the index and plans
        for world in GRID_RANKS:
            with ThrottledServer(root, rate, latency) as srv:
                barrier, out = ctx.Barrier(world + 1), ctx.Queue()
                cache_dir = os.path.join(work, f"g-{f}-{world}")
                procs = [ctx.Process(target=_grid_rank, args=(srv.url, cache_dir, limit, r, world, epochs, batch,
                                                              compute_s, barrier, out)) for r in range(world)]
                for p in procs:
                    p.start()
                per_epoch, reqs, before, note = [], [], (0, 0), ""
                try:
                    for _ in range(epochs):
                        barrier.wait(timeout=600)
                        now = (srv.bytes_sent, srv.requests)
                        per_epoch.append(now[0] - before[0])
                        reqs.append(now[1] - before[1])
                        before = now
                        barrier.wait(timeout=600)
                except threading.BrokenBarrierError:
                    note = "refused"
                results = [out.get(timeout=120) for _ in procs]
                for p in procs:
                    p.join(timeout=60)
                note = next((n for _, _, n in results if n), note)
                predicted = _predicted(srv.url, os.path.join(work, f"p-{f}-{world}"), limit, world, batch, epochs)
            later = per_epoch[1:]
            stall = [s for _, st, _ in results for s in st[1:]]
            rows.append(dict(f=f, ranks=world, x_dataset=float(np.mean(later)) / data if later else "",
                             bound_x=1.1 * (1 - f), predicted_x=predicted / data if predicted is not None else "",
                             requests=float(np.mean(reqs[1:])) if later else "",
                             stall=float(np.mean(stall)) if stall else "", note=note))
            print(" | ".join(_fmt(rows[-1][k]) for k in GRID_COLUMNS), flush=True)
    return rows


def _predicted(url, cache_dir, limit, world, batch, epochs, workers: int = 0) -> float | None:
    """`shardfeed plan URL --json`'s mean bytes of the epochs after the first, for shardfeed's policy."""
    import argparse
    import contextlib
    import io
    import json

    from shardfeed.tools import plan_cmd

    p = argparse.ArgumentParser()
    plan_cmd.add_arguments(p)
    args = p.parse_args([url, "--cache-limit", str(limit), "--world-size", str(world), "--batch-size", str(batch),
                         "--epochs", str(epochs), "--seed", "0", "--json", "--cache-dir", cache_dir,
                         "--num-workers", str(workers)])
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        if plan_cmd.main(args) != 0:
            return None
    row = [r for r in json.loads(text.getvalue())["rows"] if r["order"] == "global" and r["policy"] == "shardfeed"]
    return float(np.mean(row[0]["epochs"][1:])) if row and row[0]["epochs"] else None


def run(setup, fraction: float, out: str, plot: bool = True, with_grid: bool = False, peers: bool = True) -> list[dict]:
    from shardfeed.formats import open_index
    from shardfeed.tools.bench.throttled_http import ServerProcess

    samples, payload, epochs, rate, latency, batch, compute_s = setup
    work = tempfile.mkdtemp(prefix="shardfeed-bench-remote-")
    try:
        root = os.path.join(work, "ds")
        write_dataset(root, samples, payload)
        ix = open_index(root)
        data = int(ix.sizes.sum())
        sidecars = sum(os.path.getsize(os.path.join(root, n + ".idx")) for n in ix.names)
        limit = int(fraction * (data + sidecars))
        bound = 1.1 * (1 - fraction)
        table = []
        from shardfeed.cache import CacheLimitError

        predicted = {w: _predicted(root, os.path.join(work, f"plan-{w}"), limit, 1, batch, epochs, w) for w in (0, 2)}
        for name, whole, workers in (("shardfeed", False, 0), ("shardfeed, 2 workers", False, 2),
                                     ("shardfeed (whole shards only)", True, 0)):
            with ServerProcess(root, rate, latency) as srv:
                try:
                    rows = _shardfeed(srv.url, os.path.join(work, f"c-{int(whole)}-{workers}"), limit, epochs, batch,
                                      compute_s, srv, whole, workers)
                except CacheLimitError as e:  # whole shards: one step's shards may not fit a small budget
                    rows = [dict(epoch="", bytes_fetched="", requests="", epoch_s="", stall="",
                                 classes_per_batch="", note=f"refused at start: needs {e.needed_bytes:,} bytes")]
            for r in rows:
                x = r["bytes_fetched"] / data if r["bytes_fetched"] != "" else ""
                vs = r["bytes_fetched"] / predicted[workers] if (not whole and predicted[workers] and
                                                                 r["epoch"] not in ("", 0)) else ""
                table.append(dict(r, reader=name, x_dataset=x, bound_x=bound, vs_plan=vs))
        from shardfeed.tools.bench import remote_peers  # the peers read S3 through the same shaped link

        table += remote_peers.rows(setup, root, data, limit, bound, work) if peers else [
            remote_peers._empty(r, bound, "left out (--no-peers)") for r in remote_peers.READERS]
        os.makedirs(out, exist_ok=True)
        if with_grid:
            rows = grid(setup, root, data, sidecars, work)
            results.write(out, {"grid.md": "Epochs after the first (bytes / dataset, by the server); predicted: "
                                           "`shardfeed plan`.\n\n" + results.table(
                                               list(GRID_COLUMNS), [[_fmt(r[k]) for k in GRID_COLUMNS] for r in rows])
                                           + "\n"})
        _write(table, out, dict(samples=samples, payload=payload, data=data, sidecars=sidecars, limit=limit,
                                fraction=fraction, rate=rate, latency=latency, batch=batch, compute_s=compute_s,
                                epochs=epochs), plot)
        return table
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _write(table, out, info, plot) -> None:
    head = (f"Global order, {info['samples']} class-ordered samples ({info['data']:,} bytes of shards, "
            f"{info['sidecars']:,} of sidecars), cache {info['fraction']:.0%} ({info['limit']:,} bytes), link "
            f"{info['rate'] / 1e6:.0f} MB/s + {info['latency'] * 1e3:.0f} ms per request, batch {info['batch']}, "
            f"{info['compute_s'] * 1e3:.0f} ms compute per batch; bytes and requests counted by the server.")
    lines = [head, "", results.table(list(COLUMNS), [[_fmt(r.get(k, "")) for k in COLUMNS] for r in table])]
    from shardfeed.tools.bench.remote_peers import CONFIG
    ran = [k for k in CONFIG if any(r["reader"] == k and r["epoch"] != "" for r in table)]
    lines += ["", "Peers' configurations (same samples, shard size, cache limit and link):"] * bool(ran)
    lines += [f"- {k}: {CONFIG[k]}" for k in ran]
    results.write(out, {"remote.csv": results.Rows(tuple(COLUMNS), table), "remote.md": "\n".join(lines) + "\n"})
    print("\n".join(lines))
    if plot:
        _, fig, ((ax,),) = results.figure(figsize=(6, 3.5))
        readers = [n for n in dict.fromkeys(r["reader"] for r in table) if any(
            r["reader"] == n and r["epoch"] != "" for r in table)]
        for k, name in enumerate(readers):
            rs = [r for r in table if r["reader"] == name]
            rs = [r for r in rs if r["x_dataset"] != ""]
            width = 0.8 / len(readers)
            ax.bar(np.arange(len(rs)) + k * width, [r["x_dataset"] for r in rs], width, label=name)
        ax.axhline(1.1 * (1 - info["fraction"]), color="k", ls="--", lw=1, label="1.1 x (1 - f)")
        epochs_drawn = max((len([r for r in table if r["reader"] == n and r["x_dataset"] != ""]) for n in readers),
                           default=0)
        ax.set_xticks(np.arange(epochs_drawn) + 0.4 - 0.4 / max(1, len(readers)), range(epochs_drawn))
        ax.set_xlabel("epoch")
        ax.set_ylabel("bytes fetched / dataset")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
        ax.legend(fontsize=7, ncol=2, loc="upper center")
        results.save(fig, os.path.join(out, "remote.png"), dpi=120)


def main(args: argparse.Namespace) -> int:
    setup = SETUPS["quick" if args.quick else "full"]
    if getattr(args, "setup", None):
        try:
            vals = [float(v) for v in args.setup.split(",")]
        except ValueError:
            vals = []
        if len(vals) != 7 or min(vals) < 0:
            print(f"bench remote: --setup {args.setup!r} must be seven numbers >= 0: samples, payload bytes, "
                  "epochs, link bytes/s, latency s, batch, compute s per batch", file=sys.stderr)
            return 2
        setup = (int(vals[0]), int(vals[1]), int(vals[2]), vals[3], vals[4], int(vals[5]), vals[6])
    if not 0 < args.cache_fraction <= 1:
        print(f"bench remote: --cache-fraction {args.cache_fraction} must be in (0, 1]", file=sys.stderr)
        return 2
    run(setup, args.cache_fraction, args.out, plot=not args.no_plot, with_grid=getattr(args, "grid", False),
        peers=not getattr(args, "no_peers", False))
    return 0
