"""Sparse Sinkhorn attention (Tay et al. 2020, "Sparse Sinkhorn Attention", §3), at the settings of the
LRA code (google-research/long-range-arena, ``models/sinkhorn_transformer``).

The sequence is cut into contiguous blocks of ``block_size`` tokens (the last one padded). A sorting
network scores every pair of blocks from the sum of each block's keys, R = ψ_P(K) W (ψ_P: sum pooling
over a block; W ∈ R^{d × ⌈max_seq_len / block_size⌉}, shared by the heads, no bias, as the LRA code's
sort net), and Sinkhorn balancing turns R into a soft block permutation (§3.1, after Mena et al. 2018):

    P = S^k((R + ε) / τ),   S^0(X) = exp(X),   S^k(X) = F_c(F_r(S^{k−1}(X))),

F_r / F_c dividing by the row / column sums (computed in the log domain), ε Gumbel noise in training
(none in evaluation), τ = ``temperature``, k = ``sinkhorn_iterations``. The sorted keys and values of
block i are ψ_S(K)_i = Σ_j P_ij K_j (ψ_S(V) likewise), and each query block attends, as the LRA code
does, to its own block and to its sorted block in two softmaxes whose outputs are added:

    Y_i = softmax(Q_i K_iᵀ / √d) V_i + softmax(Q_i ψ_S(K)_iᵀ / √d) ψ_S(V)_i.

Padding: padded keys and values are zeroed before anything is summed or sorted; a block without a real
token leaves the balancing (its row and column of P are the identity's), so a padded sequence's real
tokens get the outputs the sequence alone would; a slot of a sorted block is a key when some block has
a real token in that slot. Memory O(n · (block_size + d) + (n / block_size)²).

``block_size`` is at most the input length N (``check_shape``): at N the sequence is one block, which the
sorting network can only leave in place (twice softmax attention), and a longer block is that same single
block padded to ``block_size`` (its b × b scores overflowed memory for large b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attention_zoo._common import NEG_INF, at_least_float32, pad_to_multiple, scaled
from attention_zoo.options import InvalidOption, at_most_length, number, whole
from attention_zoo.registry import Attention, register


@dataclass
class SinkhornOptions:
    block_size: int = 50
    """Tokens per block: the LRA code's default (its image configs set 64)."""
    sinkhorn_iterations: int = 1
    """k, rounds of row-then-column normalization: the LRA code's ``sinkhorn_operator`` default."""
    temperature: float = 1.0
    """τ, dividing the (noisy) scores before balancing: the LRA code's default."""
    gumbel_noise: bool = True
    """Gumbel noise on the scores in training (Gumbel-Sinkhorn, §3.1); never in evaluation."""
    dropout: float = 0.0
    """Dropout on both attention probability matrices, active in training mode only."""

    def __post_init__(self):
        whole(self, 1, "block_size", "sinkhorn_iterations")
        number(self, "temperature", 0.0, low_open=True)
        number(self, "dropout", 0.0, 1.0, high_open=True)
        if not isinstance(self.gumbel_noise, bool):
            raise InvalidOption("gumbel_noise", self.gumbel_noise, "true or false")


def sinkhorn_balance(log_scores: torch.Tensor, iterations: int) -> torch.Tensor:
    """S^k(exp(log_scores)) over the last two dimensions: k rounds of row then column normalization,
    in the log domain (Tay et al. 2020, §3.1). After each round the columns sum to 1; the rows approach 1."""
    for _ in range(iterations):
        log_scores = log_scores - log_scores.logsumexp(dim=-1, keepdim=True)
        log_scores = log_scores - log_scores.logsumexp(dim=-2, keepdim=True)
    return log_scores.exp()


def gumbel_like(x: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel draws −log(−log U) of ``x``'s shape and dtype, U uniform from the global (seeded)
    generator, drawn in float32 (the same U whatever x's dtype)."""
    uniform = torch.rand(x.shape, device=x.device).clamp_min(torch.finfo(torch.float32).tiny).to(x.dtype)
    return -torch.log(-torch.log(uniform))


@register("sinkhorn", SinkhornOptions)
class SinkhornAttention(Attention):
    subquadratic = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        self.max_blocks = math.ceil(max_seq_len / options.block_size)
        self.sort_net = nn.Parameter(torch.empty(head_dim, self.max_blocks))  # W: block key sum → a score per block
        nn.init.xavier_uniform_(self.sort_net)  # the LRA code's kernel_init

    @classmethod
    def label(cls, options: SinkhornOptions) -> str:
        return "Sinkhorn Transformer"

    @classmethod
    def check_shape(cls, options: SinkhornOptions, num_heads, head_dim, max_seq_len) -> None:
        at_most_length(options, "block_size", max_seq_len, "a single block, nothing to sort")

    def _blocks(self, x: torch.Tensor, blocks: int, value=0) -> torch.Tensor:
        """[B, H, n, ...] (or [B, n]) padded along n and cut into [B, H, blocks, block_size, ...]."""
        size = self.options.block_size
        dim = 2 if x.dim() >= 3 else 1
        padded = pad_to_multiple(x, size, dim=dim, value=value)
        return padded.view(*x.shape[:dim], blocks, size, *x.shape[dim + 1:])

    def sorting_logits(self, k: torch.Tensor, mask: torch.Tensor):
        """((R + ε) / τ with blocks without a real token set apart, [B, H, nb, nb]; which blocks hold a
        real token, [B, nb]). ε is Gumbel noise in training (``gumbel_noise``), 0 in evaluation."""
        blocks = math.ceil(k.shape[2] / self.options.block_size)
        block_real = self._blocks(mask, blocks, value=False).any(dim=-1)
        key_sums = self._blocks(k * mask[:, None, :, None].to(k.dtype), blocks).sum(dim=3)
        scores = key_sums @ self.sort_net[:, :blocks].to(k.dtype)
        if self.training and self.options.gumbel_noise:
            scores = scores + gumbel_like(scores)
        scores = scores / self.options.temperature
        both_real = block_real[:, None, :, None] & block_real[:, None, None, :]
        identity = torch.eye(blocks, dtype=torch.bool, device=k.device)
        return torch.where(both_real, scores, torch.where(identity, 0.0, NEG_INF)), block_real

    def sorting_matrix(self, k: torch.Tensor, mask: torch.Tensor):
        """(P, [B, H, nb, nb], the balanced soft permutation of blocks; which blocks hold a real token)."""
        logits, block_real = self.sorting_logits(k, mask)
        return sinkhorn_balance(logits, self.options.sinkhorn_iterations), block_real

    def _attend(self, q, k, v, key_real):
        """softmax(q kᵀ + M) v within blocks, q already scaled; a row with no real key gives 0."""
        scores = (q @ k.transpose(-1, -2)).masked_fill(~key_real, NEG_INF)
        weights = torch.softmax(scores, dim=-1) * key_real.any(dim=-1, keepdim=True)
        weights = F.dropout(weights, self.options.dropout, self.training)
        return weights @ v

    @at_least_float32
    def forward(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        if n > self.max_seq_len:
            raise ValueError(f"sinkhorn was built for max_seq_len={self.max_seq_len}, got n={n}")
        blocks = math.ceil(n / self.options.block_size)
        permutation, _ = self.sorting_matrix(k, mask)
        real = mask[:, None, :, None].to(q.dtype)
        block_q = self._blocks(scaled(q), blocks)
        block_k, block_v = self._blocks(k * real, blocks), self._blocks(v * real, blocks)
        key_real = self._blocks(mask, blocks, value=False)  # [B, nb, block_size]
        sorted_k = torch.einsum("bhij,bhjsd->bhisd", permutation, block_k)
        sorted_v = torch.einsum("bhij,bhjsd->bhisd", permutation, block_v)
        sorted_real = key_real.any(dim=1)  # [B, block_size]: slots that some block fills with a real token
        local = self._attend(block_q, block_k, block_v, key_real[:, None, :, None, :])
        by_sorting = self._attend(block_q, sorted_k, sorted_v, sorted_real[:, None, None, None, :])
        return (local + by_sorting).reshape(batch, heads, blocks * self.options.block_size, d)[:, :, :n]
