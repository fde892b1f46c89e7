"""One run on several processes through torchrun (DDP): each rank takes its share of every global
batch, metrics are summed across ranks, and only rank 0 writes files or logs to W&B."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from lra.errors import ConfigError, UserError


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


def world_size() -> int:
    """The number of processes torchrun started (1 without torchrun); a leftover or malformed
    ``WORLD_SIZE`` is a :class:`ConfigError` naming the fix, found before anything is written."""
    value = os.environ.get("WORLD_SIZE", "1")
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"WORLD_SIZE={value!r} in the environment is not a process count: unset it (one process), "
                          "or start the run with torchrun")
    world = int(value)
    missing = [name for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if world > 1 and missing:
        raise ConfigError(f"WORLD_SIZE={world} is set but {', '.join(missing)} not, so this is no torchrun launch "
                          "(a variable left over in the shell?): unset WORLD_SIZE for one process, or start the run "
                          "with torchrun")
    return world


def setup() -> Ranks:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1): NCCL on GPUs, gloo on CPU."""
    if world_size() == 1:
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


def same_across(value: Optional[str], ranks: Ranks, what: str, fix: str) -> None:
    """One :class:`UserError` line on every rank, naming each rank's ``value``, where the ranks' values differ:
    ``what`` they are, ``fix`` the remedy (a run computed one way on some ranks and another on others)."""
    if ranks.world == 1:
        return
    values: List[Optional[str]] = [None] * ranks.world
    dist.all_gather_object(values, value)
    if len(set(values)) > 1:
        each = ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))
        raise UserError(f"the run's processes differ in {what} ({each}); {fix}")
