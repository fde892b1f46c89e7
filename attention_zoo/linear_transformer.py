"""Linear Transformer attention (Katharopoulos et al. 2020, "Transformers are RNNs").

softmax's exp(q·k) is replaced by the kernel φ(q)·φ(k) with φ(x) = elu(x) + 1 (§3.2.1), applied to q
and k as they come (no 1/√d), so that (§3.2)

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i) · Σ_j φ(k_j) + ε)

costs O(n) time and memory. ε = ``epsilon`` (1e-6) is added to the normalizer as in the LRA code
(``lra_benchmarks/models/linear_transformer/linear_attention.py``) and the authors' library; a query
whose keys are all padded gets 0. Padded keys are dropped from both sums (the LRA code lets them in).
Causal: the sums run over j ≤ i (§3.3), in chunks so memory stays linear in n.

There is no attention dropout: no attention matrix is formed to drop entries from, and the LRA code
discards its ``dropout_rate`` argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention_zoo._common import at_least_float32
from attention_zoo._feature_attention import feature_attention
from attention_zoo.options import number
from attention_zoo.registry import Attention, register


@dataclass
class LinearTransformerOptions:
    epsilon: float = 1e-6
    """Added to the normalizer φ(q)·Σφ(k) (the LRA code's and the authors' 1e-6)."""

    def __post_init__(self):
        number(self, "epsilon", 0.0)


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 (§3.2.1): positive, so every weight φ(q)·φ(k) is."""
    return F.elu(x) + 1.0


@register("linear_transformer", LinearTransformerOptions)
class LinearTransformerAttention(Attention):
    subquadratic = True
    supports_causal = True

    @classmethod
    def label(cls, options: LinearTransformerOptions) -> str:
        return "Linear Transformer"

    @at_least_float32
    def forward(self, q, k, v, mask):
        # Contiguous copies: on the model's transposed head views, torch.compile's backward (torch 2.13,
        # aot_eager) otherwise views a gradient whose strides differ from the traced ones.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        real = mask[:, None, :, None]
        phi_k = torch.where(real, elu_feature_map(k), 0.0)
        numerator, normalizer = feature_attention(elu_feature_map(q), phi_k, torch.where(real, v, 0.0), self.causal)
        normalizer = normalizer + self.options.epsilon
        return numerator / torch.where(normalizer == 0, 1.0, normalizer)
