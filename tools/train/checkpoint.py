"""Checkpoints of the reference trainer: model, optimizer, LR scheduler and
loader state in one file, written by rank 0 only.

A checkpoint is written to a temporary name in the same folder and renamed
over the old one, so a run killed while writing leaves the previous complete
checkpoint, never a torn file. ``PATH.json`` beside it says which step it
holds (for people and for the demo, which waits for it before killing a run).

The loader's state is the same on every rank (all ranks step together), so
rank 0's copy resumes every rank, also in a job with another world size.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch

VERSION = 1


def save(path: str, model, optimizer, scheduler, loader_state: dict, *, step: int, history: list,
         meta: dict) -> None:
    payload = {"version": VERSION, "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "loader": loader_state, "history": history, "meta": meta}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _atomic_write(path, lambda f: torch.save(payload, f))
    info = {"step": step, "epoch": loader_state["epoch"], "epoch_step": loader_state["step"], **meta}
    _atomic_write(path + ".json", lambda f: f.write(json.dumps(info).encode()))


def _atomic_write(path: str, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load(path: str) -> dict:
    """The checkpoint at ``path``; ValueError naming the file when it is not one of ours."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)  # plain tensors and numbers: no pickled code runs
    except Exception as e:
        raise ValueError(f"{path}: cannot read the checkpoint ({e}); delete it to start over, or pass another "
                         "--checkpoint") from e
    if not isinstance(ck, dict) or ck.get("version") != VERSION:
        got = ck.get("version") if isinstance(ck, dict) else type(ck).__name__
        raise ValueError(f"{path}: checkpoint version {got!r} is not {VERSION} (written by another shardfeed "
                         "train?); delete it to start over")
    return ck
