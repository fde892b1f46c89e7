"""Synthesizer attention (Tay et al. 2020/2021, "Synthesizer: Rethinking Self-Attention in Transformer
Models", §3), with the modes of the LRA code (google-research/long-range-arena, ``models/synthesizer``).

The attention logits are synthesized instead of (or as well as) taken from query-key dot products,
per head h, for n ≤ ``max_seq_len`` tokens:

    random              B = R[:n, :n],                    R ∈ R^{max_seq_len × max_seq_len}   (§3.2, eq. 4)
    factorized_random   B = R₁[:n] R₂[:, :n],             R₁ ∈ R^{max_seq_len × k}, R₂ ∈ R^{k × max_seq_len}  (§3.3)
    dense               B = relu(Q W₁) W₂[:, :n],         W₁ ∈ R^{d × d}, W₂ ∈ R^{d × max_seq_len}  (§3.1, eq. 2)
    dense+random, dense+factorized_random: the sum of the two,

    Y = softmax(B + [dot_product] Q Kᵀ / √d + M) V       (M: −∞ on padded keys; §3.4's mixtures "+V")

R, R₁, R₂, W₁ belong to each head; W₂ is shared by the heads and nothing has a bias, as in the LRA
code. An input shorter than ``max_seq_len`` uses the leading rows and columns (as that code and
:mod:`attention_zoo.linformer` do); a longer one is an error. The dense synthesizer's input is the
head's query vector: this API receives q, k, v rather than the layer input X, and relu(q W₁) with
q = X W_q spans the same functions as the LRA code's relu(X W_syn) per head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attention_zoo._common import NEG_INF, at_least_float32, scaled
from attention_zoo.options import InvalidOption, choice, number, whole
from attention_zoo.registry import Attention, register

MODES = ("dense", "random", "factorized_random", "dense+random", "dense+factorized_random")


@dataclass
class SynthesizerOptions:
    mode: str = "random"
    """Which logits are synthesized (see the module's docstring); the LRA code runs ``random``."""
    dot_product: bool = True
    """Add the query-key dot products to the synthesized logits (the LRA code's ignore_dot_product=False)."""
    factorized_rank: int = 32
    """k of factorized_random (the LRA code's k)."""
    dropout: float = 0.0
    """Dropout on the attention probabilities, active in training mode only."""

    def __post_init__(self):
        choice(self, "mode", MODES)
        whole(self, 1, "factorized_rank")
        number(self, "dropout", 0.0, 1.0, high_open=True)
        if not isinstance(self.dot_product, bool):
            raise InvalidOption("dot_product", self.dot_product, "true or false")


def xavier_uniform(shape, fan_in: int, fan_out: int) -> torch.Tensor:
    """U(−a, a), a = √(6 / (fan_in + fan_out)) (Glorot & Bengio 2010), with the fans given: the LRA
    code's JAX initializer counts a leading head axis into both fans, which torch's would not."""
    bound = math.sqrt(6.0 / max(1, fan_in + fan_out))
    return torch.empty(shape).uniform_(-bound, bound)


@register("synthesizer", SynthesizerOptions)
class SynthesizerAttention(Attention):
    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        heads, length, rank = num_heads, max_seq_len, options.factorized_rank
        if options.mode.endswith("factorized_random"):
            self.random_left = nn.Parameter(xavier_uniform((heads, length, rank), length * heads, rank * heads))
            self.random_right = nn.Parameter(xavier_uniform((heads, rank, length), rank * heads, length * heads))
        elif options.mode.endswith("random"):
            self.random_logits = nn.Parameter(xavier_uniform((heads, length, length), length * heads, length * heads))
        if options.mode.startswith("dense"):
            self.dense_hidden = nn.Parameter(xavier_uniform((heads, head_dim, head_dim), head_dim, head_dim))
            self.dense_out = nn.Parameter(xavier_uniform((head_dim, length), head_dim, length))

    @classmethod
    def label(cls, options: SynthesizerOptions) -> str:
        return "Synthesizer"

    @classmethod
    def unread_inputs(cls, options: SynthesizerOptions) -> frozenset:
        """Without dot products only the dense modes read q, and no mode reads k."""
        if options.dot_product:
            return frozenset()
        return frozenset({"k"} if options.mode.startswith("dense") else {"q", "k"})

    def synthesized_logits(self, q: torch.Tensor, n: int) -> torch.Tensor:
        """B of the module's docstring for n tokens: [heads, n, n] (random modes) plus [B, H, n, n] (dense)."""
        logits = torch.zeros((), dtype=q.dtype, device=q.device)
        mode = self.options.mode
        if mode.endswith("factorized_random"):
            logits = logits + self.random_left[:, :n].to(q.dtype) @ self.random_right[:, :, :n].to(q.dtype)
        elif mode.endswith("random"):
            logits = logits + self.random_logits[:, :n, :n].to(q.dtype)
        if mode.startswith("dense"):
            logits = logits + torch.relu(q @ self.dense_hidden.to(q.dtype)) @ self.dense_out[:, :n].to(q.dtype)
        return logits

    @at_least_float32
    def forward(self, q, k, v, mask):
        n = q.shape[2]
        if n > self.max_seq_len:
            raise ValueError(f"synthesizer was built for max_seq_len={self.max_seq_len}, got n={n}")
        logits = self.synthesized_logits(q, n)
        if self.options.dot_product:
            logits = logits + scaled(q) @ k.transpose(-1, -2)
        key_real = mask[:, None, None, :]
        logits = logits.expand(q.shape[0], q.shape[1], n, n).masked_fill(~key_real, NEG_INF)
        weights = torch.softmax(logits, dim=-1) * key_real.any(dim=-1, keepdim=True)  # no real key: 0
        weights = F.dropout(weights, self.options.dropout, self.training)
        return weights @ v
