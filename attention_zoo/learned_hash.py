"""Learning-to-hash attention, LHA (Sun, Yang & Yoo, ICLR 2022), as its paper and its authors' code
(Edward-Sun/Learning-to-Hash-Attention, ``lha_attention.py`` and ``mixed_attention.py``) define it.

Per head, hash scorers read stop-gradient q and k: H_Q(q) = q · ((1 − c) W + c W_Q) and H_K(k) =
k · ((1 − c) W + c W_K), a kernel W shared by both sides mixed with one of each side's own
(c = ``own_kernel_share``, the authors' ``cluster_score`` 0.1), no bias. Membership: each bucket b
takes the k queries (and keys) with the highest softmax-over-buckets probability softmax(H(x))_b,
so a token that scores high everywhere joins where it is relatively best; padded tokens are chosen
last. k is the authors' ⌊(P // B) · √2⌋ on the length P their module pads the sequence to,
max(⌈n / L⌉ · L, B · L) with L the local block size (``local_block_size``, default ⌈n / B⌉): so
⌊⌈n / B⌉ · √2⌋ by default (at most n; ``num_buckets`` is at most the input length N, where each
bucket takes one query and one key: ``check_shape``). Attention then runs within each bucket on
LayerNorm'd q and k (no scale or bias, ε = 1e-6), scaled by 1/√d, and a query's results from several
buckets are merged by their log-sum-exp weights; a query no bucket selects gets zeros.

``local_heads`` > 0 makes the first heads local, the authors' LHA/local hybrid (``mixed_attention.py``):
``local_pattern=blocks`` (default) is their ``local_attention.py``, the padded sequence cut into blocks
of L and each query attending the real keys of its own block, the one before and the one after,
cyclically (the first block's "before" is the last), a masked key scoring −1e10 as their float32 bias
leaves it; ``sliding`` (ours) is a Longformer window of ``local_window`` instead.

The scorers learn only from ``aux_loss`` = ``aux_loss_weight`` · (KL(ψ_Q ‖ softmax H_Q) +
KL(ψ_K ‖ softmax H_K)), averaged over real tokens and heads, where the attention utility (paper
§3.2) of bucket b is ψ_Q(i)_b ∝ Σ_{j∈K_b} A_ij for a query and ψ_K(j)_b ∝ Σ_{i∈Q_b} A_ij for a key,
A = softmax(q̂ k̂ᵀ/√d) over real keys. Both are estimated in O(n · B · r) with r positive random
features φ (FAVOR+, redrawn every training step from the seeded generator, as the authors redraw
them), A_ij ≈ φ(q_i)·φ(k_j) / Ẑ_i with Ẑ_i = φ(q_i)·Σ_j φ(k_j): see :func:`utility_targets`. The
paper's appendix A.5 weights the loss λ = 0.05 on LRA (the LHA row of ``experiment=lha_table3``); the
default 1.0 is ours (the scorers see no other gradient, and Adam's steps do not depend on a gradient's
scale, so under Adam the weight reaches them only through ε).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attention_zoo._common import NEG_INF, gather_rows, at_least_float32, no_tokens
from attention_zoo.local import lra_masked
from attention_zoo.longformer import LongformerAttention, LongformerOptions
from attention_zoo.options import InvalidOption, at_most_length, choice, number, whole
from attention_zoo.performer import orthogonal_gaussian_features
from attention_zoo.registry import Attention, register

MEMBERSHIPS = ("softmax", "raw")  # rank by softmax over buckets (the authors') or by the raw score
FEATURE_DRAWS = ("step", "fixed")  # fresh features every training step (the authors') or drawn once
LOCAL_PATTERNS = ("blocks", "sliding")  # the authors' own/previous/next blocks, or a sliding window (ours)
LAYER_NORM_EPS = 1e-6  # the authors' length_normalized


@dataclass
class LearnedHashOptions:
    num_buckets: int = 32
    hidden_dim: int = 0  # 0: the authors' linear scorers; > 0: 2-layer scorers of this width (ours)
    own_kernel_share: float = 0.1  # c in (1 − c)·W_shared + c·W_side (the authors' cluster_score)
    membership: str = "softmax"  # softmax (the authors') | raw
    normalize_qk: bool = True  # LayerNorm q and k before in-bucket attention (the authors')
    aux_loss_weight: float = 1.0
    num_random_features: int = 256  # r of the utility estimate (the authors' nb_features)
    feature_draws: str = "step"  # step (the authors') | fixed
    local_heads: int = 0  # the first heads attend locally instead (the authors' LHA/local hybrid)
    local_pattern: str = "blocks"  # blocks (the authors' local_attention.py) | sliding (a Longformer window)
    local_block_size: int = 0  # L of the blocks and of the authors' padding; 0: ⌈n / num_buckets⌉ (theirs)
    local_window: int = 128  # the sliding pattern's window
    dropout: float = 0.0  # on the attention probabilities in training, hashed and block-local heads (the authors')

    def __post_init__(self):
        whole(self, 1, "num_buckets", "num_random_features")
        whole(self, 2, "local_window")
        whole(self, 0, "hidden_dim", "local_heads", "local_block_size")
        choice(self, "local_pattern", LOCAL_PATTERNS)
        number(self, "dropout", 0.0, 1.0, high_open=True)
        if self.dropout and self.local_heads and self.local_pattern == "sliding":
            raise InvalidOption("dropout", self.dropout, "0 with local_pattern=sliding, whose window has no attention "
                                "dropout (or local_pattern=blocks, the authors')")
        number(self, "own_kernel_share", 0.0, 1.0)
        number(self, "aux_loss_weight", 0.0)
        choice(self, "membership", MEMBERSHIPS)
        choice(self, "feature_draws", FEATURE_DRAWS)
        if not isinstance(self.normalize_qk, bool):
            raise InvalidOption("normalize_qk", self.normalize_qk, "true or false")


def lecun_kernel(heads: int, fan: int, width: int) -> nn.Parameter:
    """A [heads, fan, width] kernel initialised as the authors' (Flax's default: truncated-normal LeCun,
    fan-in heads · fan as JAX counts a 3-d kernel; the 0.8796 restores the variance the 2σ cut removes)."""
    std = 1.0 / math.sqrt(heads * fan) / 0.87962566103423978
    return nn.Parameter(nn.init.trunc_normal_(torch.empty(heads, fan, width), std=std, a=-2 * std, b=2 * std))


class BucketScorers(nn.Module):
    """H_Q and H_K per head, [B, H, n, d] → [B, H, n, buckets]: every layer's kernel is a mix of one
    shared by both sides and one of the side's own; ReLU between layers (``hidden`` > 0)."""

    def __init__(self, heads: int, dim: int, buckets: int, hidden: int, own_share: float):
        super().__init__()
        heads = max(heads, 1)
        widths = [dim, hidden, buckets] if hidden else [dim, buckets]
        self.own_share = own_share
        self.shared, self.query, self.key = (
            nn.ParameterList(lecun_kernel(heads, a, b) for a, b in zip(widths, widths[1:])) for _ in range(3))

    def _score(self, x, own):
        for i, (shared, side) in enumerate(zip(self.shared, own)):
            kernel = (1 - self.own_share) * shared + self.own_share * side
            x = torch.einsum("bhnd,hdk->bhnk", x, kernel.to(x.dtype))
            if i < len(own) - 1:
                x = torch.relu(x)
        return x

    def forward(self, q, k):
        return self._score(q, self.query), self._score(k, self.key)


def padded_length(n: int, buckets: int, block: int) -> tuple:
    """(L, P): the authors' local block size (``block``, or ⌈n / buckets⌉ for 0) and the length their module
    pads n to, max(⌈n / L⌉ · L, buckets · L) (mixed_attention.py: extra_len). A block longer than n is taken
    as n: either holds every token in one block beside padding, and buckets of n tokens, the same outputs,
    but padding to buckets · L grew with L."""
    block = min(block or -(-n // buckets), max(n, 1))
    return block, max(-(-n // block) * block, buckets * block)


def block_local_attention(q, k, v, mask, block: int, padded: int, dropout: float = 0.0):
    """The authors' local heads (local_attention.py, non-causal), [B, H, n, d] → [B, H, n, dv]: q, k, v zero-padded
    to ``padded`` and cut into blocks of ``block``; a query attends the 3·block slots of its own block, the one
    before and the one after (cyclically, as listed there, so a block seen twice counts twice; a single block
    thrice), a padded key's score −1e10, softmax over the slots, then ``dropout`` on the probabilities. Only the
    query blocks holding positions below n are computed (the others' rows are cut off anyway)."""
    batch, heads, n, d = q.shape
    blocks, used = padded // block, -(-n // block)

    def cut(x):
        return F.pad(x, (0, 0, 0, padded - n)).view(x.shape[0], x.shape[1], blocks, block, x.shape[-1])

    def around(x):  # [.., blocks, block, ..] → [.., used, 3·block, ..]: own, previous, next
        return torch.cat([x[:, :, :used], x.roll(1, dims=2)[:, :, :used], x.roll(-1, dims=2)[:, :, :used]], dim=3)

    real = around(F.pad(mask, (0, padded - n)).view(batch, 1, blocks, block, 1))[..., 0]  # [B, 1, used, 3·block]
    scores = (cut(q)[:, :, :used] * d ** -0.5) @ around(cut(k)).transpose(-1, -2)  # [B, H, used, block, 3·block]
    weights = torch.softmax(lra_masked(scores, real[:, :, :, None, :]), dim=-1)
    if dropout:
        weights = F.dropout(weights, dropout)
    out = weights @ around(cut(v))
    return out.reshape(batch, heads, used * block, v.shape[-1])[:, :, :n]


def block_local_keys(n: int, block: int, padded: int, mask) -> torch.Tensor:
    """Dense [B, 1, n, n] bool: the keys a block-local head attends (its own, previous and next block)."""
    position = torch.arange(n, device=mask.device) // block
    apart = (position[None, :] - position[:, None]) % (padded // block)
    near = (apart == 0) | (apart == 1) | (apart == padded // block - 1)
    return near[None, None] & mask[:, None, None, :]


def one_hot_members(index: torch.Tensor, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bucket members [B, H, buckets, size] (token indices) → a 0/1 matrix [B, H, buckets, n]."""
    return torch.zeros(*index.shape[:3], n, dtype=dtype, device=index.device).scatter_(-1, index, 1.0)


def positive_features(x, features, real, shared: bool):
    """FAVOR+ features exp(w·x̃ − ‖x̃‖²/2 − c), x̃ = x / d^{1/4}, zero on padded tokens. The stabiliser c
    is one constant per (batch, head) over real tokens and features (``shared``), or each token's own
    maximum over features."""
    x = x * x.shape[-1] ** -0.25
    logits = (x @ features.T - 0.5 * x.square().sum(-1, keepdim=True)).masked_fill(~real, float("-inf"))
    shift = logits.amax(dim=(-2, -1) if shared else -1, keepdim=True).nan_to_num(neginf=0.0)
    return torch.exp(logits - shift)


def utility_targets(q, k, mask, query_member, key_member, features):
    """The attention utility of every bucket for every query and key, normalised over buckets:
    (ψ_Q, ψ_K), each [B, H, n, buckets], estimated with positive random features ``features`` [r, d].

    ψ_Q(i)_b ∝ φ(q_i) · Σ_{j∈K_b} φ(k_j) and ψ_K(j)_b ∝ Σ_{i∈Q_b} φ(q_i)·φ(k_j) / Ẑ_i, Ẑ_i =
    φ(q_i) · Σ_j φ(k_j) over real keys: A_ij estimated consistently (→ the exact utility as r → ∞).
    A per-query factor cancels in both (so each query keeps its own stabiliser), but a per-key one
    would weight keys arbitrarily, so all keys share one. ``query_member``/``key_member`` are
    [B, H, buckets, n] 0/1; padded tokens must not be members (their targets are all zero).
    """
    real = mask[:, None, :, None]
    phi_q = positive_features(q, features, real, shared=False)
    phi_k = positive_features(k, features, real, shared=True)
    z = (phi_q @ phi_k.sum(-2, keepdim=True).transpose(-1, -2)).clamp(min=1e-30)  # [B, H, n, 1]
    utility_q = phi_q @ (key_member @ phi_k).transpose(-1, -2)
    utility_k = phi_k @ (query_member @ (phi_q / z)).transpose(-1, -2)
    return tuple(u / u.sum(-1, keepdim=True).clamp(min=1e-30) for u in (utility_q, utility_k))


@register("learned_hash", LearnedHashOptions)
class LearnedHashAttention(Attention):
    subquadratic = True

    @classmethod
    def check_shape(cls, options: LearnedHashOptions, num_heads, head_dim, max_seq_len) -> None:
        if options.local_heads > num_heads:
            raise InvalidOption("local_heads", options.local_heads, f"between 0 and num_heads={num_heads}")
        at_most_length(options, "num_buckets", max_seq_len, "one query and one key per bucket")

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        hashed_heads = num_heads - options.local_heads
        self.scorers = BucketScorers(hashed_heads, head_dim, options.num_buckets, options.hidden_dim,
                                     options.own_kernel_share)
        self.register_buffer("features", orthogonal_gaussian_features(options.num_random_features, head_dim))
        self.local = (LongformerAttention(options.local_heads, head_dim, max_seq_len,
                                          LongformerOptions(window_size=options.local_window, num_global_tokens=0))
                      if options.local_heads and options.local_pattern == "sliding" else None)

    @classmethod
    def label(cls, options: LearnedHashOptions) -> str:
        return "LHA"

    def padded_length(self, n: int) -> tuple:
        """(L, P): the local block size and the length the authors' module pads n to."""
        return padded_length(n, self.options.num_buckets, self.options.local_block_size)

    def bucket_size(self, n: int) -> int:
        """The authors' ⌊(P // B) · √2⌋ on their padded length P (at least 1, at most n)."""
        return max(1, min(n, int((self.padded_length(n)[1] // self.options.num_buckets) * math.sqrt(2))))

    @at_least_float32
    def _local(self, q, k, v, mask):
        if self.local is not None:
            return self.local(q, k, v, mask)
        return block_local_attention(q, k, v, mask, *self.padded_length(q.shape[2]),
                                     dropout=self.options.dropout if self.training else 0.0)

    def _normalised(self, q, k):
        if not self.options.normalize_qk:
            return q, k
        return tuple(F.layer_norm(x, x.shape[-1:], eps=LAYER_NORM_EPS) for x in (q, k))

    def scored_qk(self, q, k):
        """The q and k whose softmax each head computes within its buckets or window: LayerNorm'd on
        the hashed heads (``normalize_qk``), as given on the local heads (for analysis)."""
        split = self.options.local_heads
        hashed_q, hashed_k = self._normalised(q[:, split:], k[:, split:])
        return torch.cat([q[:, :split], hashed_q], dim=1), torch.cat([k[:, :split], hashed_k], dim=1)

    def memberships(self, q, k, mask):
        """Scores and members per bucket: (score_q, score_k, query_index, key_index), indices
        [B, H, buckets, size]; each bucket takes the tokens ranked highest by ``membership``."""
        score_q, score_k = self.scorers(q.detach(), k.detach())
        padded = ~mask[:, None, :, None]
        size = self.bucket_size(q.shape[2])

        def members(score):
            rank = score.softmax(-1) if self.options.membership == "softmax" else score
            return rank.masked_fill(padded, float("-inf")).transpose(-1, -2).topk(size, dim=-1).indices

        return score_q, score_k, members(score_q), members(score_k)

    def attended_keys(self, q, k, mask):
        """Dense [B, H, n, n] bool: keys sharing a bucket with each query, or the window of a local
        head (for analysis at small n)."""
        split, n = self.options.local_heads, q.shape[2]
        if not split:
            local = None
        elif self.local is not None:
            local = self.local.attended_keys(q[:, :split], k[:, :split], mask)
        else:
            local = block_local_keys(n, *self.padded_length(n), mask).expand(q.shape[0], split, -1, -1)
        _, _, query_index, key_index = self.memberships(q[:, split:].float(), k[:, split:].float(), mask)
        in_q, in_k = one_hot_members(query_index, n), one_hot_members(key_index, n)
        hashed = (in_q.transpose(-1, -2) @ in_k > 0) & mask[:, None, None, :]
        return hashed if local is None else torch.cat([local, hashed], dim=1)

    def bucket_counts(self, q, k, mask):
        """Real queries and keys per bucket of the hashed heads, each token in the bucket its scorer
        ranks highest (the learned hash before the balanced top-k): two [B, H_hashed, 1, buckets]."""
        split = self.options.local_heads
        score_q, score_k = self.scorers(q[:, split:].float(), k[:, split:].float())

        def counts(score):
            one_hot = F.one_hot(score.argmax(-1), self.options.num_buckets)
            return (one_hot * mask[:, None, :, None]).sum(-2, keepdim=True)

        return counts(score_q), counts(score_k)

    def forward(self, q, k, v, mask=None):
        if q.shape[2] == 0:  # no token: no bucket, and the utility loss (a mean over real tokens) is 0
            self.aux_loss = q.new_zeros((), dtype=torch.float32) if torch.is_grad_enabled() else None
            return no_tokens(q, k, v)
        split = self.options.local_heads
        if not split:
            return self._hashed(q, k, v, mask)
        local = self._local(q[:, :split], k[:, :split], v[:, :split], mask)
        hashed = self._hashed(q[:, split:], k[:, split:], v[:, split:], mask) if split < q.shape[1] else local[:, :0]
        return torch.cat([local, hashed], dim=1)

    @at_least_float32
    def _hashed(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        score_q, score_k, query_index, key_index = self.memberships(q, k, mask)
        q, k = self._normalised(q, k)
        buckets, size = query_index.shape[2], query_index.shape[3]
        flat_q, flat_k = query_index.flatten(2), key_index.flatten(2)
        bq = gather_rows(q, flat_q).view(batch, heads, buckets, size, d)
        bk, bv = (gather_rows(x, flat_k).view(batch, heads, buckets, size, d) for x in (k, v))
        key_real = mask[:, None, :].expand(batch, heads, n).gather(2, flat_k).view(batch, heads, buckets, 1, size)
        scores = (bq @ bk.transpose(-1, -2) / math.sqrt(d)).masked_fill(~key_real, NEG_INF)
        lse = scores.logsumexp(dim=-1).flatten(2)  # [B, H, buckets * size]
        weights = torch.softmax(scores, dim=-1)
        if self.training and self.options.dropout:  # after the log-sum-exp: the merge weighs undropped buckets
            weights = F.dropout(weights, self.options.dropout)
        out = (weights @ bv).flatten(2, 3)

        # Merge every (bucket, slot) result into its query with log-sum-exp weights.
        top = lse.new_full((batch, heads, n), float("-inf")).scatter_reduce(2, flat_q, lse, "amax")
        weight = torch.exp(lse - top.gather(2, flat_q))
        numerator = torch.zeros_like(q).scatter_add_(2, flat_q.unsqueeze(-1).expand(-1, -1, -1, d), weight.unsqueeze(-1) * out)
        denominator = weight.new_zeros(batch, heads, n).scatter_add_(2, flat_q, weight)
        result = numerator / denominator.clamp(min=1e-30).unsqueeze(-1)

        self.aux_loss = (self.options.aux_loss_weight * self.utility_loss(q, k, mask, score_q, score_k, query_index, key_index)
                         if torch.is_grad_enabled() else None)
        return result

    def utility_features(self, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The random features of this step's utility estimate, drawn in float32 and returned in ``dtype``:
        fresh in training (``feature_draws=step``, from the global seeded generator), else the ones
        drawn at construction."""
        if self.training and self.options.feature_draws == "step":
            return orthogonal_gaussian_features(self.options.num_random_features, self.head_dim, device=device).to(dtype)
        return self.features.to(dtype)

    def utility_loss(self, q, k, mask, score_q, score_k, query_index, key_index):
        """KL(ψ ‖ softmax(H(x))) for queries and keys, averaged over real tokens and heads; q and k are
        the ones in-bucket attention scored (LayerNorm'd by default)."""
        n = q.shape[2]
        real = mask[:, None, :].to(q.dtype)
        query_member = one_hot_members(query_index, n, q.dtype) * real[:, :, None, :]
        key_member = one_hot_members(key_index, n, q.dtype) * real[:, :, None, :]
        target_q, target_k = utility_targets(q.detach(), k.detach(), mask, query_member, key_member,
                                             self.utility_features(q.device, q.dtype))

        def kl(target, scores):
            per_token = (target * (torch.log(target.clamp(min=1e-30)) - torch.log_softmax(scores, dim=-1))).sum(-1)
            return (per_token * real).sum() / real.sum().clamp(min=1) / q.shape[1]

        return kl(target_q, score_q) + kl(target_k, score_k)
