"""YOSO-E (Zeng et al., ICML 2021): the m → ∞ limit of YOSO, computed densely in O(n²).

With Q and K L2-normalized per token, the LSH collision probability of τ-bit sign hashes is
E_ij = (1 − arccos(q̂_i · k̂_j) / π)^τ (paper eq. 2); the output is Y = E V over real keys, then
normalized per row, Y_i / ‖Y_i‖₂ (N-YOSO). q̂·k̂ is clamped to [−1 + 1e-6, 1 − 1e-6]: arccos has an
infinite derivative at ±1, and the clamp keeps gradients finite (the reference scales by 0.98
instead, which changes the values too). ``hash_code_len`` τ defaults to log2 of the padded
sequence length (``max_seq_len``), as the paper's LRA runs.

``backward``: ``lower_bound`` (default, as the authors' YOSO-E and Hugging Face's expectation
path) uses the paper's eq. 4 surrogate ∇_Q = [(∇_Y Vᵀ) ⊙ (τ/2) E] K (∇_K symmetric), the
expectation of plain YOSO's sampled backward; ``exact`` differentiates the expression (autograd).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attention_zoo._common import hash_code_length, at_least_float32
from attention_zoo.options import choice, whole
from attention_zoo.registry import Attention, register

CLAMP = 1e-6


@dataclass
class YosoEOptions:
    hash_code_len: Optional[int] = None  # τ; None: ceil(log2(max_seq_len))
    backward: str = "lower_bound"  # lower_bound (the authors') | exact

    def __post_init__(self):
        whole(self, 1, "hash_code_len", optional=True, maximum=64)
        choice(self, "backward", ("lower_bound", "exact"))


def collision_probability(q: torch.Tensor, k: torch.Tensor, tau: int) -> torch.Tensor:
    """(1 − arccos(q̂·k̂)/π)^τ for unit rows q̂ [..., n, d] and k̂ [..., m, d] → [..., n, m]."""
    cosine = (q @ k.transpose(-1, -2)).clamp(-1 + CLAMP, 1 - CLAMP)
    return (1 - torch.arccos(cosine) / math.pi) ** tau


class LowerBoundExpectation(torch.autograd.Function):
    """Y = (E ⊙ mask) V on unit q, k; backward by the lower bound (τ/2) E in place of E'."""

    @staticmethod
    def forward(ctx, q, k, v, key_weight, tau: int, causal: bool = False):
        weights = collision_probability(q, k, tau) * pair_weight(key_weight, q.shape[-2], causal)
        ctx.save_for_backward(q, k, v, weights)
        ctx.tau = tau
        return weights @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v, weights = ctx.saved_tensors
        surrogate = (grad @ v.transpose(-1, -2)) * weights * (ctx.tau / 2)
        return surrogate @ k, surrogate.transpose(-1, -2) @ q, weights.transpose(-1, -2) @ grad, None, None, None


def pair_weight(key_weight: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """[batch, 1, 1 or n, n]: 1 where query i may see key j (a real key; with ``causal`` also j ≤ i)."""
    weight = key_weight[:, None, None, :]
    if causal:
        weight = weight * torch.ones(n, n, dtype=weight.dtype, device=weight.device).tril()
    return weight


def expectation_attention(q, k, v, key_weight, tau: int, backward: str = "exact", causal: bool = False) -> torch.Tensor:
    """ℓ2-normalized (E ⊙ mask) V for q, k, v [batch, heads, n, ·] in any float dtype (float64 for
    gradcheck); ``key_weight`` [batch, n] is 1 on real keys; ``causal`` also zeroes E above the diagonal."""
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    if backward == "lower_bound":
        out = LowerBoundExpectation.apply(q, k, v, key_weight, tau, causal)
    else:
        out = (collision_probability(q, k, tau) * pair_weight(key_weight, q.shape[-2], causal)) @ v
    return F.normalize(out, dim=-1)


@register("yoso_e", YosoEOptions)
class YosoEAttention(Attention):
    supports_causal = True  # E is an explicit n × n matrix: zero above the diagonal

    @property
    def tau(self) -> int:
        return hash_code_length(self.options.hash_code_len, self.max_seq_len)

    @classmethod
    def label(cls, options: YosoEOptions) -> str:
        return "YOSO-E"

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)

    @at_least_float32
    def forward(self, q, k, v, mask):
        return expectation_attention(q, k, v, mask.to(q.dtype), self.tau, self.options.backward, self.causal)
