"""Linformer attention (Wang et al. 2020): keys and values projected along the sequence axis.

softmax(Q (E K)ᵀ / √d) (F V) with learned E, F ∈ R^{k × max_seq_len}. Padded positions are zeroed
before the projection; an input shorter than ``max_seq_len`` uses the first columns of E and F.
Projections belong to the layer unless ``share_kv`` (E = F) or ``share_across_layers`` (one E, F for
every layer of a model) is set; nothing is shared process-wide.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attention_zoo._common import at_least_float32, scaled
from attention_zoo.options import whole
from attention_zoo.registry import Attention, register


@dataclass
class LinformerOptions:
    proj_dim: int = 256
    share_kv: bool = False
    share_across_layers: bool = False

    def __post_init__(self):
        whole(self, 1, "proj_dim")


@register("linformer", LinformerOptions)
class LinformerAttention(Attention):
    subquadratic = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        self.key_projection = nn.Parameter(torch.empty(options.proj_dim, max_seq_len))
        nn.init.xavier_normal_(self.key_projection)
        if options.share_kv:
            self.value_projection = self.key_projection
        else:
            self.value_projection = nn.Parameter(torch.empty(options.proj_dim, max_seq_len))
            nn.init.xavier_normal_(self.value_projection)

    @classmethod
    def label(cls, options: LinformerOptions) -> str:
        return "Linformer"

    def share_parameters_with(self, first: Attention) -> None:
        if self.options.share_across_layers:
            self.key_projection, self.value_projection = first.key_projection, first.value_projection

    @at_least_float32
    def forward(self, q, k, v, mask):
        n = q.shape[2]
        if n > self.max_seq_len:
            raise ValueError(f"linformer was built for max_seq_len={self.max_seq_len}, got n={n}")
        real = mask[:, None, :, None].to(q.dtype)
        keys = self.key_projection[:, :n].to(q.dtype) @ (k * real)  # [B, H, proj_dim, d]
        values = self.value_projection[:, :n].to(q.dtype) @ (v * real)
        return torch.softmax(scaled(q) @ keys.transpose(-1, -2), dim=-1) @ values
