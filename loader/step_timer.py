"""ComputeTimer: a rank's own compute time of a training step, without the waits for other ranks.

Under DDP the time between batches is the same on every rank: the gradient
all-reduce at the end of ``backward()`` makes a fast rank wait for the
slowest, so a Balancer fed wall time between steps sees equal speeds. This
timer measures what the rank itself computes: from the start of the model's
forward (after DDP's own start-of-step work) to the moment the last
parameter gradient of the backward is accumulated, which is before the wait
for the all-reduce. On CUDA it records events on the current stream (the
kernels' time, not their launch) and reads them at ``take()``; on a CPU
with one intra-op thread it reads the thread's CPU time (so time another
process holds the core does not count), else wall time.
"""

from __future__ import annotations

import time

import torch


class ComputeTimer:
    """``ComputeTimer(model)``: hooks on ``model`` (the module DDP wraps, or a plain one);
    ``take()`` after each step returns its compute seconds (None when the step ran no
    training forward), ``close()`` removes the hooks."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cuda = any(p.is_cuda for p in model.parameters())
        self._start = self._end = None
        # one intra-op thread on CPU: the thread's CPU time, which a busy machine's other processes do not
        # inflate (they take the core away, and wall time would count it); else wall time
        self._clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        self._handles = [model.register_forward_pre_hook(self._on_forward)]
        self._handles += [p.register_post_accumulate_grad_hook(self._on_grad)
                          for p in model.parameters() if p.requires_grad]

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return self._clock()

    def _on_forward(self, module, args) -> None:
        if module.training and torch.is_grad_enabled() and self._start is None:
            self._start = self._now()

    def _on_grad(self, param) -> None:
        if self._start is not None:
            self._end = self._now()  # the last one of the backward wins

    def take(self) -> float | None:
        """Seconds from the step's forward to its last gradient; None without a training step."""
        start, end = self._start, self._end
        self._start = self._end = None
        if start is None or end is None:
            return None
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
