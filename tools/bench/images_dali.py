"""NVIDIA DALI's CPU pipeline in `shardfeed bench images`: one timed pass, run by the interpreter of a
venv that has DALI (this file is loaded by path there, so it imports nothing of shardfeed).

The pipeline of DALI's ImageNet training example, on the CPU (``device_id=None``): ``fn.readers.file``
over the ImageFolder layout (``random_shuffle=True``: a shuffle buffer of its default 1,024 samples),
``fn.decoders.image_random_crop`` (decode fused with RandomResizedCrop's crop, at its defaults: area
0.08-1, aspect 3/4-4/3, as torchvision's), ``fn.resize`` to size x size, ``fn.flip`` with a coin flip,
``fn.transpose`` to uint8 CHW; ``num_threads`` = the worker count (1 at 0 workers). Batches are copied
out as numpy arrays (``as_array``), what a CPU training step would take.
"""

from __future__ import annotations

import time


def one_pass(root: str, size: int, workers: int, n: int, batch: int) -> dict:
    from nvidia.dali import fn, pipeline_def, types

    t0 = time.perf_counter()

    @pipeline_def(batch_size=batch, num_threads=max(1, workers), device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return fn.transpose(images, perm=[2, 0, 1]), labels

    p = pipe()
    p.build()
    count = 0
    while count < n:  # the reader wraps into the next epoch: count this epoch's images only
        x = p.run()[0].as_array()
        if x.shape[1:] != (3, size, size) or str(x.dtype) != "uint8":
            return {"status": f"FAILED: batch of shape {x.shape}, {x.dtype}"}
        count += min(len(x), n - count)
    return {"status": "ok", "rate": count / (time.perf_counter() - t0)}


def main(job: dict) -> dict:
    """One pass (fresh.run, under DALI's venv)."""
    try:
        result = one_pass(job["root"], job["size"], job["workers"], job["n"], job["batch"])
    except ImportError as e:
        result = {"status": f"skipped: cannot import DALI ({type(e).__name__}: {e})"}
    return result
