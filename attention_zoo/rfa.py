"""Random Feature Attention, RFA (Peng et al. 2021), as it ran on LRA: bidirectional, no gate.

Queries and keys are ℓ2-normalized (x̂ = x / (‖x‖ + 10⁻³), the authors' guard) and mapped by random
Fourier features (the paper's Theorem 1, from Rahimi & Recht 2007)

    φ(x̂) = √(1/D) [sin(w_1·x̂), …, sin(w_D·x̂), cos(w_1·x̂), …, cos(w_D·x̂)],   w_i = σ ∘ w̃_i / τ,

w̃_i ~ N(0, I_d), D = ``num_features``, so that E[φ(x̂)·φ(ŷ)] = exp(−‖σ ∘ (x̂ − ŷ)‖² / 2τ²), which for
σ = 1 is exp(x̂·ŷ / τ²) times factors of ‖x̂‖, ‖ŷ‖ ≈ 1 that cancel in the ratio: softmax attention of
the normalized q, k at temperature τ². The output is the paper's RFA (§3.1),

    out_i = φ(q̂_i)ᵀ Σ_j φ(k̂_j) v_jᵀ / max(φ(q̂_i) · Σ_j φ(k̂_j), floor / D),

with padded keys in neither sum. Sine and cosine features can make the estimated normalizer small or
negative; the authors' code clamps it from below, at what is ``normalizer_floor`` = 100 in units of
one feature's term (their features are scaled by 0.1 and the clamp is at 1). σ ∈ R^{heads × d} is
learned, initialized to 1 (``learned_sigma``, the paper's learned variance: w_i = σ ∘ w̃_i).

Random draws (``feature_draws``): ``step`` draws a fresh w̃ per head from the seeded global generator
at every training forward pass and uses a fixed draw per layer (from the layer's seed) in evaluation,
as the authors' code resamples in training and keeps fixed features in evaluation; ``fixed`` always
uses the layer's fixed draw. The authors draw from a pool of pre-sampled matrices to save time; fresh draws
have the same distribution.

The optional gate (RFA-Gate) is defined on the causal recurrence and was not part of the LRA runs,
whose encoders are bidirectional; it is not implemented. Causal: the sums run over j ≤ i (the paper's
causal RFA without the gate), in chunks so memory stays linear in n. No attention dropout: there is
no attention matrix to drop entries from, and the authors' RFA applies none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attention_zoo._common import at_least_float32, register_rotation_seed, seeded_normal
from attention_zoo._feature_attention import feature_attention
from attention_zoo.options import choice, number, whole
from attention_zoo.registry import Attention, register

NORM_GUARD = 1e-3  # x / (‖x‖ + this): the authors' ℓ2 normalization
FEATURE_DRAWS = ("step", "fixed")


@dataclass
class RFAOptions:
    num_features: int = 64
    """D, random directions per head; φ has 2D entries (the authors' default projection size)."""
    learned_sigma: bool = True
    """Learn σ ∈ R^{heads × d} (init 1) in w_i = σ ∘ w̃_i, the paper's learned variance."""
    temperature: float = 1.0
    """τ in w_i = σ ∘ w̃_i / τ: softmax of q̂·k̂ / τ² (the authors' default 1)."""
    feature_draws: str = "step"
    """step: fresh w̃ every training forward pass, a fixed draw in evaluation (the authors');
    fixed: always the fixed one."""
    normalizer_floor: float = 100.0
    """D·φ(q̂)·Σφ(k̂) = Σ_j Σ_i cos(w_i·(q̂ − k̂_j)) is clamped from below at this (the authors': 1 / 0.1²)."""

    def __post_init__(self):
        whole(self, 1, "num_features")
        number(self, "temperature", 0.0, low_open=True)
        choice(self, "feature_draws", FEATURE_DRAWS)
        number(self, "normalizer_floor", 0.0, low_open=True)


@register("rfa", RFAOptions)
class RandomFeatureAttention(Attention):
    subquadratic = True
    supports_causal = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        register_rotation_seed(self)
        self.sigma = nn.Parameter(torch.ones(num_heads, head_dim)) if options.learned_sigma else None

    @classmethod
    def label(cls, options: RFAOptions) -> str:
        return "RFA"

    def random_directions(self, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """w̃ [heads, D, d] ~ N(0, I), drawn in float32 and returned in ``dtype``: fresh from the global
        generator in training with ``feature_draws=step``, else this layer's fixed draw (from its
        ``rotation_seed``)."""
        shape = (self.num_heads, self.options.num_features, self.head_dim)
        if self.training and self.options.feature_draws == "step":
            return torch.randn(shape, device=device).to(dtype)
        return seeded_normal(self.rotation_seed_value, list(shape), torch.device(device)).to(dtype)

    def features(self, x: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
        """φ(x̂) [B, H, n, 2D] of x [B, H, n, d] with directions w̃ [H, D, d] (see the module docstring)."""
        unit = x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + NORM_GUARD)
        if self.sigma is not None:
            unit = unit * self.sigma.to(x.dtype)[:, None, :]
        projected = (unit / self.options.temperature) @ directions.transpose(-1, -2)
        return torch.cat([projected.sin(), projected.cos()], dim=-1) * self.options.num_features ** -0.5

    @at_least_float32
    def forward(self, q, k, v, mask):
        real = mask[:, None, :, None]
        directions = self.random_directions(q.device, q.dtype)
        phi_k = torch.where(real, self.features(k, directions), 0.0)
        numerator, normalizer = feature_attention(self.features(q, directions), phi_k, torch.where(real, v, 0.0),
                                                  self.causal)
        return numerator / normalizer.clamp_min(self.options.normalizer_floor / self.options.num_features)
