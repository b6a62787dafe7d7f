"""`shardfeed plan DATASET --cache-limit BYTES`: what each shuffle order costs a node's cache.

For each order (none, shard, block with the largest window the budget
holds, global, and global with locality-aware dealing when there are
several nodes) the bytes one node fetches per epoch through a whole-shard
cache of --cache-limit bytes, for Belady (clairvoyant: the cache follows the
plan's lookahead) and LRU, and for the global order what shardfeed's cache
does ("shardfeed": whole shards while they fit, the samples' byte ranges for
the rest, with the room it keeps for the ranges of every reader of the node:
--ranks-per-node x --num-workers). The plan is pure, so this replays the
node's exact sequence (cache.simulate); it is exact for the model (a node's
ranks stepping together; sample ranges priced at the shard's mean sample),
not a guess. DATASET may be a URL: its index is mirrored into --cache-dir and
one sidecar's size is asked (no shard is read).
Exit codes: 0 shown; 2 the dataset could not be opened or an option is invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from shardfeed.tools.size_options import human_bytes, size_option
from shardfeed.tools.text import plural, show_progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1]
    p.add_argument("dataset", metavar="DATASET", help="dataset folder or URL (or anything open_index takes)")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="for a URL: where its index is mirrored (default: a temporary folder)")
    p.add_argument("--cache-limit", required=True, type=size_option, metavar="BYTES",
                   help="each node's cache budget, e.g. 200GB or 64GiB")
    p.add_argument("--world-size", type=int, default=1, metavar="N", help="ranks in the job")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="K",
                   help="ranks sharing one node's cache (default: all ranks on one node)")
    p.add_argument("--batch-size", type=int, default=32, metavar="B", help="per-rank batch size")
    p.add_argument("--num-workers", type=int, default=0, metavar="W",
                   help="the Loader's num_workers on each rank (each worker reads its own batches)")
    p.add_argument("--epochs", type=int, default=2, metavar="E", help="epochs simulated (the cache carries over)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--node", type=int, default=0, help="which node to simulate")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


# argument bounds: past these the simulation would run for hours or overflow int64 sizes
BOUNDS = {"cache_limit": (1, 1 << 60), "world_size": (1, 1 << 16), "batch_size": (1, 1 << 24),
          "epochs": (1, 100), "seed": (0, (1 << 63) - 1), "node": (0, 1 << 16), "num_workers": (0, 1024)}


def _check(args) -> str | None:
    from shardfeed.tools.arg_bounds import count

    for name, (lo, hi) in BOUNDS.items():
        err = count("--" + name.replace("_", "-"), getattr(args, name), lo, hi)
        if err:
            return err
    if args.ranks_per_node is not None and (err := count("--ranks-per-node", args.ranks_per_node, 1, 1 << 16)):
        return err
    if args.world_size < 1:
        return f"--world-size {args.world_size} must be >= 1"
    rpn = args.ranks_per_node or args.world_size
    if not 1 <= rpn <= args.world_size:
        return f"--ranks-per-node {rpn} must be in 1..{args.world_size} (the world size)"
    if args.batch_size < 1 or args.epochs < 1:
        return f"--batch-size {args.batch_size} and --epochs {args.epochs} must be >= 1"
    nodes = -(-args.world_size // rpn)
    if not 0 <= args.node < nodes:
        return f"--node {args.node} is outside 0..{nodes - 1} ({args.world_size} ranks, {rpn} per node)"
    return None


def orders(sizes, limit: int, rpn: int, nodes: int) -> list[tuple[str, dict, str]]:
    """(order, PlanSpec options, note) of each row; a block window the budget cannot hold is a note."""
    from shardfeed.cache.planning.simulate import block_window

    rows = [("none", {}, ""), ("shard", {}, "")]
    try:
        w = block_window(sizes, limit, rpn)
        rows.append(("block", {"block_shards": w}, f"window {w}"))
    except ValueError as e:
        rows.append(("block", None, str(e)))
    rows.append(("global", {}, ""))
    if nodes > 1:
        rows.append(("global", {"locality": True}, "locality"))
    return rows


def ranged_reserve(counts, sizes, limit: int, rpn: int, batch_size: int, sidecar_share: float, workers: int = 0,
                   side_bytes: int | None = None, fixed_bytes: int | None = None, floor: bool = False):
    """The room shardfeed's cache keeps for sample ranges (RangePolicy's reserve, the same
    functions): ``rpn`` ranks, each with ``workers`` readers (num_workers; 0: one);
    ``floor``: (reserve, the worst case of the pins, the metadata and the prefetch windows,
    which the cost model's whole shards may take the rest of)."""
    from shardfeed.cache.readers.ranged_reads import NEAR_STEPS
    from shardfeed.cache.sample_ranges.cost_model import (
        batches_held,
        folder_growth,
        range_reserve,
        range_working,
        whole_charge,
        window_held,
    )
    from shardfeed.cache.storage.eviction import plan_bytes

    total, samples = int(np.sum(sizes)), int(np.sum(counts))
    fixed = rpn * plan_bytes(len(sizes), True) + (0 if fixed_bytes is None else int(fixed_bytes))
    meta = (0 if fixed_bytes is None else int(fixed_bytes)) + folder_growth(len(sizes))
    if int(whole_charge(sizes, sidecar_share).sum()) + meta <= limit:  # as RangePolicy.fits (no plan published)
        return (0, 0) if floor else 0
    readers = rpn * max(1, int(workers))  # every reader of the node pins its own batch
    side = int(sidecar_share * int(np.max(sizes))) if side_bytes is None else int(side_bytes)
    worst = range_working(sizes, counts, side, batch_size, readers)
    headroom = range_working(sizes, counts, side, batch_size, readers, batch_only=True)
    held = batches_held(rpn, readers, NEAR_STEPS)
    reserve = range_reserve(limit, total, sidecar_share, samples, batch_size, held, worst, fixed, headroom)
    windows = window_held(limit, total, sidecar_share, samples, batch_size, held, reserve)
    return (reserve, worst + fixed + windows) if floor else reserve


def ranged_epochs(counts, sizes, acc, limit: int, rpn: int, batch_size: int, sidecar_share: float,
                  **reserve_options) -> list[int]:
    """Bytes per epoch of shardfeed's cache on the global order's accesses ``acc`` (cache.simulate)."""
    from shardfeed.cache.planning.simulate import simulate_ranged
    from shardfeed.cache.readers.ranged_reads import NEAR_STEPS
    from shardfeed.cache.sample_ranges.cost_model import BLOCK, whole_charge

    reserve, floor = ranged_reserve(counts, sizes, limit, rpn, batch_size, sidecar_share, floor=True,
                                    **reserve_options)
    # a whole shard charged as the budget charges it (its blocks and its sidecar's), its admission
    # claiming a block more (admission.claim): in bytes, the plan fitted ~3% more whole shards
    return simulate_ranged(sizes, counts, acc, limit, reserve, sidecar_share, floor_bytes=floor,
                           window=NEAR_STEPS * batch_size * rpn, kept_bytes=whole_charge(sizes, sidecar_share),
                           claim_bytes=BLOCK).tolist()


def simulate_orders(counts, sizes, limit: int, world_size: int, rpn: int, batch_size: int, epochs: int,
                    seed: int = 0, node: int = 0, progress: bool = False, sidecar_share: float = 0.03,
                    **reserve_options) -> list[dict]:
    """One dict per (order, policy): bytes fetched by ``node`` in each epoch
    (``reserve_options``: ``ranged_reserve``'s workers, side_bytes, fixed_bytes)."""
    from shardfeed.cache.planning.simulate import Policy, plan_accesses, simulate
    from shardfeed.shuffling.spec import Job, PlanSpec

    nodes = -(-world_size // rpn)
    job = Job(world_size, (batch_size,) * world_size, rpn)
    rows = orders(sizes, limit, rpn, nodes)
    out = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(rows), desc="simulating", unit="order", file=sys.stderr)
    for order, opts, note in rows:
        base = {"order": order, "locality": bool(opts and opts.get("locality")),
                "window": (opts or {}).get("block_shards"), "note": note}
        if opts is None:
            out.extend(dict(base, policy=p.value, epochs=None) for p in Policy)
        else:
            try:
                acc = plan_accesses(PlanSpec(counts, order, seed, **opts), job, node, range(epochs))
                for p in Policy:
                    out.append(dict(base, policy=p.value, epochs=simulate(sizes, acc, limit, p).tolist()))
                if order == "global" and not base["locality"]:
                    out.append(dict(base, policy="shardfeed",
                                    epochs=ranged_epochs(counts, sizes, acc, limit, rpn, batch_size, sidecar_share,
                                                         **reserve_options)))
            except ValueError as e:  # a sequence too long to simulate exactly
                out.extend(dict(base, policy=p.value, epochs=None, note=str(e)) for p in Policy)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return out


def _open(args):
    """(index, sidecar bytes per shard byte, bytes of mirrored metadata) of DATASET: a URL's
    index mirrored (what the cache holds beside the shards) and one sidecar's size asked (one
    HEAD; the usual 3% when it cannot be had); a local one's sidecars measured."""
    import os
    import tempfile

    from shardfeed.cache.fetching.url_schemes import is_remote
    from shardfeed.cache.fetching.url_sources import open_source
    from shardfeed.cache.readers.ranged_reads import SIDECAR_SHARE
    from shardfeed.formats import ShardError, open_index

    src = str(args.dataset)
    if is_remote(src):
        from shardfeed.cache.remote.remote_index import open_remote_index

        folder = args.cache_dir or tempfile.mkdtemp(prefix="shardfeed-plan-")
        index = open_remote_index(src, folder, limit_bytes=1 << 40)
        share = SIDECAR_SHARE
        if len(index) and index.formats[0].startswith("tar") and int(index.sizes[0]) > 0:
            try:
                share = open_source(index.path(0) + ".idx", stall_s=30.0).size() / int(index.sizes[0])
            except (OSError, ShardError, ValueError):
                pass  # no sidecar to measure: the usual share
        return index, share, index.cache.budget.fixed_bytes(plans=False)  # the mirror, in the disk's blocks
    index = open_index(src)
    side = 0
    for i in range(len(index)):
        try:
            side += os.path.getsize(index.path(i) + ".idx")
        except OSError:
            pass
    from shardfeed.cache.storage.disk_blocks import empty_cache_bytes

    return index, side / max(1, int(index.sizes.sum())), empty_cache_bytes()


def _side_bytes(index) -> int:
    """The largest sidecar the cache assumes a shard has (the start check's estimate)."""
    from shardfeed.cache.readers.reads import entry_bytes

    return int((entry_bytes(index) - np.asarray(index.sizes, np.int64)).max()) if len(index) else 0


def _cell(b: float, dataset: int, share: float) -> str:
    return f"{human_bytes(b)} ({b / dataset:.2f}x, {b / share:.2f}x share)"


def main(args: argparse.Namespace) -> int:
    from shardfeed.formats import ShardError

    err = _check(args)
    if err:
        print(f"shardfeed plan: {err}", file=sys.stderr)
        return 2
    try:
        index, sidecar_share, meta = _open(args)
    except (ShardError, ValueError) as e:
        print(f"shardfeed plan: cannot open {args.dataset}: {e}", file=sys.stderr)
        return 2
    counts, sizes = index.counts, index.sizes
    total = int(sizes.sum())
    if len(index) == 0 or total == 0 or int(counts.sum()) == 0:
        print(f"shardfeed plan: {args.dataset} has no samples to plan", file=sys.stderr)
        return 2
    rpn = args.ranks_per_node or args.world_size
    nodes = -(-args.world_size // rpn)
    share = total / nodes
    t0 = time.monotonic()
    rows = simulate_orders(counts, sizes, args.cache_limit, args.world_size, rpn, args.batch_size, args.epochs,
                           args.seed, args.node, progress=show_progress(args.json), sidecar_share=sidecar_share,
                           workers=args.num_workers, side_bytes=_side_bytes(index), fixed_bytes=meta)
    took = time.monotonic() - t0
    head = {"dataset": args.dataset, "shards": len(index), "samples": int(counts.sum()), "dataset_bytes": total,
            "cache_limit": args.cache_limit, "world_size": args.world_size, "ranks_per_node": rpn,
            "nodes": nodes, "node": args.node, "batch_size": args.batch_size, "epochs": args.epochs,
            "num_workers": args.num_workers, "sidecar_share": round(sidecar_share, 5), "metadata_bytes": meta,
            "node_share_bytes": share}
    if args.json:
        print(json.dumps(dict(head, rows=rows)))
        return 0
    print(f"{args.dataset}: {plural(len(index), 'shard')}, {plural(int(counts.sum()), 'sample')}, "
          f"{human_bytes(total)}; cache {human_bytes(args.cache_limit)} per node "
          f"({args.cache_limit / total:.0%} of the dataset); {plural(args.world_size, 'rank')}, "
          f"{plural(nodes, 'node')} of {rpn}, batch {args.batch_size} per rank"
          + (f", {plural(args.num_workers, 'worker')} each" if args.num_workers else ""))
    later = "later epochs (mean)" if args.epochs > 1 else ""
    print(f"bytes fetched by node {args.node} per epoch (x dataset, x the node's share = dataset / nodes):")
    print()
    cols = ["order", "policy", "first epoch (cold cache)"] + ([later] if later else [])
    lines = []
    for r in rows:
        name = r["order"] + (f" ({r['note']})" if r["note"] and r["epochs"] is not None else "")
        if r["epochs"] is None:
            lines.append([name, r["policy"], f"not simulated: {r['note']}"] + ([""] if later else []))
            continue
        e = r["epochs"]
        cells = [_cell(e[0], total, share)] + ([_cell(float(np.mean(e[1:])), total, share)] if later else [])
        lines.append([name, r["policy"]] + cells)
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *lines)]
    for line in [cols, ["-" * w for w in widths]] + lines:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    print()
    print(f"simulated {plural(len(rows), 'row')} over {plural(args.epochs, 'epoch')} in {took:.1f} s; "
          "shardfeed: the cache's own policy (global order: whole shards while they fit, sample ranges after)")
    return 0
