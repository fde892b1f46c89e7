"""YOSO-E (Zeng et al., ICML 2021): the m → ∞ limit of YOSO, computed densely in O(n²).

With Q and K L2-normalized per token, the LSH collision probability of τ-bit sign hashes is
E_ij = (1 − arccos(q̂_i · k̂_j) / π)^τ (paper eq. 2); the output is Y = E V over real keys, then
normalized per row, Y_i / ‖Y_i‖₂ (N-YOSO). q̂·k̂ is clamped to [−1 + 1e-6, 1 − 1e-6]: arccos has an
infinite derivative at ±1, and the clamp keeps gradients finite (the reference scales by 0.98
instead, which changes the values too). ``hash_code_len`` τ defaults to log2 of the padded
sequence length (``max_seq_len``), as the paper's LRA runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attention_zoo._common import in_float32
from attention_zoo.registry import Attention, register

CLAMP = 1e-6


@dataclass
class YosoEOptions:
    hash_code_len: Optional[int] = None  # τ; None: ceil(log2(max_seq_len))


def collision_probability(q: torch.Tensor, k: torch.Tensor, tau: int) -> torch.Tensor:
    """(1 − arccos(q̂·k̂)/π)^τ for unit rows q̂ [..., n, d] and k̂ [..., m, d] → [..., n, m]."""
    cosine = (q @ k.transpose(-1, -2)).clamp(-1 + CLAMP, 1 - CLAMP)
    return (1 - torch.arccos(cosine) / math.pi) ** tau


@register("yoso_e", YosoEOptions)
class YosoEAttention(Attention):
    @property
    def tau(self) -> int:
        return self.options.hash_code_len or max(1, math.ceil(math.log2(self.max_seq_len)))

    @classmethod
    def label(cls, options: YosoEOptions) -> str:
        return "YOSO-E"

    @in_float32
    def forward(self, q, k, v, mask):
        weights = collision_probability(F.normalize(q, dim=-1), F.normalize(k, dim=-1), self.tau)
        out = (weights * mask[:, None, None, :].to(q.dtype)) @ v
        return F.normalize(out, dim=-1)
