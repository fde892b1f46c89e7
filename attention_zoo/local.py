"""Local attention (the LRA baseline, Tay et al. 2021): softmax within non-overlapping blocks.

The sequence is cut into blocks of ``block_size`` consecutive positions and each query attends to
the real keys of its own block only:

    out_i = Σ_{j ∈ B(i)} softmax_j(q_i · k_j / √d) v_j,   B(i) = {j : ⌊j / b⌋ = ⌊i / b⌋, j real}

(causal: also j ≤ i). A length that is not a multiple of b is padded internally with masked
positions; the last block is then shorter. Memory O(n · b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attention_zoo._common import NEG_INF, at_least_float32, pad_to_multiple, scaled
from attention_zoo.options import number, whole
from attention_zoo.registry import Attention, register


@dataclass
class LocalOptions:
    block_size: int = 50
    """Positions per block: 50 is the LRA code's default (``LocalTransformerEncoder``, used by ListOps,
    Text and Retrieval); its Image and Pathfinder configs set 64."""
    dropout: float = 0.0
    """Dropout on the attention probabilities, active in training mode only."""

    def __post_init__(self):
        whole(self, 1, "block_size")
        number(self, "dropout", 0.0, 1.0, high_open=True)


@register("local", LocalOptions)
class LocalAttention(Attention):
    """Causal: within its block a query sees only the keys at or before its position."""

    subquadratic = True
    supports_causal = True

    @classmethod
    def label(cls, options: LocalOptions) -> str:
        return "Local Attention"

    def attended_keys(self, q, k, mask: Optional[torch.Tensor]):
        """Dense [B, H, n, n] bool: the keys each query attends to (for analysis at small n)."""
        n = q.shape[2]
        mask = torch.ones(q.shape[0], n, dtype=torch.bool, device=q.device) if mask is None else mask.bool()
        block = torch.arange(n, device=q.device) // self.options.block_size
        seen = block[:, None] == block[None, :]
        if self.causal:
            seen = seen & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return (seen & mask[:, None, None, :]).expand(q.shape[0], q.shape[1], n, n)

    @at_least_float32
    def forward(self, q, k, v, mask):
        batch, heads, n, _ = q.shape
        size = self.options.block_size
        blocks = math.ceil(n / size)

        def blocked(x):  # [B, H, n, d] → [B, H, blocks, size, d]
            return pad_to_multiple(x, size, dim=2).view(batch, heads, blocks, size, x.shape[-1])

        scores = blocked(scaled(q)) @ blocked(k).transpose(-1, -2)  # [B, H, blocks, size, size]
        key_real = pad_to_multiple(mask, size, dim=1, value=False).view(batch, 1, blocks, 1, size)
        allowed = key_real
        if self.causal:
            allowed = allowed & torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        weights = torch.softmax(scores.masked_fill(~allowed, NEG_INF), dim=-1)
        if self.training and self.options.dropout:
            weights = F.dropout(weights, self.options.dropout)
        out = (weights @ blocked(v)).view(batch, heads, blocks * size, v.shape[-1])
        return out[:, :, :n]
