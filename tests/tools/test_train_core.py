"""tools/train/core.train in one process (no torch.distributed): the hooks it
calls, and a run cut by max_steps then resumed ending with the weights of an
uninterrupted run (the loader's position travels in the checkpoint)."""

from __future__ import annotations

import numpy as np
import torch

from conftest import labelled_sample
from shardfeed.formats import ShardWriter
from shardfeed.loader import BatchSchedule, Loader, ShardDataset, Stage
from shardfeed.tools.train.core import Hooks, train
from shardfeed.tools.train.model import SmallCNN


def to_xy(batch, stage):
    x = torch.stack([torch.as_tensor(np.frombuffer(b, np.uint8).reshape(4, 4, 3).copy()) for b in batch["bin"]])
    return x.permute(0, 3, 1, 2).float() / 255, torch.as_tensor(batch["cls"]).long()


class Calls(Hooks):
    def __init__(self):
        self.calls, self.records = [], []

    def on_start(self, step, resumed):
        self.calls.append(("start", step, None if resumed is None else resumed["history"]))

    def on_epoch(self, epoch, stage):
        self.calls.append(("epoch", epoch, stage.batch_size))

    def on_step(self, step, epoch, batch, loss):
        self.records.append(step)
        assert torch.isfinite(loss)

    def on_epoch_end(self, epoch, step, stopped):
        self.calls.append(("end", epoch, step, stopped))

    def before_checkpoint(self, step):
        self.calls.append(("save", step))

    def history(self):
        return list(self.records)


def run(root, ck, **kw):
    torch.manual_seed(0)
    loader = Loader(ShardDataset(root, shuffle="global", seed=3), BatchSchedule([Stage(8, epochs=1), Stage(12)]))
    model, hooks = SmallCNN(10), Calls()
    result = train(loader, model, to_xy, epochs=2, lr=0.05, lr_batch=8, warmup_steps=2, checkpoint_path=str(ck),
                   checkpoint_every=4, hooks=hooks, **kw)
    loader.close()
    return result, model, hooks


def test_hooks_and_resume_to_the_weights_of_an_uninterrupted_run(tmp_path):
    root = str(tmp_path / "data")
    with ShardWriter(root, max_shard_samples=16) as w:
        for i in range(48):
            w.write(labelled_sample(i, payload_bytes=48))
    (steps, stopped), whole, hooks = run(root, tmp_path / "whole.pt")
    assert (steps, stopped) == (6 + 4, False)  # 48/8 then 48/12 steps
    assert hooks.calls == [("start", 0, None), ("epoch", 0, 8), ("save", 4), ("end", 0, 6, False), ("save", 6),
                           ("epoch", 1, 12), ("save", 8), ("end", 1, 10, False), ("save", 10)]
    (steps, stopped), _, hooks = run(root, tmp_path / "cut.pt", max_steps=7)
    assert (steps, stopped) == (7, True) and hooks.calls[-2:] == [("end", 1, 7, True), ("save", 7)]
    (steps, _), resumed, hooks = run(root, tmp_path / "cut.pt", resume=True)
    assert steps == 10 and hooks.calls[0] == ("start", 7, list(range(1, 8))) and hooks.records == [8, 9, 10]
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
