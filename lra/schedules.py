"""Learning-rate schedules: one pure function per ``trainer.lr_schedule``, in one table.

Each maps (step, trainer config) to the factor the base learning rate ``trainer.lr`` is multiplied by."""

from __future__ import annotations

import math
from typing import Callable, Dict

from lra.config import LRSchedule


def linear_warmup_decay(step: int, warmup: int, total: int, start: float, end: float) -> float:
    """The reference's OneCycle-like schedule: ``start`` → 1 over ``warmup`` steps, then 1 → ``end`` at ``total``."""
    if step < warmup:
        return start + (1.0 - start) * step / warmup
    remaining = max(total - warmup, 1)
    return 1.0 + (end - 1.0) * min(step - warmup, remaining) / remaining


def rsqrt_warmup(step: int, warmup: int) -> float:
    """LRA's ``linear_warmup * rsqrt_decay``: min(1, t / w) / √max(t, w) (the base lr multiplies it)."""
    return min(1.0, step / max(warmup, 1)) / math.sqrt(max(step, warmup, 1))


def cosine_warmup(step: int, warmup: int, total: int) -> float:
    """LRA's ``linear_warmup * cosine_decay`` with one cycle of ``total`` steps after the warm-up."""
    progress = max(0.0, (step - warmup) / max(total, 1))
    return min(1.0, step / max(warmup, 1)) * max(0.0, 0.5 * (1.0 + math.cos(math.pi * (progress % 1.0))))


SCHEDULES: Dict[LRSchedule, Callable[[int, object], float]] = {
    LRSchedule.linear: lambda step, t: linear_warmup_decay(step, t.warmup_steps, t.max_steps, t.lr_start_factor,
                                                           t.lr_end_factor),
    LRSchedule.rsqrt: lambda step, t: rsqrt_warmup(step, t.warmup_steps),
    LRSchedule.cosine: lambda step, t: cosine_warmup(step, t.warmup_steps, t.max_steps),
}


def lr_factor(step: int, trainer) -> float:
    """The learning-rate multiplier at ``step`` for ``trainer.lr_schedule``."""
    return SCHEDULES[LRSchedule(trainer.lr_schedule)](step, trainer)
