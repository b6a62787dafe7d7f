"""The reference trainer's model and how a loader batch becomes its input."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head over global average pooling, so any
    image size works (progressive resizing changes it between epochs).
    GroupNorm rather than BatchNorm: no running buffers for DDP to broadcast,
    and a rank's tiny dual-batch share normalises as well as a big one."""

    def __init__(self, classes: int, width: int = 16):
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(4, width)
        self.c2, self.n2 = nn.Conv2d(width, 2 * width, 3, padding=1), nn.GroupNorm(4, 2 * width)
        self.c3, self.n3 = nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.GroupNorm(4, 4 * width)
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x):
        x = (x - 0.5) / 0.25
        x = F.max_pool2d(F.relu(self.n1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.n2(self.c2(x))), 2)
        x = F.relu(self.n3(self.c3(x)))
        return self.head(x.mean(dim=(2, 3)))


def to_inputs(batch, field: str, device: torch.device, image_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(images NCHW float in [0, 1], labels) on ``device``. The uint8 batch is
    copied to the device first (4x fewer bytes than float; ``non_blocking``
    overlaps it with compute when the loader pinned it), then converted, and
    resized to the schedule's ``image_size`` when the stored size differs."""
    x = batch[field]
    if not torch.is_tensor(x):
        x = torch.stack([torch.as_tensor(a) for a in x])
    non_blocking = device.type == "cuda"
    x = x.to(device, non_blocking=non_blocking).permute(0, 3, 1, 2).float().div_(255.0)
    if image_size is not None and x.shape[-1] != image_size:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", antialias=True, align_corners=False)
    y = batch["cls"].to(device, non_blocking=non_blocking).long()
    return x, y
