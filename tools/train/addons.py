"""What ``shardfeed train`` adds around the core loop (core.train), as its
hooks: the step log and its records (saved in the checkpoint, so a resumed
run's plot continues the first one's), ``--trace``, ``--audit`` coverage
records, and the held-out evaluation after each epoch."""

from __future__ import annotations

import os

import torch.distributed as dist

from shardfeed.tools.text import plural
from shardfeed.tools.train.audit_records import AuditRecords
from shardfeed.tools.train.core import Hooks
from shardfeed.tools.train.metrics import RankMetrics
from shardfeed.tools.train.steplog import StepLog


class ReferenceHooks(Hooks):
    """``evaluate(stage) -> (correct, total)`` runs after every whole epoch;
    ``report`` is the last epoch's result."""

    def __init__(self, args, rank: int, world: int, loader, device, evaluate, classes: int):
        self.args, self.rank, self.world, self.loader, self.device = args, rank, world, loader, device
        self.evaluate, self.classes = evaluate, classes
        self.log = StepLog(args.log_every, rank)
        self.trace = Trace(args.trace, rank, world)
        self.metrics = RankMetrics(args, rank)  # --tensorboard, --prometheus-port
        self.records, self.stage, self.report = None, None, {}

    def on_start(self, step, resumed):
        if resumed is not None:
            self.log.resumed(resumed["history"])
            if self.rank == 0:
                print(f"resumed from {self.args.checkpoint} at step {step} (epoch {self.loader.epoch}, step "
                      f"{self.loader.state_dict()['step']} of it; saved by {resumed['meta'].get('world_size')} "
                      f"ranks, now {self.world})", flush=True)
        if self.args.audit:
            self.records = AuditRecords(self.args.checkpoint, self.rank, self.world, step)
            if self.rank == 0:
                self.records.discard_future()
            _barrier()

    def on_epoch(self, epoch, stage):
        self.stage = stage
        self.log.start(self.loader)

    def on_step(self, step, epoch, batch, loss):
        self.trace.add(step, epoch, batch["__key__"])
        self.log.step(step, epoch, loss, self.loader, self.device)
        self.metrics.step(step, self.loader, log=self.log)

    def on_epoch_end(self, epoch, step, stopped):
        self.log.step(step, epoch, None, self.loader, self.device, force=True)  # the epoch's last window
        if stopped:
            return
        correct, total = self.evaluate(self.stage)
        held_out = bool(self.args.eval_data)
        self.log.accuracy(correct / max(1, total), held_out)
        self.report = {"epoch": epoch, "accuracy": correct / max(1, total), "eval_samples": total,
                       "held_out": held_out, "classes": self.classes, "steps": step}
        if self.rank == 0:
            print(accuracy_line(epoch, correct, total, self.classes, step, held_out), flush=True)
        self.metrics.write(step, {("eval/accuracy" if held_out else "train/accuracy"): self.report["accuracy"]})

    def before_checkpoint(self, step):
        if self.records is not None:  # before the checkpoint: see audit_records.py
            self.records.write(self.loader, step)
            _barrier()

    def after_checkpoint(self, step):
        if self.records is not None:
            self.records.drop_older(step)

    def history(self):
        return self.log.records


def accuracy_line(epoch: int, correct: int, total: int, classes: int, step: int, held_out: bool) -> str:
    """The evaluation's line: "held-out" only for data the model never trained on (--eval-data)."""
    what = "held-out accuracy" if held_out else "training accuracy"
    note = "" if held_out else " (the training data itself: pass --eval-data for a held-out figure)"
    return (f"epoch {epoch}: {what} {100 * correct / max(1, total):.1f}% on {plural(total, 'sample')} "
            f"(chance {100 / classes:.1f}%), {step} steps so far{note}")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class Trace:
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
