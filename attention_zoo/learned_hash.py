"""Learning-to-hash attention, LHA (Sun, Yang & Yoo, ICLR 2022).

Per head, hash scorers H_Q, H_K : R^d → R^B (a linear map, or a 2-layer MLP with ``hidden_dim``)
read stop-gradient q and k. Bucket b takes the k = ⌊√2 · n / B⌋ highest-scoring queries and keys
(balanced top-k, with the paper's √2 enlargement), attention runs within each bucket (q·k/√d), and a
query's results from several buckets are merged by their log-sum-exp weights; a query in no bucket
gets zeros.

The scorers learn only from ``aux_loss`` = ``aux_loss_weight`` · (KL(ψ_Q ‖ softmax H_Q) + KL(ψ_K ‖
softmax H_K)), averaged over real tokens, where the attention utility ψ_Q(i)_b ∝ Σ_{j∈b} A_ij is
estimated with positive random features φ as φ(q_i) · Σ_{j∈b} φ(k_j) in O(n · B) (ψ_K symmetrically).
The authors give no weight; 1.0 is ours (the scorers see no other gradient, so it only sets their
learning rate relative to the model's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attention_zoo._common import NEG_INF, gather_rows, in_float32
from attention_zoo.longformer import LongformerAttention, LongformerOptions
from attention_zoo.performer import orthogonal_gaussian_features
from attention_zoo.options import InvalidOption, number, whole
from attention_zoo.registry import Attention, register


@dataclass
class LearnedHashOptions:
    num_buckets: int = 32
    hidden_dim: int = 0  # 0: linear scorers; > 0: 2-layer MLP scorers of this width
    aux_loss_weight: float = 1.0
    num_random_features: int = 64  # for the attention-utility estimate
    local_heads: int = 0  # the first heads use sliding-window attention instead (the authors' LRA pairing)
    local_window: int = 128

    def __post_init__(self):
        whole(self, 1, "num_buckets", "num_random_features")
        whole(self, 2, "local_window")
        whole(self, 0, "hidden_dim", "local_heads")
        number(self, "aux_loss_weight", 0.0)


class HeadwiseScorer(nn.Module):
    """Independent scorers per head: [B, H, n, d] → [B, H, n, buckets]."""

    def __init__(self, heads: int, dim: int, buckets: int, hidden: int):
        heads = max(heads, 1)
        super().__init__()
        widths = [dim, hidden, buckets] if hidden else [dim, buckets]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(heads, a, b) / math.sqrt(a)) for a, b in zip(widths, widths[1:]))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(heads, 1, b)) for b in widths[1:])

    def forward(self, x):
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.einsum("bhnd,hdk->bhnk", x, w) + b
            if i < len(self.weights) - 1:
                x = torch.relu(x)
        return x


def one_hot_members(index: torch.Tensor, n: int) -> torch.Tensor:
    """Bucket members [B, H, buckets, size] (token indices) → a 0/1 matrix [B, H, buckets, n]."""
    return torch.zeros(*index.shape[:3], n, device=index.device).scatter_(-1, index, 1.0)


@register("learned_hash", LearnedHashOptions)
class LearnedHashAttention(Attention):
    subquadratic = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        if options.local_heads > num_heads:
            raise InvalidOption("local_heads", options.local_heads, f"between 0 and num_heads={num_heads}")
        hashed_heads = num_heads - options.local_heads
        self.query_scorer = HeadwiseScorer(hashed_heads, head_dim, options.num_buckets, options.hidden_dim)
        self.key_scorer = HeadwiseScorer(hashed_heads, head_dim, options.num_buckets, options.hidden_dim)
        self.register_buffer("features", orthogonal_gaussian_features(options.num_random_features, head_dim))
        self.local = (LongformerAttention(options.local_heads, head_dim, max_seq_len,
                                          LongformerOptions(window_size=options.local_window, num_global_tokens=0))
                      if options.local_heads else None)

    @classmethod
    def label(cls, options: LearnedHashOptions) -> str:
        return "LHA"

    def bucket_size(self, n: int) -> int:
        return max(1, min(n, int(math.sqrt(2) * n / self.options.num_buckets)))

    def memberships(self, q, k, mask):
        """Scores and top-k members per bucket: (score_q, score_k, query_index, key_index) with
        indices [B, H, buckets, size]; padded tokens are chosen last."""
        score_q, score_k = self.query_scorer(q.detach()), self.key_scorer(k.detach())
        padded = ~mask[:, None, :, None]
        size = self.bucket_size(q.shape[2])
        query_index = score_q.masked_fill(padded, float("-inf")).transpose(-1, -2).topk(size, dim=-1).indices
        key_index = score_k.masked_fill(padded, float("-inf")).transpose(-1, -2).topk(size, dim=-1).indices
        return score_q, score_k, query_index, key_index

    def attended_keys(self, q, k, mask):
        """Dense [B, H, n, n] bool: keys sharing a bucket with each query, or the window of a local
        head (for analysis at small n)."""
        split = self.options.local_heads
        local = self.local.attended_keys(q[:, :split], k[:, :split], mask) if self.local else None
        _, _, query_index, key_index = self.memberships(q[:, split:].float(), k[:, split:].float(), mask)
        n = q.shape[2]
        in_q, in_k = one_hot_members(query_index, n), one_hot_members(key_index, n)
        hashed = (in_q.transpose(-1, -2) @ in_k > 0) & mask[:, None, None, :]
        return hashed if local is None else torch.cat([local, hashed], dim=1)

    def bucket_counts(self, q, k, mask):
        """Real queries and keys per bucket of the hashed heads, each token in the bucket its scorer
        ranks highest (the learned hash before the balanced top-k): two [B, H_hashed, 1, buckets]."""
        split = self.options.local_heads

        def counts(scorer, x):
            one_hot = torch.nn.functional.one_hot(scorer(x[:, split:].float()).argmax(-1), self.options.num_buckets)
            return (one_hot * mask[:, None, :, None]).sum(-2, keepdim=True)

        return counts(self.query_scorer, q), counts(self.key_scorer, k)

    def forward(self, q, k, v, mask=None):
        if self.local is None:
            return self._hashed(q, k, v, mask)
        split = self.options.local_heads
        local = self.local(q[:, :split], k[:, :split], v[:, :split], mask)
        hashed = self._hashed(q[:, split:], k[:, split:], v[:, split:], mask) if split < q.shape[1] else local[:, :0]
        return torch.cat([local, hashed], dim=1)

    @in_float32
    def _hashed(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        score_q, score_k, query_index, key_index = self.memberships(q, k, mask)
        buckets, size = query_index.shape[2], query_index.shape[3]
        flat_q, flat_k = query_index.flatten(2), key_index.flatten(2)
        bq = gather_rows(q, flat_q).view(batch, heads, buckets, size, d)
        bk, bv = (gather_rows(x, flat_k).view(batch, heads, buckets, size, d) for x in (k, v))
        key_real = mask[:, None, :].expand(batch, heads, n).gather(2, flat_k).view(batch, heads, buckets, 1, size)
        scores = (bq @ bk.transpose(-1, -2) / math.sqrt(d)).masked_fill(~key_real, NEG_INF)
        lse = scores.logsumexp(dim=-1).flatten(2)  # [B, H, buckets * size]
        out = (torch.softmax(scores, dim=-1) @ bv).flatten(2, 3)

        # Merge every (bucket, slot) result into its query with log-sum-exp weights.
        top = torch.full((batch, heads, n), float("-inf"), device=q.device).scatter_reduce(2, flat_q, lse, "amax")
        weight = torch.exp(lse - top.gather(2, flat_q))
        numerator = torch.zeros_like(q).scatter_add_(2, flat_q.unsqueeze(-1).expand(-1, -1, -1, d), weight.unsqueeze(-1) * out)
        denominator = torch.zeros(batch, heads, n, device=q.device).scatter_add_(2, flat_q, weight)
        result = numerator / denominator.clamp(min=1e-30).unsqueeze(-1)

        self.aux_loss = (self.options.aux_loss_weight * self.utility_loss(q, k, mask, score_q, score_k, query_index, key_index)
                         if torch.is_grad_enabled() else None)
        return result

    def _positive_features(self, x, per_row: bool):
        x = x.detach() * x.shape[-1] ** -0.25
        logits = x @ self.features.T - 0.5 * x.square().sum(-1, keepdim=True)
        shift = logits.amax(dim=-1, keepdim=True) if per_row else logits.amax(dim=(-2, -1), keepdim=True)
        return torch.exp(logits - shift)

    def utility_loss(self, q, k, mask, score_q, score_k, query_index, key_index):
        """KL(ψ ‖ softmax(H(x))) for queries and keys, ψ estimated with positive random features."""
        n = q.shape[2]
        real = mask[:, None, :, None].to(q.dtype)
        phi_q, phi_k = self._positive_features(q, True) * real, self._positive_features(k, True) * real
        key_member = one_hot_members(key_index, n) * real.transpose(-1, -2)
        query_member = one_hot_members(query_index, n) * real.transpose(-1, -2)
        utility_q = phi_q @ (phi_k.transpose(-1, -2) @ key_member.transpose(-1, -2))  # [B, H, n, buckets]
        utility_k = phi_k @ (phi_q.transpose(-1, -2) @ query_member.transpose(-1, -2))

        def kl(utility, scores):
            target = utility / utility.sum(-1, keepdim=True).clamp(min=1e-30)
            log_target = torch.log(target.clamp(min=1e-30))
            per_token = (target * (log_target - torch.log_softmax(scores, dim=-1))).sum(-1)
            return (per_token * real[..., 0]).sum() / real.sum().clamp(min=1) / q.shape[1]

        return kl(utility_q, score_q) + kl(utility_k, score_k)
