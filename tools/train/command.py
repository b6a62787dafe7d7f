"""`shardfeed train`: the reference DDP trainer, fed by the loader.

A small CNN on image shards, on N CPU ranks (gloo) or under torchrun. Each
epoch prints throughput, the time the step waited for data (data stall) and
accuracy on a held-out evaluation set. Launch it either way:

    shardfeed train DATA --ranks 2                 # spawns 2 local ranks
    torchrun --nproc-per-node 2 -m shardfeed.tools.train DATA
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from shardfeed.tools.text import plural


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.strip()
    p.add_argument("data", help="dataset folder (shards + index.arrow) with jpg/png + cls fields")
    p.add_argument("--eval-data", default=None,
                   help="held-out dataset with the same fields (default: DATA itself, i.e. train accuracy)")
    p.add_argument("--ranks", type=int, default=2, help="local CPU ranks to spawn when not under torchrun")
    p.add_argument("--epochs", type=int, default=3, help="passes over DATA")
    p.add_argument("--batch-size", type=int, default=64, help="samples per step on each rank")
    p.add_argument("--workers", type=int, default=1, help="loader worker processes per rank")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--image-size", type=int, default=32, help="side of the square images, in pixels")
    p.add_argument("--classes", type=int, default=None, help="number of classes (default: max label + 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model init and the shuffle")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")


class SmallCNN(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.relu(self.c2(x))
        return self.head(x.mean(dim=(2, 3)))


def _images(batch, field: str) -> torch.Tensor:
    x = batch[field]
    if not torch.is_tensor(x):
        x = torch.stack([torch.as_tensor(a) for a in x])
    return x.permute(0, 3, 1, 2).float().div_(255.0)  # NHWC uint8 -> NCHW float


IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


def _image_field(index) -> str | None:
    for f in index.fields:
        if f.rsplit(".", 1)[-1] in IMAGE_EXTS:
            return f
    return None


def check_data(path: str) -> str:
    """The dataset's image field; raises ShardError naming what the trainer cannot use.

    Runs before any rank is spawned: a problem found inside the ranks would be
    printed once per rank and then buried under torch.multiprocessing's traceback.
    """
    from shardfeed.formats import ShardError, open_index

    index = open_index(path)
    field = _image_field(index)
    missing = [what for what, ok in ((f"an image field ({'/'.join(IMAGE_EXTS)})", field),
                                     ("a cls field (integer label)", "cls" in index.fields)) if not ok]
    if missing:
        has = ", ".join(index.fields) or "none recorded"
        raise ShardError(index.root, f"lacks {' and '.join(missing)}, which train needs (its fields: {has})")
    if index.num_samples == 0:
        raise ShardError(index.root, "holds no samples")
    return field


def _check_options(args) -> None:
    for name in ("ranks", "epochs", "batch_size", "workers", "image_size", "threads"):
        value = getattr(args, name)
        low = 0 if name == "workers" else 1
        if value < low:
            raise ValueError(f"--{name.replace('_', '-')} {value} must be {low} or more")
    if args.classes is not None and args.classes < 2:
        raise ValueError(f"--classes {args.classes} must be 2 or more")


def run_rank(rank: int, world: int, args) -> dict:
    from shardfeed.formats import open_index
    from shardfeed.loader import Loader, ShardDataset

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    index = open_index(args.data)
    field = _image_field(index)  # main() checked the data before spawning this rank
    classes = args.classes or int(_max_label(index)) + 1
    model = nn.parallel.DistributedDataParallel(SmallCNN(classes))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train = Loader(ShardDataset(args.data, shuffle="global", seed=args.seed), batch_size=args.batch_size,
                   num_workers=args.workers)
    report = {}
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        model.train()
        wait0 = train.stats()["wait_s"]  # stats are cumulative: take this epoch's share
        t0, steps, samples, loss_sum = time.perf_counter(), 0, 0, 0.0
        for batch in train:
            x, y = _images(batch, field), batch["cls"].long()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps, samples, loss_sum = steps + 1, samples + len(y), loss_sum + float(loss.detach())
        dt = time.perf_counter() - t0
        wait = train.stats()["wait_s"] - wait0
        acc = evaluate(model.module, args.eval_data or args.data, field, rank, world, args)
        totals = torch.tensor([samples, dt, wait, acc[0], acc[1]], dtype=torch.float64)
        dist.all_reduce(totals)
        if rank == 0:
            n, wait, correct, total = totals[0].item(), totals[2].item() / world, totals[3].item(), totals[4].item()
            report = {"epoch": epoch, "samples_per_s": n / (totals[1].item() / world), "steps": steps,
                      "data_stall_s": wait, "epoch_s": dt, "accuracy": correct / max(1, total),
                      "loss": loss_sum / max(1, steps)}
            print(f"epoch {epoch}: {plural(steps, 'step')}/rank, {report['samples_per_s']:,.0f} samples/s, "
                  f"data stall {wait:.2f}s of {dt:.2f}s ({100 * wait / dt:.1f}%), loss {report['loss']:.3f}, "
                  f"accuracy {100 * report['accuracy']:.1f}%", flush=True)
    train.close() if hasattr(train, "close") else None
    return report


def _max_label(index) -> int:
    from shardfeed.formats import open_shard

    best = 0
    for i in range(len(index)):
        with open_shard(index, i) as r:
            for j in range(len(r)):
                best = max(best, int(r.read(j)["cls"]))
    return best


@torch.no_grad()
def evaluate(model, data: str, field: str, rank: int, world: int, args) -> tuple[int, int]:
    from shardfeed.loader import Loader, ShardDataset

    model.eval()
    loader = Loader(ShardDataset(data, shuffle="none", drop_last=True), batch_size=256, num_workers=0)
    correct = total = 0
    for batch in loader:
        y = batch["cls"].long()
        correct += int((model(_images(batch, field)).argmax(1) == y).sum())
        total += len(y)
    return correct, total


def _worker(rank: int, world: int, port: int, args) -> None:
    from shardfeed.formats import ShardError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        run_rank(rank, world, args)
    except ShardError as e:
        # Bad data met mid-run (a shard checked up front went bad): one line, and
        # exit code 2 tells main() the message is already out.
        print(f"shardfeed train: error: rank {rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check(args) -> str | None:
    """The first problem with the options or the data, as one line; None when all is well."""
    from shardfeed.formats import ShardError

    try:
        _check_options(args)
        check_data(args.data)
        if args.eval_data:
            check_data(args.eval_data)
    except (ValueError, ShardError) as e:
        return str(e)
    return None


def main(args) -> int:
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    problem = _check(args)
    if problem:
        if not under_torchrun or os.environ["RANK"] == "0":  # every rank exits; one says why
            print(f"shardfeed train: error: {problem}", file=sys.stderr)
        return 2
    if under_torchrun:
        dist.init_process_group("gloo")
        try:
            run_rank(dist.get_rank(), dist.get_world_size(), args)
        finally:
            dist.destroy_process_group()
        return 0
    t0 = time.perf_counter()
    try:
        torch.multiprocessing.spawn(_worker, args=(args.ranks, _free_port(), args), nprocs=args.ranks, join=True)
    except torch.multiprocessing.ProcessExitedException as e:
        if e.exit_code == 2:  # the rank printed its one-line error
            return 2
        raise
    print(f"trained {plural(args.epochs, 'epoch')} on {plural(args.ranks, 'rank')} "
          f"in {time.perf_counter() - t0:.1f}s")
    return 0

