"""Small pieces shared by several backends."""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

NEG_INF = -1e9  # finite "minus infinity": a row with no valid key stays finite (its output is ignored)


def real_mask(mask: Optional[torch.Tensor], q: torch.Tensor) -> torch.Tensor:
    """The key-padding mask as bool [batch, n] (all True when None)."""
    if mask is None:
        return torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=q.device)
    return mask.to(torch.bool)


def in_float32(forward):
    """Run ``forward(self, q, k, v, mask)`` in float32 and return the inputs' dtype."""

    @functools.wraps(forward)
    def wrapper(self, q, k, v, mask=None):
        dtype = v.dtype
        out = forward(self, q.float(), k.float(), v.float(), real_mask(mask, q))
        return out.to(dtype)

    return wrapper


def scaled(q: torch.Tensor) -> torch.Tensor:
    return q / math.sqrt(q.shape[-1])


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int, value=0) -> torch.Tensor:
    remainder = (-x.shape[dim]) % multiple
    if remainder == 0:
        return x
    shape = list(x.shape)
    shape[dim] = remainder
    return torch.cat([x, x.new_full(shape, value)], dim=dim)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x`` [B, H, n, d] gathered along n by ``index`` [B, H, m] → [B, H, m, d]."""
    return x.gather(2, index.unsqueeze(-1).expand(*index.shape, x.shape[-1]))
