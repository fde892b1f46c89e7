"""Performer attention, FAVOR+ (Choromanski et al. 2021): positive orthogonal random features.

φ(x) = exp(wᵀx̃ − ‖x̃‖²/2) / √r with x̃ = x / d^{1/4} (so φ(q)·φ(k) estimates exp(q·k/√d)) and
r = ``num_features`` rows w drawn as blocks of orthogonal Gaussian directions with chi-distributed
norms. Output D⁻¹ φ(Q)(φ(K)ᵀ V), D = diag(φ(Q) φ(K)ᵀ 1), padded keys excluded from both.

Stabilizer, as the reference the YOSO/Nyströmformer LRA code ran (performer-pytorch): before the
exponential, each query's wᵀq̃ loses its maximum over the features, and every key's wᵀk̃ the
maximum over all real keys and features (both held constant in the backward); then
``feature_epsilon`` (the reference's 1e-4) is added to every feature, padded keys staying exactly 0.
With ``feature_epsilon=0`` the constants cancel in D⁻¹ and this is the plain FAVOR+ estimator; with
the ε they do not, and the ε can be comparable to the features themselves when ‖x̃‖² is large.
With ``redraw_interval`` > 0 the features are redrawn every that many training forward passes
(from the seeded global generator, so runs stay reproducible).

Two options reproduce the YOSO/Nyströmformer LRA code (mlpen, ``attention_performer.py``), which
calls performer-pytorch's ``FastAttention`` on ``Q / d^{1/4}``, ``K / d^{1/4} · mask`` and ``V · mask``:
``kernel_scale=d`` divides by d^{1/4} twice, x̃ = x / d^{1/2}, so φ(q)·φ(k) estimates exp(q·k/d)
instead of exp(q·k/√d); ``padded_keys=zero_vectors`` makes each padded key the zero vector (its
value zero too): its feature exp(−c) + ε, c the keys' stabiliser taken over every key, padded
ones included, enters the normalizer D.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attention_zoo._common import at_least_float32
from attention_zoo.options import choice, number, whole
from attention_zoo.registry import Attention, register


KERNEL_SCALES = ("sqrt_d", "d")
PADDED_KEYS = ("excluded", "zero_vectors")


@dataclass
class PerformerOptions:
    num_features: int = 256
    redraw_interval: int = 0  # 0: draw once
    epsilon: float = 0.0  # added to the normalizer D (the reference adds none); a row with D = 0 gives 0
    feature_epsilon: float = 1e-4  # added to every feature after the stabilizer (performer-pytorch: 1e-4)
    kernel_scale: str = "sqrt_d"  # sqrt_d: estimates exp(q·k/√d) | d: exp(q·k/d), the mlpen LRA code's
    padded_keys: str = "excluded"  # excluded | zero_vectors: in the normalizer as k = 0 (the mlpen LRA code)

    def __post_init__(self):
        choice(self, "kernel_scale", KERNEL_SCALES)
        choice(self, "padded_keys", PADDED_KEYS)
        whole(self, 1, "num_features")
        whole(self, 0, "redraw_interval")
        number(self, "epsilon", 0.0)
        number(self, "feature_epsilon", 0.0)


def orthogonal_gaussian_features(num_features: int, dim: int, device=None) -> torch.Tensor:
    """[num_features, dim]: stacked orthogonal blocks, each row rescaled to a Gaussian vector's norm."""
    blocks = []
    for _ in range(-(-num_features // dim)):
        q, r = torch.linalg.qr(torch.randn(dim, dim, device=device))
        blocks.append((q * torch.sign(torch.diagonal(r))).T)  # the sign fix makes q Haar-distributed
    directions = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, dim, device=device).norm(dim=-1, keepdim=True)
    return directions * norms


@register("performer", PerformerOptions)
class PerformerAttention(Attention):
    subquadratic = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        self.register_buffer("features", orthogonal_gaussian_features(options.num_features, head_dim))
        self.register_buffer("forward_calls", torch.zeros((), dtype=torch.long))

    @classmethod
    def label(cls, options: PerformerOptions) -> str:
        return "Performer"

    def _maybe_redraw(self) -> None:
        interval = self.options.redraw_interval
        if self.training and interval > 0:
            if self.forward_calls.item() % interval == 0 and self.forward_calls.item() > 0:
                self.features.copy_(orthogonal_gaussian_features(*self.features.shape, device=self.features.device))
            self.forward_calls += 1

    def _projections(self, x: torch.Tensor) -> tuple:
        """(wᵀx̃ for every feature w, ‖x̃‖²/2) with x̃ = x / d^{1/4} (``kernel_scale=d``: x / d^{1/2})."""
        if self.options.kernel_scale == "d":  # the mlpen code's d^{-1/4}, then performer-pytorch's own
            x = x * x.shape[-1] ** -0.25
        x = x * x.shape[-1] ** -0.25
        return x @ self.features.to(x.dtype).T, 0.5 * x.square().sum(dim=-1, keepdim=True)

    @at_least_float32
    def forward(self, q, k, v, mask):
        self._maybe_redraw()
        real = mask[:, None, :, None]
        epsilon = self.options.feature_epsilon
        if self.options.padded_keys == "zero_vectors":  # every key counts; padded ones are k = v = 0
            k, v = k * real, v * real
            real = torch.ones_like(real)
        dash_q, half_norm_q = self._projections(q)
        dash_k, half_norm_k = self._projections(k)
        query_max = dash_q.amax(dim=-1, keepdim=True).detach()
        key_max = dash_k.masked_fill(~real, float("-inf")).amax(dim=(-2, -1), keepdim=True).clamp(min=-1e30).detach()
        phi_q = torch.exp(dash_q - half_norm_q - query_max) + epsilon
        phi_k = (torch.exp((dash_k - half_norm_k - key_max).masked_fill(~real, float("-inf"))) + epsilon) * real
        numerator = phi_q @ (phi_k.transpose(-1, -2) @ v)
        normalizer = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
        normalizer = normalizer + self.options.epsilon
        return numerator / torch.where(normalizer == 0, 1.0, normalizer)
