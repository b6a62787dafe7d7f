"""One rank of the reference trainer: ``shardfeed train``'s setup around the
core loop (core.py, the part to copy) and its add-ons (addons.py: step log,
trace, audit records, evaluation), then the summary and the plot.

Determinism: one seed for the model and the shuffle and deterministic
kernels, set here; the core keeps the LR, momentum and loader positions in
the checkpoint, so a run stopped at step k and resumed ends with the
weights of an uninterrupted run.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from shardfeed.cache.fetching.url_schemes import is_remote
from shardfeed.tools.train import checkpoint
from shardfeed.tools.train.addons import ReferenceHooks
from shardfeed.tools.train.balancing import wrap
from shardfeed.tools.train.core import train
from shardfeed.tools.train.model import SmallCNN, to_inputs
from shardfeed.tools.train.options import image_field, schedule_of


def pick_device(args) -> torch.device:
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() if dist.is_initialized() else 0))
        torch.cuda.set_device(local % torch.cuda.device_count())
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def make_dataset(args, source: str, *, train: bool):
    from shardfeed.loader import ShardDataset
    from shardfeed.tools.size_options import parse_size

    cache = {}
    if args.cache_dir is not None and is_remote(source):
        cache = {"cache_dir": args.cache_dir,
                 "cache_limit_bytes": parse_size(args.cache_limit) if args.cache_limit else None}
    if not train:
        return ShardDataset(source, shuffle="none", drop_last=True, **cache)
    follow = {"follow": True, "replay": args.replay, "window": args.window,
              "idle_timeout_s": args.idle_timeout} if args.follow else {}
    return ShardDataset(source, shuffle=args.shuffle, seed=args.seed, **cache, **follow)


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
    resuming = args.resume and args.checkpoint and os.path.exists(args.checkpoint)
    if args.init and not resuming:
        model.load_state_dict(checkpoint.load(args.init)["model"])

    def size(stage):
        return stage.image_size or args.image_size

    hooks = ReferenceHooks(args, rank, world, loader, device, classes=classes,
                           evaluate=lambda stage: evaluate(model, args, field, size(stage), device))
    t_start = time.perf_counter()
    step, stopped = train(loader, model, lambda batch, stage: to_inputs(batch, field, device, size(stage)),
                          epochs=None if args.follow else args.epochs, lr=args.lr, lr_batch=args.lr_batch,
                          warmup_steps=args.warmup_steps, device=device, checkpoint_path=args.checkpoint,
                          checkpoint_every=args.checkpoint_every, max_steps=args.max_steps, resume=args.resume,
                          meta={"data": args.data}, hooks=wrap(hooks, args, rank, world, loader, model))
    if stopped and rank == 0:
        print(f"stopped after step {step} (--max-steps); resume with --resume --checkpoint {args.checkpoint}",
              flush=True)
    hooks.trace.close()
    hooks.metrics.close(step, loader)
    loader.close()
    if rank == 0:
        print(hooks.log.summary(step) + f" ({time.perf_counter() - t_start:.1f}s with evaluation)", flush=True)
        plot = _plot_path(args)
        if plot and hooks.log.records:
            from shardfeed.tools.extras import MissingExtra

            try:
                print(f"plot: {hooks.log.plot(plot)}", flush=True)
            except MissingExtra as e:  # the run is done: a missing plotting library costs only the plot
                print(f"plot: skipped ({e})", flush=True)
    return hooks.report


def _plot_path(args) -> str | None:
    if args.plot:
        return None if args.plot == "none" else args.plot
    if args.checkpoint:
        return os.path.splitext(args.checkpoint)[0] + "-plot.png"
    return "train-plot.png"


def _max_label(index) -> int:
    from shardfeed.formats import open_shard

    if index.num_samples == 0 or is_remote(index.root):
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
    if dist.is_initialized():
        dist.all_reduce(correct)
    return int(correct[0].item()), int(correct[1].item())
