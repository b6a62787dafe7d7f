"""One rank of the reference trainer: the training loop.

Dual-batch arithmetic. DDP averages gradients over ranks. Each rank's loss is
its summed loss times ``world / N`` (N: samples in this step on all ranks),
so the average DDP forms is the gradient of the mean loss over the whole
global batch, whatever each rank's share: a rank with 3x the batch weighs
3x. The learning rate is ``--lr`` scaled by ``global batch / --lr-batch``
(the linear scaling rule), recomputed when the schedule changes the batch.

Determinism: one seed for the model and the shuffle, deterministic kernels,
and the LR, momentum and loader positions in the checkpoint, so a run
stopped at step k and resumed ends with the weights of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardfeed.tools.text import plural
from shardfeed.tools.train import checkpoint
from shardfeed.tools.train.audit_records import AuditRecords
from shardfeed.tools.train.model import SmallCNN, image_field, to_inputs
from shardfeed.tools.train.options import is_url, schedule_of
from shardfeed.tools.train.steplog import StepLog


class LRShape:
    """LR multiplier of step ``s``: linear warm-up, cosine decay to ``total``
    steps (none when 0: a followed stream's length is unknown), times
    ``scale`` (global batch / --lr-batch). A callable object, not a function,
    so LambdaLR's state_dict keeps its numbers."""

    def __init__(self, warmup: int, total: int):
        self.warmup, self.total, self.scale = warmup, total, 1.0

    def __call__(self, step: int) -> float:
        m = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        if self.total:
            m *= 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(step, self.total) / self.total))
        return self.scale * m


def pick_device(args) -> torch.device:
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() if dist.is_initialized() else 0))
        torch.cuda.set_device(local % torch.cuda.device_count())
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def make_dataset(args, source: str, *, train: bool):
    from shardfeed.loader import ShardDataset
    from shardfeed.tools.byte_sizes import parse_size

    cache = {}
    if args.cache_dir is not None and is_url(source):
        cache = {"cache_dir": args.cache_dir,
                 "cache_limit_bytes": parse_size(args.cache_limit) if args.cache_limit else None}
    if not train:
        return ShardDataset(source, shuffle="none", drop_last=True, **cache)
    follow = {"follow": True, "replay": args.replay, "window": args.window,
              "idle_timeout_s": args.idle_timeout} if args.follow else {}
    return ShardDataset(source, shuffle=args.shuffle, seed=args.seed, **cache, **follow)


def _global_batch(stage, world: int) -> int:
    return sum(stage.batch_size) if isinstance(stage.batch_size, tuple) else stage.batch_size * world


def _planned_steps(loader, args) -> int:
    if args.follow:
        return 0
    return sum(loader.feed.steps(e, history=()) for e in range(args.epochs))


def run_rank(rank: int, world: int, args) -> dict:
    from shardfeed.loader import Loader

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = pick_device(args)
    ds = make_dataset(args, args.data, train=True)
    field = args.image_field or image_field(ds.index) or "png"
    classes = args.classes or _max_label(ds.index) + 1
    loader = Loader(ds, batch_size=schedule_of(args), num_workers=args.workers, pin_memory=device.type == "cuda",
                    audit=args.audit)
    model = SmallCNN(classes).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    shape = LRShape(args.warmup_steps, _planned_steps(loader, args))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, shape)
    step, history = 0, []
    if args.resume and args.checkpoint and os.path.exists(args.checkpoint):
        ck = checkpoint.load(args.checkpoint)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        loader.load_state_dict(ck["loader"])  # rank 0's, the same on every rank: also for another world size
        step, history = ck["step"], ck["history"]
        if rank == 0:
            print(f"resumed from {args.checkpoint} at step {step} (epoch {loader.epoch}, step {loader.state_dict()['step']}"
                  f" of it; saved by {ck['meta'].get('world_size')} ranks, now {world})", flush=True)
    elif args.init:
        model.load_state_dict(checkpoint.load(args.init)["model"])
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    log = StepLog(args.log_every, rank, history)
    trace = _Trace(args.trace, rank, world)
    meta = {"world_size": world, "data": args.data}
    records = AuditRecords(args.checkpoint, rank, world, step) if args.audit else None
    if records is not None:
        if rank == 0:
            records.discard_future()
        dist.barrier()

    def save():
        if records is not None:  # before the checkpoint: see audit_records.py
            records.write(loader, step)
            dist.barrier()
        if rank == 0 and args.checkpoint:
            checkpoint.save(args.checkpoint, model, opt, sched, loader.state_dict(), step=step,
                            history=log.records, meta=meta)
        if dist.is_initialized():
            dist.barrier()  # nobody runs ahead (or exits) while rank 0 writes
        if records is not None:
            records.drop_older(step)

    report, stopped, t_start = {}, False, time.perf_counter()
    last_epoch = loader.epoch + 1 if args.follow else args.epochs
    for epoch in range(loader.epoch, last_epoch):
        loader.set_epoch(epoch)
        stage = loader.stage()
        shape.scale = _global_batch(stage, world) / args.lr_batch
        for group, base in zip(opt.param_groups, sched.base_lrs):
            group["lr"] = base * shape(sched.last_epoch)
        size = stage.image_size or args.image_size
        ddp.train()
        log.start(loader)
        for batch in loader:
            x, y = to_inputs(batch, field, device, size)
            with amp:
                out = ddp(x)
            loss_sum = F.cross_entropy(out.float(), y, reduction="sum")
            both = torch.stack([torch.tensor(float(len(y)), device=device), loss_sum.detach()])
            dist.all_reduce(both)
            n = both[0]
            opt.zero_grad(set_to_none=True)
            (loss_sum * (world / n)).backward()
            opt.step()
            sched.step()
            step += 1
            trace.add(step, epoch, batch["__key__"])
            log.step(step, epoch, both[1] / n, loader, device)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save()
            if args.max_steps and step >= args.max_steps:
                stopped = True
                break
        if stopped:
            log.step(step, epoch, None, loader, device, force=True)
            break
        log.step(step, epoch, None, loader, device, force=True)  # the epoch's last window
        correct, total = evaluate(model, args, field, size, device)
        report = {"epoch": epoch, "accuracy": correct / max(1, total), "eval_samples": total,
                  "classes": classes, "steps": step}
        if rank == 0:
            print(f"epoch {epoch}: held-out accuracy {100 * report['accuracy']:.1f}% on "
                  f"{plural(total, 'sample')} (chance {100 / classes:.1f}%), {step} steps so far", flush=True)
        save()
    if stopped:
        save()
        if rank == 0:
            print(f"stopped after step {step} (--max-steps); resume with --resume --checkpoint {args.checkpoint}",
                  flush=True)
    trace.close()
    loader.close()
    if rank == 0:
        print(log.summary(step) + f" ({time.perf_counter() - t_start:.1f}s with evaluation)", flush=True)
        plot = _plot_path(args)
        if plot and log.records:
            from shardfeed.tools.extras import MissingExtra

            try:
                print(f"plot: {log.plot(plot)}", flush=True)
            except MissingExtra as e:  # the run is done: a missing plotting library costs only the plot
                print(f"plot: skipped ({e})", flush=True)
    return report


def _plot_path(args) -> str | None:
    if args.plot:
        return None if args.plot == "none" else args.plot
    if args.checkpoint:
        return os.path.splitext(args.checkpoint)[0] + "-plot.png"
    return "train-plot.png"


class _Trace:
    """``--trace DIR``: ``DIR/rank<r>-of-<w>.txt`` gets ``step epoch key,key,...`` per step."""

    def __init__(self, folder: str | None, rank: int, world: int):
        self.f = None
        if folder:
            os.makedirs(folder, exist_ok=True)
            self.f = open(os.path.join(folder, f"rank{rank}-of-{world}.txt"), "a")

    def add(self, step: int, epoch: int, keys) -> None:
        if self.f is not None:
            self.f.write(f"{step} {epoch} {','.join(keys)}\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def _max_label(index) -> int:
    from shardfeed.formats import open_shard

    if index.num_samples == 0 or is_url(str(index.root)):
        raise ValueError(f"{index.root}: the number of classes cannot be read from this data yet; pass --classes")
    best = 0
    for i in range(len(index)):
        with open_shard(index, i) as r:
            for j in range(len(r)):
                best = max(best, int(r.read(j)["cls"]))
    return best


@torch.no_grad()
def evaluate(model, args, field: str, size: int | None, device) -> tuple[int, int]:
    """(correct, total) over every rank's share of the held-out set."""
    from shardfeed.loader import Loader

    model.eval()
    correct = torch.zeros(2, dtype=torch.float64, device=device)
    with Loader(make_dataset(args, args.eval_data or args.data, train=False), batch_size=256) as loader:
        for batch in loader:
            x, y = to_inputs(batch, field, device, size)
            correct[0] += (model(x).argmax(1) == y).sum()
            correct[1] += len(y)
    dist.all_reduce(correct)
    return int(correct[0].item()), int(correct[1].item())
