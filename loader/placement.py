"""Where this process sits in the job. ``detect`` is the only reader of
torch.distributed and the environment; everything downstream takes the
frozen ``shardfeed.shuffling.Topology`` value it returns."""

from __future__ import annotations

import os

from shardfeed.loader.feeds.base import check_epoch
from shardfeed.shuffling.topology import Topology


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an int") from None


def detect(rank: int | None = None, world_size: int | None = None,
           weights: tuple[int, ...] | None = None) -> Topology:
    """rank/world size: the arguments, else torch.distributed when initialised,
    else RANK/WORLD_SIZE, else 0/1. ranks_per_node from LOCAL_WORLD_SIZE."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            d_rank, d_world = dist.get_rank(), dist.get_world_size()
        else:
            d_rank, d_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        rank = d_rank if rank is None else rank
        world_size = d_world if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    rpn = _env_int("LOCAL_WORLD_SIZE")
    if rpn is not None and not 1 <= rpn <= world_size:
        rpn = None
    return Topology(rank=rank, world_size=world_size, weights=weights, ranks_per_node=rpn)


class Placed:
    """``rank``, ``world_size`` and ``set_epoch`` of a dataset that holds a ``topology`` and an
    ``epoch`` (ShardDataset, Mixture)."""

    topology: Topology
    epoch: int

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = check_epoch(epoch)
