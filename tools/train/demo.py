"""`shardfeed demo`: the whole path on a small dataset.

Synthesize labelled images (written class by class, the worst case for a
shuffle), shard them with ShardWriter, read them back through the loader
checking every label, then train the reference DDP trainer on 2 CPU ranks
fed by the loader and print throughput, data stall and held-out accuracy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

from tqdm import tqdm

from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset
from shardfeed.tools.train.synth import image_samples
from shardfeed.tools.text import plural, show_progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.strip()
    p.add_argument("--out", default="demo-data", help="working folder (replaced on each run)")
    p.add_argument("--samples", type=int, default=4000, help="labelled images in the training set")
    p.add_argument("--classes", type=int, default=10, help="number of labels")
    p.add_argument("--image-size", type=int, default=32, help="side of the square images, in pixels")
    p.add_argument("--shard-samples", type=int, default=500, help="samples per shard")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (per rank when training)")
    p.add_argument("--workers", type=int, default=2, help="loader worker processes reading the shards back")
    p.add_argument("--ranks", type=int, default=2, help="CPU ranks (gloo) of the training run")
    p.add_argument("--epochs", type=int, default=3, help="training epochs")
    p.add_argument("--eval-samples", type=int, default=1000, help="labelled images in the held-out set")
    p.add_argument("--no-train", action="store_true", help="stop after reading the shards back")


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
          f"({w.bytes_written / 1e6:.1f} MB) in {dt:.1f}s")
    return root, labels


def read_back(root: str, labels: dict, args) -> None:
    """Two epochs through the Loader, every label checked against what was written."""
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
          f"compiling on first use), every label checked")


def main(args) -> int:
    root, labels = build_dataset(args)
    read_back(root, labels, args)
    if args.no_train:
        return 0
    eval_root, _ = build_dataset(args, "eval", args.eval_samples, seed=1)
    from shardfeed.tools.train import command as train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    targs = parser.parse_args([root, "--eval-data", eval_root, "--ranks", str(args.ranks), "--epochs",
                               str(args.epochs), "--batch-size", str(args.batch_size), "--workers", "1",
                               "--classes", str(args.classes), "--image-size", str(args.image_size)])
    print(f"training the reference DDP trainer on {plural(args.ranks, 'CPU rank')} (gloo), 1 loader worker each")
    return train.main(targs)
