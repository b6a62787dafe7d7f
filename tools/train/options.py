"""`shardfeed train`'s options, and the checks that run before any rank starts.

Nothing here imports torch: `shardfeed train --help` and the option errors come at once.
"""

from __future__ import annotations

import argparse
import os
import re

from shardfeed.loader import BatchSchedule, Stage
from shardfeed.tools.size_options import size_option
from shardfeed.tools.train import balance_options, metrics

ORDERS = ("none", "shard", "block", "global")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


def image_field(index) -> str | None:
    """The first image field of ``index`` (by its extension), or None."""
    for f in index.fields:
        if f.rsplit(".", 1)[-1] in IMAGE_EXTS:
            return f
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("data", help="training data: a dataset folder (shards + index.arrow) or URL prefix, with jpg/png + cls fields")
    a("--eval-data", default=None,
      help="held-out dataset with the same fields (default: none, and the accuracy printed each epoch is "
           "the training accuracy, on DATA itself, and says so)")
    a("--ranks", type=int, default=2, help="local CPU ranks to spawn when not under torchrun")
    a("--epochs", type=int, default=3, help="passes over DATA (ignored with --follow: the stream is one pass)")
    a("--batch-size", default="64",
      help="samples per step on each rank: an int, or one per rank (24,8: dual-batch on mixed hardware)")
    a("--schedule", default=None,
      help="batch and image size over epochs: stages BATCH[@SIZE][xEPOCHS] separated by commas, BATCH an int or "
           "per-rank sizes joined by + (e.g. 64@16x2,32@32: 2 epochs at 16 px, then 32 px); overrides --batch-size")
    a("--cycle", action="store_true", help="repeat --schedule from its first stage after its last")
    a("--shuffle", choices=ORDERS, default="global", help="sample order (none reads the stored order)")
    a("--workers", type=int, default=1, help="loader worker processes per rank")
    a("--lr", type=float, default=0.1,
      help="SGD learning rate (momentum 0.9) at a global batch of --lr-batch; scaled linearly with the global batch")
    a("--lr-batch", type=int, default=128, help="global batch size --lr is given for")
    a("--warmup-steps", type=int, default=10, help="steps of linear LR warm-up, then cosine decay to the last epoch")
    a("--image-size", type=int, default=None, help="train at this image side (default: as stored, or the schedule's)")
    a("--image-field", default=None, help="image field (default: the first jpg/png/webp field of the index)")
    a("--classes", type=int, default=None, help="number of classes (default: max label + 1, read from local data)")
    a("--seed", type=int, default=0, help="seed of the model init and the shuffle")
    a("--threads", type=int, default=1, help="torch intra-op threads per rank")
    a("--device", choices=("auto", "cpu", "cuda"), default="auto",
      help="cuda (NCCL, bf16 autocast, pinned memory) where available, else cpu (gloo)")
    a("--cache-dir", default=None, help="node-local shard cache for a URL source")
    a("--cache-limit", default=None, type=size_option, help="bytes the cache may hold, e.g. 64MB (needs --cache-dir)")
    a("--follow", action="store_true", help="train on a growing dataset as shards are published, until its end commit")
    a("--replay", type=float, default=0.0, help="with --follow: share of each global batch drawn from older samples")
    a("--window", type=int, default=None, help="with --follow: replay from the last N commits only (default: all)")
    a("--idle-timeout", type=float, default=600.0, help="with --follow: seconds without a commit before giving up")
    a("--collective-timeout", type=float, default=300.0,
      help="seconds a rank waits in a collective (all_reduce) for the others before failing, not hanging")
    a("--checkpoint", default=None, help="checkpoint file (model, optimizer, LR scheduler, loader state)")
    a("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: at epoch ends only)")
    a("--resume", action="store_true", help="continue from --checkpoint when it exists (any world size)")
    a("--init", default=None, help="start from the model weights of this checkpoint (fresh optimizer and data)")
    a("--max-steps", type=int, default=0, help="stop after this many steps in all, with a checkpoint (0: no limit)")
    a("--log-every", type=int, default=10, help="a log line every N steps")
    a("--plot", default=None, help="PNG of loss, samples/s and stall over steps (default: beside the checkpoint, "
                                   "else train-plot.png; 'none': no plot)")
    a("--audit", action="store_true",
      help="record every sample each rank delivers (Loader(audit=True)), also of a --follow stream (not with "
           "--replay); the records go beside --checkpoint (CHECKPOINT.audit/), for "
           "`shardfeed audit CHECKPOINT.audit/*.json`")
    metrics.add_arguments(p)  # --tensorboard, --prometheus-port
    a("--trace", default=None, help="folder: each rank appends the keys of every batch it trains on (audits)")
    balance_options.add_arguments(p)


def parse_batch(text: str, where: str = "--batch-size") -> int | tuple[int, ...]:
    parts = re.split(r"[,+]", str(text).strip())
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{where} {text!r} must be an int or per-rank ints separated by commas (e.g. 24,8)") from None
    if any(s < 1 for s in sizes):
        raise ValueError(f"{where} {text!r}: every batch size must be 1 or more")
    return sizes[0] if len(sizes) == 1 else sizes


_STAGE = re.compile(r"^(?P<bs>[\d+]+)(?:@(?P<size>\d+))?(?:x(?P<epochs>\d+))?$")


def parse_schedule(text: str, cycle: bool = False) -> BatchSchedule:
    """``"64@16x2,32@32"`` -> BatchSchedule([Stage(64, 16, 2), Stage(32, 32)])."""
    stages = []
    for part in text.split(","):
        m = _STAGE.match(part.strip())
        if not m:
            raise ValueError(f"--schedule stage {part!r} is not BATCH[@SIZE][xEPOCHS] (e.g. 64@16x2 or 24+8@32)")
        stages.append(Stage(parse_batch(m["bs"], f"--schedule stage {part!r}"),
                            int(m["size"]) if m["size"] else None, int(m["epochs"] or 1)))
    return BatchSchedule(stages, cycle=cycle)


def schedule_of(args) -> BatchSchedule:
    if args.schedule:
        return parse_schedule(args.schedule, args.cycle)
    return BatchSchedule([Stage(parse_batch(args.batch_size))])


def world_of(args) -> int:
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return args.ranks


def check_options(args) -> None:
    for name in ("ranks", "epochs", "workers", "threads", "log_every", "lr_batch"):
        value = getattr(args, name)
        low = 0 if name == "workers" else 1
        if value < low:
            raise ValueError(f"--{name.replace('_', '-')} {value} must be {low} or more")
    for name in ("checkpoint_every", "max_steps", "warmup_steps"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be 0 or more")
    if not args.collective_timeout > 0:
        raise ValueError(f"--collective-timeout {args.collective_timeout} must be more than 0 seconds")
    if args.image_size is not None and args.image_size < 4:
        raise ValueError(f"--image-size {args.image_size} must be 4 or more")
    if args.classes is not None and args.classes < 2:
        raise ValueError(f"--classes {args.classes} must be 2 or more")
    schedule = schedule_of(args)
    world = world_of(args)
    for stage in schedule.stages:
        if isinstance(stage.batch_size, tuple) and len(stage.batch_size) != world:
            raise ValueError(f"batch sizes {','.join(map(str, stage.batch_size))} name {len(stage.batch_size)} ranks "
                             f"but the job has {world}; give one batch size per rank (or one for all)")
    balance_options.check_arguments(args, world)
    if args.cache_limit is not None:
        if args.cache_dir is None:
            raise ValueError(f"--cache-limit {args.cache_limit} needs --cache-dir (where the cache lives)")
    if (args.replay or args.window is not None) and not args.follow:
        raise ValueError(f"--replay {args.replay}/--window {args.window} mix older samples into a followed stream; "
                         "add --follow or drop them")
    if not 0.0 <= args.replay < 1.0:
        raise ValueError(f"--replay {args.replay} must be in [0, 1)")
    if (args.resume or args.max_steps or args.checkpoint_every) and not args.checkpoint:
        raise ValueError("--resume, --max-steps and --checkpoint-every need --checkpoint PATH (where the state goes)")
    if args.audit and not args.checkpoint:
        raise ValueError("--audit saves each rank's record beside the checkpoint; add --checkpoint PATH")
    if args.audit and args.follow and args.replay:
        raise ValueError(f"--audit of a followed stream checks each published sample is delivered once; --replay "
                         f"{args.replay} draws older samples again (with repeats), which it cannot judge: drop "
                         "--audit or --replay")
    metrics.check(args)
    if args.init and not os.path.exists(args.init):
        raise ValueError(f"--init {args.init}: no such checkpoint")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda but torch sees no CUDA device; use --device cpu (or auto)")


def check_data(path: str, follow: bool = False, field: str | None = None) -> str | None:
    """The dataset's image field; raises ShardError naming what the trainer cannot use.

    Runs before any rank is spawned: a problem found inside the ranks would be
    printed once per rank and then buried under torch.multiprocessing's traceback.
    A followed dataset may be empty yet (its samples come later): None then.
    """
    from shardfeed.formats import ShardError, open_index

    if follow:
        from shardfeed.formats.commit_log import open_stream_index

        folder = path.removeprefix("file://")
        if not os.path.isdir(folder):
            raise ShardError(path, "--follow needs the folder of a growing dataset (ShardWriter(append=True)); "
                                   "no such folder")
        index = open_stream_index(folder)[0]
        if index.num_samples == 0 or not index.fields:  # shards published by append record no fields
            return field
    else:
        index = open_index(path)
    found = field if field and field in index.fields else image_field(index)
    missing = [what for what, ok in ((f"an image field ({'/'.join(IMAGE_EXTS)})", found),
                                     ("a cls field (integer label)", "cls" in index.fields)) if not ok]
    if missing:
        has = ", ".join(index.fields) or "none recorded"
        raise ShardError(index.root, f"lacks {' and '.join(missing)}, which train needs (its fields: {has})")
    if index.num_samples == 0:
        raise ShardError(index.root, "holds no samples")
    return found
