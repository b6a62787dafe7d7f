"""`shardfeed bench balance`: per-rank batch sizes from measured speed against static splits.

Two CPU ranks (gloo, one torch thread each) train an MLP under DDP on
feature vectors read from shards by a Loader, at a global batch of
``--batch``; one rank is slowed ``F`` times (``--slow-rank``'s simulation:
it repeats its forward/backward work F-1 extra times a step on a copy of
the model). For each F: the equal split, a sweep of static splits (rank 0's
size in steps of ``--sweep-step``), and the Balancer (every ``--every``
steps, ComputeTimer times, starting from the equal split). Throughput is
samples/s of the steps after ``--warmup`` (the balanced run's from its
first change on, so its convergence is paid for). Then the slowdown moves
from one rank to the other mid-run: intervals after the move until the
balanced run is back within 90% of the best static split's samples/s.

Wall time on a shared machine is noisy: every configuration runs in the
same processes, one after another, and the table says which machine.
Writes balance.md (and balance.json) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time

import numpy as np

FEATURES = 128


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip()
    a = parser.add_argument
    a("--batch", type=int, default=256, help="global batch (default: %(default)s)")
    a("--factors", default="2,3", help="slowdowns of rank 1 to run, comma-separated (default: %(default)s)")
    a("--steps", type=int, default=80, help="steps per configuration (default: %(default)s)")
    a("--warmup", type=int, default=10, help="steps not timed at the start (default: %(default)s)")
    a("--every", type=int, default=10, help="steps between the balancer's agreements (default: %(default)s)")
    a("--sweep-step", type=int, default=16, help="rank 0's size step in the static sweep (default: %(default)s)")
    a("--hidden", type=int, default=512, help="MLP width: the compute per sample (default: %(default)s)")
    a("--rounds", type=int, default=3, help="rounds over all configurations; medians are reported "
                                            "(default: %(default)s)")
    a("--quick", action="store_true", help="factor 3 only, one round of 50 steps, a coarse sweep")
    a("--out", default="bench-results", help="folder for the results (default: %(default)s)")


def _write(root: str, n: int) -> None:
    from shardfeed.formats import ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(root, max_shard_samples=1024) as w:
        for i in range(n):
            w.write({"__key__": f"{i:08d}", "npy": rng.standard_normal(FEATURES).astype(np.float32), "cls": i % 10})


def _model(hidden: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def _run(rank: int, sizes, slow: dict, steps: int, warmup: int, args, root: str, balance: bool = False,
         move_at: int | None = None) -> dict:
    """One configuration on this rank: samples/s after warmup (rank 0's wall clock), and with
    ``balance`` the sizes after each agreement. ``slow``: {rank: factor}; ``move_at``: from that step
    the factors swap ranks."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from shardfeed.loader import Loader, ShardDataset
    from shardfeed.loader.balancer import Balancer
    from shardfeed.loader.step_timer import ComputeTimer
    from shardfeed.tools.train.balancing import SlowRank

    model = _model(args.hidden)
    slower = SlowRank(model, max(2, slow.get(rank, 1)))  # the copy is made before the timer's hooks
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = Loader(ShardDataset(root, seed=0, rank=rank, world_size=2), list(sizes))
    timer = ComputeTimer(model)
    bal = Balancer(loader, every=args.every) if balance else None

    def set_slow(factors):
        slower.extra = factors.get(rank, 1) - 1
    set_slow(slow)
    step, t0, marks, busy, late, n_late = 0, None, [], 0.0, 0.0, 0
    while step < steps:
        for batch in loader:
            if step == warmup:
                t0, n0 = time.perf_counter(), 0
            if move_at is not None and step == move_at:
                set_slow({1 - r: f for r, f in slow.items()})
            x, y = batch["npy"], batch["cls"].long()
            loss = F.cross_entropy(net(x), y, reduction="sum")
            both = torch.tensor([float(len(y)), loss.item()])
            dist.all_reduce(both)
            opt.zero_grad(set_to_none=True)
            (loss * (2 / both[0])).backward()
            opt.step()
            step += 1
            compute = timer.take()
            slowest = torch.tensor([compute])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the step's compute-bound time: its slowest rank's
            if t0 is not None:
                n0 += int(both[0])
                busy += float(slowest)
            if step > steps // 2:  # the second half: a balanced run's steady state
                late += float(slowest)
                n_late += int(both[0])
            if bal is not None and bal.step(compute_s=compute):
                marks.append({"step": step, "sizes": list(loader.batch_sizes()), "t": time.perf_counter(), "busy": busy})
            if bal is not None and step % args.every == 0:
                marks.append({"step": step, "sizes": list(loader.batch_sizes()), "t": time.perf_counter(),
                              "busy": busy, "agreement": True})
            if step >= steps:
                break
    elapsed = time.perf_counter() - t0
    log = loader.stats().get("balance", [])
    loader.close()
    return {"sizes": list(sizes), "samples_per_s": n0 / elapsed, "compute_bound": n0 / busy, "steady": n_late / late,
            "final": list(loader.batch_sizes()),
            "marks": marks, "t0": t0, "warmup": warmup, "log": log}


def _worker(rank: int, port: int, args, root: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results: dict = {}
        B = args.batch
        for _ in range(args.rounds):  # every configuration once a round: the machine's drift hits all alike
            for f in args.factor_list:
                slow = {1: f}
                rows = results.setdefault(str(f), {})
                runs = [("equal", (B // 2, B // 2), False)]
                runs += [(f"static {b0},{B - b0}", (b0, B - b0), False)
                         for b0 in range(B // 2 + args.sweep_step, B - 1, args.sweep_step)]
                runs += [("balanced", (B // 2, B // 2), True)]
                for name, sizes, balance in runs:
                    rows.setdefault(name, []).append(_run(rank, sizes, slow, args.steps, args.warmup, args, root,
                                                          balance=balance))
        f = max(args.factor_list)
        results["move"] = _run(rank, (B // 2, B // 2), {1: f}, 2 * args.steps, args.warmup, args, root,
                               balance=True, move_at=args.steps)
        if rank == 0:
            with open(os.path.join(args.tmp, "results.json"), "w") as fh:
                json.dump(results, fh)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(args: argparse.Namespace) -> int:
    import torch.multiprocessing as mp

    if args.quick:
        args.factors, args.steps, args.sweep_step, args.rounds = "3", 50, 32, 1
    args.factor_list = [int(x) for x in str(args.factors).split(",")]
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shardfeed-bench-balance-") as tmp:
        root = os.path.join(tmp, "data")
        _write(root, 4096)
        args.tmp = tmp
        mp.spawn(_worker, args=(_free_port(), args, root), nprocs=2, join=True)
        with open(os.path.join(tmp, "results.json")) as fh:
            results = json.load(fh)
    report = _report(results, args)
    from shardfeed.tools.bench import results as report_writer

    report_writer.write(args.out, {"balance.json": results, "balance.md": report})
    print(report)
    return 0


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _report(results: dict, args) -> str:
    import platform

    lines = [f"2 gloo CPU ranks, one torch thread each, MLP {FEATURES}-{args.hidden}-{args.hidden}-10, global batch "
             f"{args.batch}, {args.steps} steps per configuration ({args.warmup} untimed: the balanced run's "
             f"convergence is timed), balancer every {args.every} steps, median of {args.rounds} round(s); "
             f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end. "
             "Balanced (steady): the compute-bound rate of its second half. Compute-bound: samples over the summed time of each step's slowest rank's own compute (thread CPU "
             "time, forward to last gradient): the rate of dedicated hardware, which other processes on a shared "
             "machine do not move; wall: samples/s as run.", ""]
    best_of = {}
    for key, what in (("compute_bound", "compute-bound samples/s"), ("samples_per_s", "wall samples/s")):
        lines += [f"| rank 1 slowed ({what}) | equal split | best static split (sweep) | balanced: final sizes | "
                  "balanced | balanced / best static | balanced / equal | balanced (steady) / best static |",
                  "|---|---|---|---|---|---|---|---|"]
        for f, rows in results.items():
            if f == "move":
                continue
            rate = {k: _median([r[key] for r in v]) for k, v in rows.items()}
            static = {k: v for k, v in rate.items() if k != "balanced"}
            best_k = max(static, key=static.get)
            best_of.setdefault(f, static[best_k])
            finals = sorted({",".join(map(str, r["final"])) for r in rows["balanced"]})
            lines.append(f"| {f}x | {rate['equal']:,.0f}/s | {static[best_k]:,.0f}/s "
                         f"({','.join(map(str, rows[best_k][0]['sizes']))}) | {'; '.join(finals)} | "
                         f"{rate['balanced']:,.0f}/s | {rate['balanced'] / static[best_k]:.2f} | "
                         f"{rate['balanced'] / rate['equal']:.2f} | "
                         + (f"{_median([r['steady'] for r in rows['balanced']]) / best_of[f]:.2f} |"
                            if key == "compute_bound" else "- |"))
        lines.append("")
    mv = results["move"]
    f = str(max(args.factor_list))
    best = best_of[f]
    changes = "; ".join(f"step {m['step']}: " + ",".join(map(str, m["sizes"])) for m in mv["marks"]
                        if not m.get("agreement"))
    ticks = [m for m in mv["marks"] if m.get("agreement")]
    rates = [(b["step"], args.batch * (b["step"] - a["step"]) / (b["busy"] - a["busy"]))
             for a, b in zip(ticks, ticks[1:]) if b["busy"] > a["busy"]]
    after = [r for s, r in rates if s > args.steps]
    back = next((i + 1 for i, r in enumerate(after) if r >= 0.9 * best), None)
    lines += [f"Slowdown ({f}x) moved from rank 1 to rank 0 at step {args.steps} of {2 * args.steps}: sizes "
                  f"after each change: {changes}. Compute-bound samples/s per interval of {args.every} steps after "
                  f"the move, against the best static split's {best:,.0f}/s: "
                  + ", ".join(f"{r / best:.2f}" for r in after)
                  + f"; back within 90% in interval {back if back is not None else 'none'}."]
    return "\n".join(lines) + "\n"
