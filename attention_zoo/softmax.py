"""Exact scaled dot-product attention (Vaswani et al. 2017), with padded keys masked out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attention_zoo.options import number
from attention_zoo.registry import Attention, register


@dataclass
class SoftmaxOptions:
    dropout: float = 0.0
    """Dropout on the attention probabilities, active in training mode only."""

    def __post_init__(self):
        number(self, "dropout", 0.0, 1.0, high_open=True)


@register("softmax", SoftmaxOptions)
class SoftmaxAttention(Attention):
    """softmax(Q Kᵀ / √d + M) V, where M is −∞ on padded keys.

    Computed by ``torch.nn.functional.scaled_dot_product_attention``, which picks a fused kernel
    (flash / memory-efficient) when one applies. A query whose keys are all padded would have no
    valid key; its row is returned as zeros instead of NaN. Causal: M is also −∞ above the diagonal.
    """

    supports_causal = True

    @classmethod
    def label(cls, options: SoftmaxOptions) -> str:
        return "Softmax"

    def forward(self, q, k, v, mask: Optional[torch.Tensor] = None):
        attn_mask = None
        if mask is not None:
            # [batch, 1, 1, n] broadcasts over heads and queries.
            attn_mask = mask[:, None, None, :].to(torch.bool)
        if self.causal:
            n = q.shape[-2]
            earlier = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            attn_mask = earlier if attn_mask is None else attn_mask & earlier  # [batch, 1, n, n]
        dropout = self.options.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        if attn_mask is not None:
            has_key = attn_mask.any(dim=-1, keepdim=True)
            out = torch.where(has_key, out, torch.zeros_like(out))
        return out
