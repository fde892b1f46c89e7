"""One run on several processes through torchrun (DDP): each rank takes its share of every global
batch, metrics are summed across ranks, and only rank 0 writes files or logs to W&B."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, indices: Sequence[int]) -> np.ndarray:
        """This rank's share of a batch: every world-th index from position ``rank``."""
        return np.asarray(indices)[self.rank :: self.world]


def setup() -> Ranks:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1): NCCL on GPUs, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def sum_across(values: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Element-wise sums of ``values`` over all ranks (``values`` itself on one process); stays on
    the values' device, read nothing back."""
    if ranks.world == 1:
        return values
    summed = values.to(torch.float64).clone()
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed
