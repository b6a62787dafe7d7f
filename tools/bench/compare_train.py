"""The reference trainer fed by each library, for `shardfeed bench compare`.

The model is the reference trainer's (``tools/train/model.py``: SmallCNN and
``to_inputs``); the step is its loop's step without DDP (forward,
cross-entropy, backward, SGD with momentum). ``tools/train/core.py`` has no
per-step function to call: its ``train`` owns the epochs of a shardfeed
Loader, DDP and checkpoints, so the five lines of a step are repeated here. One process on
the CPU, one torch thread (the machine is shared: one thread keeps the
compute time per step the same for every library), 0 loader workers unless
asked, shuffle on, the 2 KiB benchmark data. Each sample's first
``IMAGE * IMAGE * 3`` payload bytes are its image (uint8 HWC), its class the
label; every library's batch goes through the same conversion.

Per library: steps/s after the first step (which also builds the loader and
warms the model) and the **data stall**: the share of that time spent
waiting for the loader's next batch. With 0 workers the loader works in the
training process, so the stall is its whole cost per step.
"""

from __future__ import annotations

import time

IMAGE = 16  # 16x16x3 = 768 of the 2 KiB payload bytes
STEPS, QUICK_STEPS = 60, 12


def _images(payloads, batch: int):
    """(batch, IMAGE, IMAGE, 3) uint8 from the payloads' first bytes, whatever container they come in."""
    import numpy as np
    import torch

    need = IMAGE * IMAGE * 3
    if torch.is_tensor(payloads):
        return payloads[:, :need].reshape(batch, IMAGE, IMAGE, 3)
    if payloads and torch.is_tensor(payloads[0]):  # bytes_as="tensor": views into the batch buffer
        return torch.stack([p[:need] for p in payloads]).reshape(batch, IMAGE, IMAGE, 3)
    if payloads and isinstance(payloads[0], np.ndarray):
        return torch.from_numpy(np.stack([p[:need] for p in payloads])).reshape(batch, IMAGE, IMAGE, 3)
    flat = np.frombuffer(b"".join(bytes(p[:need]) for p in payloads), dtype=np.uint8)
    return torch.from_numpy(flat.copy()).reshape(batch, IMAGE, IMAGE, 3)


def run_train(job: dict, adapter) -> dict:
    """One child's training run: ``job["steps"]`` steps fed by ``adapter``."""
    import torch
    import torch.nn.functional as F

    from shardfeed.tools.bench.samples import NUM_CLASSES, _as_int_array
    from shardfeed.tools.train.model import SmallCNN, to_inputs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SmallCNN(NUM_CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, nesterov=True)
    cpu = torch.device("cpu")
    steps, wait_s, first_s, loss = 0, 0.0, None, None
    start = time.perf_counter()
    batches = adapter.batches(job["folder"], job["workers"], job["shuffle"], job["batch_size"])
    steady_start = None
    while steps < job["steps"]:
        t0 = time.perf_counter()
        try:
            keys, payloads, classes = next(batches)
        except StopIteration:
            break
        t1 = time.perf_counter()
        n = len(keys)
        y = torch.from_numpy(_as_int_array(classes).copy())
        x, y = to_inputs({"img": _images(payloads, n), "cls": y}, "img", cpu, None)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if steady_start is None:
            first_s, steady_start = time.perf_counter() - start, time.perf_counter()
        else:
            wait_s += t1 - t0
    end = time.perf_counter()
    close = getattr(batches, "close", None)
    if close:
        close()
    if steps < 2:
        return {"status": f"error: only {steps} step(s): the data has fewer batches than 2", "steps": steps}
    steady = end - steady_start
    return {"status": "ok", "steps": steps, "first_step_s": first_s, "steps_per_s": (steps - 1) / steady,
            "stall": wait_s / steady, "wait_ms_per_step": 1e3 * wait_s / (steps - 1),
            "compute_ms_per_step": 1e3 * (steady - wait_s) / (steps - 1), "final_loss": float(loss)}
