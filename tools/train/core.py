"""The reference trainer's core: the part to copy into your own trainer.

``train()`` is a whole DDP training loop on a shardfeed Loader, using only
the public API: ``set_epoch`` every epoch, ``len``/``steps_in_epoch`` for
the LR schedule, ``state_dict()`` saved inside the checkpoint and
``load_state_dict()`` on resume. Under torch.distributed it wraps the model
in DDP; without it (one process) it trains the model as it is.

Dual-batch arithmetic. DDP averages gradients over ranks. Each rank's loss is
its summed loss times ``world / N`` (N: samples in this step on all ranks),
so the average DDP forms is the gradient of the mean loss over the whole
global batch, whatever each rank's share: a rank with 3x the batch weighs
3x. The learning rate is ``lr`` scaled by ``global batch / lr_batch`` (the
linear scaling rule), recomputed when the schedule changes the batch.

Determinism: the LR, momentum and loader position travel in the checkpoint,
so a run stopped at step k and resumed ends with the weights of an
uninterrupted run (given the caller's seeds and deterministic kernels).

Everything else (step log, trace, audit records, evaluation, plot) is an
add-on: ``hooks`` (a ``Hooks``) is called at fixed points; see addons.py.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardfeed.tools.train import checkpoint


def train(loader, model, to_xy, *, epochs: int | None, lr: float, lr_batch: int = 256, warmup_steps: int = 0,
          device=None, checkpoint_path: str | None = None, checkpoint_every: int = 0, max_steps: int = 0,
          resume: bool = False, meta: dict | None = None, hooks: Hooks | None = None) -> tuple[int, bool]:
    """Train ``model`` on ``loader`` to the end of epoch ``epochs - 1`` (None:
    one open-ended epoch, a followed stream). ``to_xy(batch, stage)`` makes
    (inputs, labels) on ``device``. Returns (steps done, stopped by max_steps)."""
    hooks, device = hooks or Hooks(), device or torch.device("cpu")
    distributed = dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    net = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None) if distributed else model
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    shape = LRShape(warmup_steps, 0 if epochs is None else sum(map(loader.steps_in_epoch, range(epochs))))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, shape)
    step, ck = 0, None
    if resume and checkpoint_path and os.path.exists(checkpoint_path):
        ck = checkpoint.load(checkpoint_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        loader.load_state_dict(ck["loader"])  # rank 0's, the same on every rank: also for another world size
        step = ck["step"]
    hooks.on_start(step, ck)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    meta = {"world_size": world, **(meta or {})}

    def save():
        hooks.before_checkpoint(step)
        if rank == 0 and checkpoint_path:
            checkpoint.save(checkpoint_path, model, opt, sched, loader.state_dict(), step=step,
                            history=hooks.history(), meta=meta)
        if distributed:
            dist.barrier()  # nobody runs ahead (or exits) while rank 0 writes
        hooks.after_checkpoint(step)

    stopped = False
    for epoch in range(loader.epoch, loader.epoch + 1 if epochs is None else epochs):
        loader.set_epoch(epoch)
        stage = loader.stage()
        shape.scale = global_batch(stage, world) / lr_batch
        for group, base in zip(opt.param_groups, sched.base_lrs):
            group["lr"] = base * shape(sched.last_epoch)
        hooks.on_epoch(epoch, stage)
        net.train()
        for batch in loader:
            x, y = to_xy(batch, stage)
            with amp:
                out = net(x)
            loss_sum = F.cross_entropy(out.float(), y, reduction="sum")
            both = torch.stack([torch.tensor(float(len(y)), device=device), loss_sum.detach()])
            if distributed:
                dist.all_reduce(both)  # samples and summed loss of the global batch
            opt.zero_grad(set_to_none=True)
            (loss_sum * (world / both[0])).backward()
            opt.step()
            sched.step()
            step += 1
            hooks.on_step(step, epoch, batch, both[1] / both[0])
            if checkpoint_every and step % checkpoint_every == 0:
                save()
            if max_steps and step >= max_steps:
                stopped = True
                break
        hooks.on_epoch_end(epoch, step, stopped)
        save()
        if stopped:
            break
    return step, stopped


class Hooks:
    """What ``train`` calls around its loop; every method here does nothing.
    ``on_step`` gets the global mean loss as a tensor (read it only when
    needed, so a GPU step never waits); ``history()`` is saved in the
    checkpoint and comes back in ``on_start``'s checkpoint dict."""

    def on_start(self, step: int, resumed: dict | None) -> None: ...
    def on_epoch(self, epoch: int, stage) -> None: ...
    def on_step(self, step: int, epoch: int, batch, loss) -> None: ...
    def on_epoch_end(self, epoch: int, step: int, stopped: bool) -> None: ...
    def before_checkpoint(self, step: int) -> None: ...
    def after_checkpoint(self, step: int) -> None: ...

    def history(self) -> list:
        return []


class LRShape:
    """LR multiplier of step ``s``: linear warm-up, cosine decay to ``total``
    steps (none when 0: a followed stream's length is unknown), times
    ``scale`` (global batch / lr_batch). A callable object, not a function,
    so LambdaLR's state_dict keeps its numbers."""

    def __init__(self, warmup: int, total: int):
        self.warmup, self.total, self.scale = warmup, total, 1.0

    def __call__(self, step: int) -> float:
        m = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        if self.total:
            m *= 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(step, self.total) / self.total))
        return self.scale * m


def global_batch(stage, world: int) -> int:
    """Samples in one step on all ranks: per-rank batch sizes add up."""
    return sum(stage.batch_size) if isinstance(stage.batch_size, tuple) else stage.batch_size * world
