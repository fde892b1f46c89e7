"""Reformer LSH attention (Kitaev et al. 2020), as the reference the YOSO and LRA tables ran
(trax; its port, Hugging Face ``LSHSelfAttention``, with the default configuration).

Shared QK: the keys are the queries normalized to unit length (the ``k`` input is not used), and
the logit is q·k̂ with no further 1/√d (``score_scale=sqrt_d`` divides by √d, the textbook
formula). Each of ``num_hashes`` rounds buckets the tokens by random rotations (one rotation per
head and round; bucket = argmax([xR; −xR])); padded tokens go to an extra last bucket. The rounds'
sorted sequences are concatenated, the whole is cut into chunks of ``chunk_size``, and every chunk
attends to itself and ``chunks_before`` / ``chunks_after`` neighbouring chunks of the
concatenation, wrapping around: a round's first chunk looks back into the previous round's last
one. A token does not attend to itself unless it has no other key (its logit is −1e5). Rounds are
merged with weights softmax over rounds of each round's log-sum-exp; keys seen twice (in two
rounds, or through the wrap) count twice, as in the reference. A sequence no longer than one chunk
is plain shared-QK attention with the self mask (one round, no hashing).

Projections: the model's query projection (its output, q) and value projection feed this module;
HF's are ``query_key`` and ``value`` without bias, which ``projection_bias=false`` reproduces (the
model then builds its Q, K, V projections without one; ``lra.model.projection_bias``).

Number of buckets: ``num_buckets``, or 0 for the reference's rule: 2^⌊log2(2·⌊n / chunk_size⌋)⌋,
factorized into two rotations of 2^⌊p/2⌋ and 2^⌈p/2⌉ buckets (bucket = b₁ + 2^⌊p/2⌋·b₂) when it
exceeds 2·max(⌊√(max_seq_len / chunk_size)⌋, chunk_size). A ``num_buckets`` set explicitly is at most
the input length N (``check_shape``): more buckets than tokens leave most of them empty, while the hashing's
n × num_buckets / 2 rotation scores per round keep growing (a large value ran out of memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

import torch

from attention_zoo._common import NEG_INF, draw_normal, at_least_float32, pad_to_multiple, register_rotation_seed, sort_by_bucket
from attention_zoo.options import InvalidOption, choice, whole
from attention_zoo.registry import Attention, register

SELF_SCORE = -1e5
SCORE_SCALES = ("none", "sqrt_d")


@dataclass
class ReformerOptions:
    num_hashes: int = 2
    chunk_size: int = 64
    num_buckets: int = 0  # 0: the reference's rule (2n / chunk_size, a power of two, factorized when large)
    chunks_before: int = 1  # chunks of the concatenated rounds each chunk also attends to (the reference: 1)
    chunks_after: int = 0  # the reference: 0
    score_scale: str = "none"  # none: q·k̂ (trax, HF) | sqrt_d: q·k̂/√d
    # The model's Q, K, V projections with a bias (the LRA code's Flax port); false: without, as HF
    # LSHSelfAttention's query_key and value (read by lra.model.projection_bias)
    projection_bias: bool = True

    def __post_init__(self):
        if not isinstance(self.projection_bias, bool):
            raise InvalidOption("projection_bias", self.projection_bias, "true or false")
        whole(self, 1, "num_hashes", "chunk_size")
        whole(self, 0, "num_buckets", "chunks_before", "chunks_after")
        if self.num_buckets % 2 and self.num_buckets != 1:
            raise InvalidOption("num_buckets", self.num_buckets, "even (argmax over ±rotations), 1 (no hashing) "
                                "or 0 (automatic)")
        choice(self, "score_scale", SCORE_SCALES)


def chunk_neighbourhood(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """[B, H, chunks, c, ...] → [B, H, chunks, (before + 1 + after)·c, ...]: each chunk with the chunks
    ``before`` back and ``after`` ahead, wrapping around the chunk axis."""
    return torch.cat([x.roll(-offset, dims=2) for offset in range(-before, after + 1)], dim=3)


def length_normalized(x: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    """x / √(‖x‖² + d·ε): unit length, with the reference's ε on the mean square."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + epsilon) / math.sqrt(x.shape[-1])


@register("reformer", ReformerOptions)
class ReformerAttention(Attention):
    subquadratic = True
    shared_qk = True  # the keys are the normalized queries; the k input is unused

    @classmethod
    def unread_inputs(cls, options: ReformerOptions) -> frozenset:
        return frozenset({"k"})

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        register_rotation_seed(self)

    @classmethod
    def label(cls, options: ReformerOptions) -> str:
        return "Reformer"

    @classmethod
    def check_shape(cls, options: ReformerOptions, num_heads, head_dim, max_seq_len) -> None:
        if options.num_buckets > max_seq_len:
            raise InvalidOption("num_buckets", options.num_buckets, f"0 (the reference's rule) or at most the input "
                                f"length N = {max_seq_len} (N: as many buckets as tokens)")

    def bucket_factors(self, n: int) -> List[int]:
        """Buckets per rotation; their product is the number of buckets."""
        o = self.options
        if o.num_buckets:
            return [o.num_buckets]
        power = max(1, (2 * (n // o.chunk_size)).bit_length() - 1)
        limit = 2 * max(int((self.max_seq_len // o.chunk_size) ** 0.5), o.chunk_size)
        return [2**power] if 2**power <= limit else [2 ** (power // 2), 2 ** (power - power // 2)]

    def rotations(self, dim: int, factors: List[int], device) -> torch.Tensor:
        """[heads, dim, rounds, Σ factors / 2] random rotations (the reference's layout)."""
        return draw_normal(self, (self.num_heads, dim, self.options.num_hashes, sum(f // 2 for f in factors)), device)

    def hash(self, q: torch.Tensor, real: torch.Tensor) -> tuple:
        """(buckets [B, H, R, L] with padded tokens in an extra last bucket, number of buckets + 1); in
        float32 whatever q's dtype (see :func:`~attention_zoo._common.random_rotation_buckets`)."""
        factors = self.bucket_factors(q.shape[2])
        rotated = torch.einsum("bhnd,hdrk->bhrnk", q.detach().float(), self.rotations(q.shape[-1], factors, q.device))
        buckets, first, stride = rotated.new_zeros(rotated.shape[:-1], dtype=torch.long), 0, 1
        for factor in (f for f in factors if f > 1):
            part = rotated[..., first : first + factor // 2]
            buckets = buckets + stride * torch.cat([part, -part], dim=-1).argmax(dim=-1)
            first, stride = first + factor // 2, stride * factor
        return torch.where(real[:, None, None, :], buckets, stride), stride + 1

    def sorted_rounds(self, q: torch.Tensor, mask: torch.Tensor):
        """Padded to whole chunks: (q, real [B, L], order [B, H, R·L] of positions, chunk size).

        ``order`` holds every round's positions sorted by (bucket, position), rounds concatenated."""
        n = q.shape[2]
        if n <= self.options.chunk_size:  # one chunk: no hashing, one round
            order = torch.arange(n, device=q.device).expand(q.shape[0], q.shape[1], n)
            return q, mask, order, n
        chunk = self.options.chunk_size
        q = pad_to_multiple(q, chunk, 2)
        real = pad_to_multiple(mask, chunk, 1, value=False)
        buckets, total = self.hash(q, real)
        order = sort_by_bucket(buckets, torch.ones_like(buckets, dtype=torch.bool), total)
        return q, real, order.flatten(2), chunk

    def neighbourhood(self, x: torch.Tensor, chunk: int) -> torch.Tensor:
        chunks = x.reshape(*x.shape[:2], -1, chunk, *x.shape[3:])
        if chunks.shape[2] == 1:
            return chunks
        return chunk_neighbourhood(chunks, self.options.chunks_before, self.options.chunks_after)

    def bucket_counts(self, q, k, mask):
        """Real queries (and, shared-QK, keys) per bucket and round: two [B, H, R, buckets]."""
        q = q.float()
        if q.shape[2] <= self.options.chunk_size:
            counts = mask.sum(-1).view(-1, 1, 1, 1).expand(q.shape[0], q.shape[1], 1, 1).to(torch.long)
            return counts, counts
        q = pad_to_multiple(q, self.options.chunk_size, 2)
        real = pad_to_multiple(mask, self.options.chunk_size, 1, value=False)
        buckets, total = self.hash(q, real)
        counts = torch.nn.functional.one_hot(buckets, total)[..., :-1].sum(-2)
        return counts, counts

    def attended_keys(self, q, k, mask):
        """Dense [B, H, n, n] bool: the real keys in a query's chunk neighbourhood in any round, not
        itself unless it sees no other key (for analysis at small n)."""
        n, (batch, heads) = q.shape[2], q.shape[:2]
        _, real, order, chunk = self.sorted_rounds(q.float(), mask)
        length = real.shape[-1]
        query_pos = order.view(batch, heads, -1, chunk, 1)
        key_pos = self.neighbourhood(order, chunk).unsqueeze(-2)
        pairs = (query_pos * length + key_pos).flatten(2)
        seen = torch.zeros(batch, heads, length * length, dtype=torch.bool, device=q.device)
        seen = seen.scatter_(-1, pairs, True).view(batch, heads, length, length)
        seen &= real[:, None, None, :]
        itself = torch.eye(length, dtype=torch.bool, device=q.device)
        others = (seen & ~itself).any(-1, keepdim=True)
        return (seen & ~(itself & others))[:, :, :n, :n]

    @at_least_float32
    def forward(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        q, real, order, chunk = self.sorted_rounds(q, mask)
        v = pad_to_multiple(v, chunk, 2)
        length, rounds = q.shape[2], order.shape[-1] // q.shape[2]

        def sort(x):  # [B, H, L, ...] → [B, H, R·L, ...] in the sorted order
            index = order.view(*order.shape, *([1] * (x.dim() - 3))).expand(*order.shape, *x.shape[3:])
            return x.gather(2, index)

        sq, sv = sort(q), sort(v)
        sreal = sort(real[:, None, :].expand(batch, heads, length))
        queries = sq.view(batch, heads, -1, chunk, d)
        keys = self.neighbourhood(length_normalized(sq), chunk)
        values, key_pos, key_real = (self.neighbourhood(x, chunk) for x in (sv, order, sreal))
        scores = queries @ keys.transpose(-1, -2)
        if self.options.score_scale == "sqrt_d":
            scores = scores / math.sqrt(d)
        scores = scores.masked_fill(~key_real.unsqueeze(-2), NEG_INF)
        query_pos = order.view(batch, heads, -1, chunk, 1)
        scores = scores.masked_fill(query_pos == key_pos.unsqueeze(-2), SELF_SCORE)
        lse = scores.logsumexp(dim=-1)  # [B, H, chunks, chunk]
        out = torch.softmax(scores, dim=-1) @ values

        # Undo the sort, then merge the rounds by their log-sum-exp.
        inverse = order.view(batch, heads, rounds, length).argsort(dim=-1)
        out = out.view(batch, heads, rounds, length, d).gather(3, inverse.unsqueeze(-1).expand(-1, -1, -1, -1, d))
        lse = lse.view(batch, heads, rounds, length).gather(3, inverse)
        weights = torch.softmax(lse, dim=2).unsqueeze(-1)
        return (weights * out).sum(dim=2)[:, :, :n]
