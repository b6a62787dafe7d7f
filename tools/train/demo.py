"""`shardfeed demo`: the whole path on a small dataset, in a few minutes.

1. Synthesize labelled shape images, written class by class (the worst case
   for a shuffle), shard them, and read them back checking every label.
2. Serve the shards from a loopback HTTP server and train the reference DDP
   trainer on 2 CPU ranks through a node-local cache smaller than the
   dataset.
3. Kill that run mid-epoch (SIGKILL, after a checkpoint) and resume it.
4. Fine-tune on a growing dataset while an ingest process publishes it
   (--follow, with replay of older samples).
5. Train again with --shuffle none on the class-ordered data: the baseline
   that shows what the shuffle is worth.
6. Mixed hardware, simulated: one rank 3x slower, equal batch sizes against
   --balance (demo_balance.py).
Prints held-out accuracy beside chance and where the plot is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from tqdm import tqdm

from shardfeed.formats import ShardWriter
from shardfeed.tools.text import plural, show_progress
from shardfeed.tools.train.synth import image_samples

# The fine-tune's LR: the one the first run's cosine ended at (0.1 x 0.02 floor), at the same global batch.
# Measured: at 10x that (--lr 0.02) the followed stream of 1,550 samples took held-out accuracy from 86% to
# 49%, the level the first run had at such LRs mid-training; at this LR it stays at 86%. A stream's length is
# unknown, so there is no cosine to anneal it: a fine-tune starts where the annealing ended.
FOLLOW_LR = 0.002


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.strip()
    p.add_argument("--out", default="demo-data", help="working folder (what an earlier run wrote there is removed first)")
    p.add_argument("--samples", type=int, default=5000, help="labelled images in the training set")
    p.add_argument("--classes", type=int, default=10, help="number of labels")
    p.add_argument("--image-size", type=int, default=32, help="side of the square images, in pixels")
    p.add_argument("--shard-samples", type=int, default=50, help="samples per shard")
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch (per rank when training)")
    p.add_argument("--workers", type=int, default=2, help="loader worker processes reading the shards back")
    p.add_argument("--ranks", type=int, default=2, help="CPU ranks (gloo) of the training run")
    p.add_argument("--epochs", type=int, default=5, help="training epochs")
    p.add_argument("--eval-samples", type=int, default=1000, help="labelled images in the held-out set")
    p.add_argument("--stream-samples", type=int, default=1500, help="images the ingest process publishes")
    p.add_argument("--cache-fraction", type=float, default=0.75, help="cache limit as a share of the dataset's bytes (misses come as sample ranges; with whole shards only, 2 ranks x 32 shards a global step need ~86%% here)")
    p.add_argument("--no-train", action="store_true", help="stop after reading the shards back")
    p.add_argument("--no-baseline", action="store_true", help="skip the --shuffle none comparison run")
    p.add_argument("--no-balance", action="store_true", help="skip the equal vs --balance runs with a rank slowed")


# What a run writes under --out. Each run starts without them: a kept stream ends with its
# end-of-stream commit (the next run's appends were refused), a kept cache or checkpoint would
# carry the last run into this one. Only these go: --out itself may hold the user's files.
OWN = ("train", "eval", "run", "cache", "stream")


def clear_out(out: str) -> None:
    """Remove what an earlier run wrote under ``out`` (``OWN``), and nothing else."""
    for name in OWN:
        path = os.path.join(out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def build_dataset(args, name: str = "train", samples: int | None = None, seed: int = 0) -> tuple[str, dict]:
    root = os.path.join(args.out, name)
    if os.path.exists(root):
        shutil.rmtree(root)
    samples = args.samples if samples is None else samples
    labels = {}
    t0 = time.perf_counter()
    with ShardWriter(root, max_shard_samples=args.shard_samples) as w:
        for s in tqdm(image_samples(samples, args.classes, args.image_size, seed=seed), total=samples,
                      desc=f"shard {name}", unit="img", disable=not show_progress()):
            labels[s["__key__"]] = s["cls"]
            w.write(s)
    dt = time.perf_counter() - t0
    print(f"{name}: wrote {plural(w.samples_written, 'sample')} in {plural(len(w.shards), 'shard')} "
          f"({w.bytes_written / 1e6:.1f} MB) in {dt:.1f}s", flush=True)
    return root, labels


def read_back(root: str, labels: dict, args) -> None:
    """Two epochs through the Loader, every label checked against what was written."""
    from shardfeed.loader import Loader, ShardDataset  # torch: not for `shardfeed demo --help`

    ds = ShardDataset(root, shuffle="global", seed=0)
    rates = []
    with Loader(ds, batch_size=args.batch_size, num_workers=args.workers) as loader:
        for epoch in range(2):  # the first pass includes numba compiling on first use
            loader.set_epoch(epoch)
            seen, t0 = 0, time.perf_counter()
            for batch in tqdm(loader, desc=f"read epoch {epoch}", unit="batch", disable=not show_progress()):
                for key, cls in zip(batch["__key__"], batch["cls"].tolist()):
                    if labels[key] != cls:
                        raise SystemExit(f"demo: sample {key} came back with label {cls}, wrote {labels[key]}")
                seen += len(batch["__key__"])
            rates.append(seen / (time.perf_counter() - t0))
            if seen < len(labels):
                raise SystemExit(f"demo: epoch {epoch} read {plural(seen, 'sample')}, wrote {len(labels)}")
    print(f"read {plural(seen, 'sample')} back through Loader, {plural(args.workers, 'worker')}, global shuffle, "
          f"decoding PNG: {rates[1]:,.0f} samples/s ({rates[0]:,.0f} in the first epoch, which includes numba "
          f"compiling on first use), every label checked", flush=True)


def _train_cmd(args, data: str, *extra) -> list[str]:
    return [sys.executable, "-m", "shardfeed.tools.train", data, "--ranks", str(args.ranks), "--classes",
            str(args.classes), "--batch-size", str(args.batch_size), "--workers", "1", "--log-every", "20", *extra]


def _run(cmd: list[str], tag: str, kill_when=None) -> tuple[int, str]:
    """Run ``cmd`` in its own process group, echoing its lines as ``[tag] ...``;
    ``kill_when()`` true kills the whole group (SIGKILL: no chance to clean up)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def echo():
        for line in p.stdout:
            print(f"  [{tag}] {line.rstrip()}", flush=True)
            lines.append(line.rstrip())

    reader = threading.Thread(target=echo, name=f"demo-{tag}", daemon=True)
    reader.start()
    killed = False
    while p.poll() is None:
        if kill_when is not None and not killed and kill_when():
            os.killpg(p.pid, signal.SIGKILL)
            killed = True
            print(f"  [{tag}] -- killed (SIGKILL) mid-epoch --", flush=True)
        time.sleep(0.05)
    reader.join(timeout=10)
    return (-9 if killed else p.returncode), "\n".join(lines)


def _accuracy(out: str) -> float | None:
    found = re.findall(r"held-out accuracy ([\d.]+)%", out)
    return float(found[-1]) if found else None


def _ingest(root: str, args) -> subprocess.Popen:
    """A separate process that publishes shards to a live dataset, then its end."""
    code = ("import sys, time\nfrom shardfeed.formats import ShardWriter\n"
            "from shardfeed.tools.train.synth import image_samples\n"
            "root, n, classes, size, per = sys.argv[1], *map(int, sys.argv[2:6])\n"
            "with ShardWriter(root, append=True, max_shard_samples=per, prefix='ingest') as w:\n"
            "    for i, s in enumerate(image_samples(n, classes, size, seed=7, class_order=False, first_key=10**8)):\n"
            "        w.write(s)\n"
            "        if (i + 1) % per == 0:\n"
            "            time.sleep(0.3)\n"
            "    w.end_stream()\n")
    return subprocess.Popen([sys.executable, "-c", code, root, str(args.stream_samples), str(args.classes),
                             str(args.image_size), str(args.shard_samples)])


def _audit(ck: str) -> str:
    """`shardfeed audit` over the records --audit left beside the checkpoint: its verdict line."""
    from shardfeed.tools.train.audit_records import folder_of

    folder = folder_of(ck)
    records = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    print(f"\n== shardfeed audit {folder}/*.json ({plural(len(records), 'record')}: the killed run's, to its "
          "last checkpoint, and the resumed run's)", flush=True)
    rc, out = _run([sys.executable, "-m", "shardfeed.tools.cli", "audit", *records], "audit")
    return out.splitlines()[-1] if out else f"shardfeed audit exited with {rc}"


def _compare(ck: str, base_ck: str, path: str) -> str | None:
    """The comparison plot of the two runs' histories (from their checkpoints); None without matplotlib."""
    from shardfeed.tools.extras import MissingExtra
    from shardfeed.tools.train import checkpoint
    from shardfeed.tools.train.steplog import compare_plot

    runs = {"global shuffle (killed, resumed)": checkpoint.load(ck)["history"],
            "--shuffle none": checkpoint.load(base_ck)["history"]}
    try:
        return compare_plot(path, runs, "shardfeed demo: what the shuffle is worth on class-ordered data")
    except MissingExtra as e:
        print(f"comparison plot: skipped ({e})", flush=True)
        return None


def main(args) -> int:
    t_start = time.perf_counter()
    clear_out(args.out)
    root, labels = build_dataset(args)
    read_back(root, labels, args)
    if args.no_train:
        return 0
    eval_root, _ = build_dataset(args, "eval", args.eval_samples, seed=1)
    data_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    ck = os.path.join(args.out, "run", "ck.pt")
    plot = os.path.join(args.out, "run", "train-plot.png")
    from shardfeed.tools.train.serve import serve

    with serve(os.path.abspath(args.out)) as base:
        url, cache_dir = f"{base}/train", os.path.join(args.out, "cache")
        limit = int(data_bytes * args.cache_fraction)
        source = [url, "--cache-dir", cache_dir, "--cache-limit", str(limit)]
        print(f"serving {args.out} at {base}; training reads {url} through a {limit / 1e6:.1f} MB cache "
              f"({args.cache_fraction:.0%} of the {data_bytes / 1e6:.1f} MB dataset)", flush=True)
        common = ["--eval-data", eval_root, "--epochs", str(args.epochs), "--checkpoint", ck,
                  "--checkpoint-every", "10", "--plot", plot, "--audit"]
        steps_per_epoch = -(-args.samples // (args.batch_size * args.ranks))

        def mid_epoch() -> bool:  # a checkpoint inside epoch 1 is on disk
            try:
                with open(ck + ".json") as f:
                    info = json.load(f)
            except (OSError, ValueError):
                return False
            return info["epoch"] >= 1 and 0 < info["epoch_step"] < steps_per_epoch
        print(f"\n== training {plural(args.ranks, 'CPU rank')} (gloo), global shuffle; killed mid-epoch 1", flush=True)
        rc, _ = _run(_train_cmd(args, source[0], *source[1:], *common), "train", kill_when=mid_epoch)
        if rc not in (0, -9):
            return 1
        print("\n== resuming from the last checkpoint (model, optimizer, LR scheduler, loader position)", flush=True)
        rc, out = _run(_train_cmd(args, source[0], *source[1:], *common, "--resume"), "resume")
        if rc:
            return 1
        acc = _accuracy(out)
        verdict = _audit(ck)

    stream = os.path.join(args.out, "stream")
    with ShardWriter(stream, append=True, max_shard_samples=args.shard_samples, prefix="seed") as w:
        for s in image_samples(args.shard_samples, args.classes, args.image_size, seed=6, class_order=False,
                               first_key=2 * 10**8):
            w.write(s)
    print(f"\n== an ingest process publishes {plural(args.stream_samples, 'image')} to {stream} while the trainer "
          f"follows it (--follow, 25% replay of the last 4 commits), starting from the weights above at the LR "
          f"their schedule ended with (--lr {FOLLOW_LR})", flush=True)
    ingest = _ingest(stream, args)
    rc, out = _run(_train_cmd(args, stream, "--follow", "--replay", "0.25", "--window", "4", "--init", ck,
                              "--eval-data", eval_root, "--plot", "none", "--lr", str(FOLLOW_LR), "--warmup-steps", "0",
                              "--idle-timeout", "120"), "follow")
    ingest.wait(timeout=120)
    if rc:
        return 1
    follow_acc = _accuracy(out)

    base_acc = compared = None
    if not args.no_baseline:
        print("\n== the same training with --shuffle none on the class-ordered data (the baseline)", flush=True)
        base_ck = os.path.join(args.out, "run", "baseline.pt")
        rc, out = _run(_train_cmd(args, root, "--eval-data", eval_root, "--epochs", str(args.epochs),
                                  "--shuffle", "none", "--plot", "none", "--checkpoint", base_ck), "no-shuffle")
        base_acc = _accuracy(out) if rc == 0 else None
        if rc == 0:
            compared = _compare(ck, base_ck, os.path.join(args.out, "run", "shuffle-compared.png"))
    balanced = None
    if not args.no_balance:
        from shardfeed.tools.train.demo_balance import balance_phase

        balanced = balance_phase(args, _train_cmd, _run, root, os.path.join(args.out, "run"))
    chance = 100 / args.classes
    print(f"\nheld-out accuracy: {acc:.1f}% with global shuffle (chance {chance:.1f}%)"
          + (f", {follow_acc:.1f}% after following the stream" if follow_acc is not None else "")
          + (f"; {base_acc:.1f}% with --shuffle none on the class-ordered data" if base_acc is not None else ""))
    print(f"coverage audit of the killed and resumed run (shardfeed audit, every rank's record): {verdict}")
    print(f"plot of loss, samples/s, data stall and accuracy over steps, the resume marked: {plot}")
    if compared:
        print(f"plot of global shuffle against --shuffle none (loss, accuracy): {compared}")
    if balanced:
        print(balanced)
    print(f"demo finished in {time.perf_counter() - t_start:.0f}s")
    return 0
