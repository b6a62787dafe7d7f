"""`shardfeed train --balance` and `--slow-rank`: per-rank batch sizes from measured speed.

``--balance``: a ``Balancer`` on every rank agrees every ``--balance-every``
steps (one all_gather_object) on per-rank batch sizes from each rank's
compute time (``ComputeTimer``: forward to last gradient, without the wait
for the other ranks in the all-reduce), keeping the global batch, and
rebalances the loader at the same step. The core loop needs nothing new: its
loss weighting already counts each step's samples on all ranks (core.py), so
a rank with more samples weighs more after every change, and the global
batch (so the LR) stays the same.

``--slow-rank R:F``: a simulation of mixed hardware on one machine. Rank R
repeats its forward and backward work F-1 extra times per training step, on
a copy of the model whose gradients are thrown away: its step takes about F
times as long, as on a slower device. Printed as a simulation.
"""

from __future__ import annotations

import copy

import torch

from shardfeed.tools.train.balance_options import parse_slow_rank
from shardfeed.tools.train.core import Hooks


class SlowRank:
    """Rank work repeated ``factor - 1`` extra times after each training forward (a forward hook):
    the extra forward/backward runs on a copy of the model, so the training is unchanged."""

    def __init__(self, model: torch.nn.Module, factor: int):
        self.shadow = copy.deepcopy(model)  # before any timer's hooks are registered: the copy has none
        self.extra = factor - 1
        self.handle = model.register_forward_hook(self._repeat)

    def _repeat(self, module, args, out) -> None:
        if not module.training or not torch.is_grad_enabled():
            return
        for _ in range(self.extra):
            self.shadow(*args).float().sum().backward()
            self.shadow.zero_grad(set_to_none=True)


class BalanceHooks(Hooks):
    """The trainer's hooks plus a Balancer stepped after every training step."""

    def __init__(self, inner: Hooks, loader, model, rank: int, every: int, timer):
        from shardfeed.loader.balancer import Balancer

        self.inner, self.loader, self.rank, self.timer = inner, loader, rank, timer
        self.balancer = Balancer(loader, every=every)
        self.changes = 0

    def on_start(self, step, resumed):
        self.inner.on_start(step, resumed)

    def on_epoch(self, epoch, stage):
        self.inner.on_epoch(epoch, stage)

    def on_step(self, step, epoch, batch, loss):
        self.inner.on_step(step, epoch, batch, loss)
        if self.balancer.step(compute_s=self.timer.take()) and self.rank == 0:
            e = self.loader.stats()["balance"][-1]
            p, m = e["why"]["proposal"], e["why"]["measured"]
            per_sample = ", ".join(f"{1000 * a:.2f}" for a, _ in p["models"])
            print(f"balance: step {step}: batch sizes {','.join(map(str, e['from']))} -> "
                  f"{','.join(map(str, e['batch_sizes']))} (compute ms per sample by rank: {per_sample}; predicted "
                  f"step {_ms(p['current_s'])} -> {_ms(p['step_s'])} ms; from {sum(x[2] for x in m[0])} steps)",
                  flush=True)

    def on_epoch_end(self, epoch, step, stopped):
        self.inner.on_epoch_end(epoch, step, stopped)

    def before_checkpoint(self, step):
        self.inner.before_checkpoint(step)

    def after_checkpoint(self, step):
        self.inner.after_checkpoint(step)

    def history(self):
        return self.inner.history()


def _ms(s) -> str:
    return "?" if s is None else f"{1000 * s:.1f}"


def wrap(hooks: Hooks, args, rank: int, world: int, loader, model) -> Hooks:
    """The hooks of a run with ``--balance`` / ``--slow-rank`` (``hooks`` unchanged without them)."""
    slow = parse_slow_rank(args.slow_rank, world)
    if slow is not None:
        if rank == 0:
            print(f"simulation: rank {slow[0]} repeats its forward/backward work {slow[1] - 1} extra time(s) per "
                  f"step (--slow-rank {args.slow_rank}), as a device {slow[1]}x slower would", flush=True)
        if rank == slow[0] and slow[1] > 1:
            SlowRank(model, slow[1])
    if not args.balance:
        return hooks
    from shardfeed.loader.step_timer import ComputeTimer

    if rank == 0:
        print(f"balance: per-rank batch sizes from measured compute time, agreed every {args.balance_every} steps "
              f"(start {','.join(map(str, loader.batch_sizes()))})", flush=True)
    return BalanceHooks(hooks, loader, model, rank, args.balance_every, ComputeTimer(model))
