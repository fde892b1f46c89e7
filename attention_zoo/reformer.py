"""Reformer LSH attention (Kitaev et al. 2020).

Shared QK: the keys are the normalized queries (the ``k`` input is not used). Each of
``num_hashes`` rounds buckets the queries by random rotations, sorts by (bucket, position), cuts the
sorted sequence into chunks of ``chunk_size`` and lets each chunk attend to itself and its two
neighbouring chunks (an encoder looks both ways). A token does not attend to itself unless it has no
other key (its score is −1e5, as in the paper). Rounds are merged with weights softmax over rounds of
each round's log-sum-exp. Keys repeated across rounds are not de-duplicated. Scores are q·k̂/√d.
Number of buckets: ``num_buckets``, or 0 for 2n / chunk_size rounded up to a power of two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention_zoo._common import NEG_INF, draw_rotations, in_float32, pad_to_multiple, random_rotation_buckets, sort_by_bucket
from attention_zoo.registry import Attention, register

SELF_SCORE = -1e5


@dataclass
class ReformerOptions:
    num_hashes: int = 2
    chunk_size: int = 64
    num_buckets: int = 0  # 0: automatic


def chunk_neighbourhood(x: torch.Tensor, chunks: int) -> torch.Tensor:
    """[..., chunks * c, ...] → [..., chunks, look * c, ...]: each chunk with its neighbours (wrapping)."""
    view = x.reshape(*x.shape[:3], chunks, -1, *x.shape[4:])
    offsets = [0] if chunks == 1 else [0, -1] if chunks == 2 else [-1, 0, 1]
    return torch.cat([view.roll(-o, dims=3) for o in offsets], dim=4)


@register("reformer", ReformerOptions)
class ReformerAttention(Attention):
    subquadratic = True
    shared_qk = True  # the keys are the normalized queries; the k input is unused

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        self.register_buffer("rotation_seed", torch.randint(0, 2**62, ()))

    @classmethod
    def label(cls, options: ReformerOptions) -> str:
        return "Reformer"

    def num_buckets(self, n: int) -> int:
        if self.options.num_buckets:
            return self.options.num_buckets
        return max(2, 2 ** math.ceil(math.log2(max(1, 2 * n / self.options.chunk_size))))

    def _buckets(self, q, mask):
        """Padded to whole chunks: (q, real [B, L], buckets [B, H, R, L], order [B, H, R, L], chunk)."""
        chunk = min(self.options.chunk_size, q.shape[2])
        buckets_total = self.num_buckets(q.shape[2])
        rotations = draw_rotations(self, self.options.num_hashes, q.shape[-1], buckets_total, q.device)
        q = pad_to_multiple(q, chunk, 2)
        real = pad_to_multiple(mask, chunk, 1, value=False)
        buckets = random_rotation_buckets(q, rotations)
        return q, real, buckets, sort_by_bucket(buckets, real[:, None, None, :], buckets_total), chunk

    def bucket_counts(self, q, k, mask):
        """Real queries (and, shared-QK, keys) per bucket and round: two [B, H, R, buckets]."""
        _, real, buckets, _, _ = self._buckets(q.float(), mask)
        counts = torch.nn.functional.one_hot(buckets, self.num_buckets(q.shape[2])) * real[:, None, None, :, None]
        return counts.sum(-2), counts.sum(-2)

    def attended_keys(self, q, k, mask):
        """Dense [B, H, n, n] bool: keys in a query's chunk or a neighbouring one in any round, not
        itself unless it sees no other key (for analysis at small n)."""
        n = q.shape[2]
        _, real, _, order, chunk = self._buckets(q.float(), mask)
        chunks = order.shape[-1] // chunk
        chunk_of_slot = (torch.arange(order.shape[-1], device=q.device) // chunk).expand_as(order)
        position_chunk = torch.empty_like(order).scatter_(-1, order, chunk_of_slot)[..., :n]  # [B, H, R, n]
        seen = torch.zeros(*q.shape[:2], n, n, dtype=torch.bool, device=q.device)
        for chunk_in_round in position_chunk.unbind(dim=2):
            apart = (chunk_in_round.unsqueeze(-2) - chunk_in_round.unsqueeze(-1)) % chunks
            seen |= (apart <= 1) | (apart == chunks - 1)
        seen &= real[:, None, None, :n]
        itself = torch.eye(n, dtype=torch.bool, device=q.device)
        others = (seen & ~itself).any(-1, keepdim=True)
        return seen & ~(itself & others)

    @in_float32
    def forward(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        rounds = self.options.num_hashes
        q, real, _, order, chunk = self._buckets(q, mask)
        v = pad_to_multiple(v, chunk, 2)
        length, chunks = q.shape[2], q.shape[2] // chunk

        def sort(x):  # [B, H, L, ...] → [B, H, R, L, ...]
            expanded = x.unsqueeze(2).expand(batch, heads, rounds, *x.shape[2:])
            return expanded.gather(3, order.view(*order.shape, *([1] * (x.dim() - 3))).expand(*order.shape, *x.shape[3:]))

        positions = torch.arange(length, device=q.device).expand(batch, heads, length)
        sq, sv = sort(q), sort(v)
        spos = sort(positions)
        sreal = sort(real[:, None, :].expand(batch, heads, length))
        sk = torch.nn.functional.normalize(sq, dim=-1)
        queries = sq.view(batch, heads, rounds, chunks, chunk, d)
        keys, values = chunk_neighbourhood(sk, chunks), chunk_neighbourhood(sv, chunks)
        key_pos, key_real = chunk_neighbourhood(spos, chunks), chunk_neighbourhood(sreal, chunks)
        scores = queries @ keys.transpose(-1, -2) / math.sqrt(d)
        query_pos = spos.view(batch, heads, rounds, chunks, chunk, 1)
        scores = scores.masked_fill(query_pos == key_pos.unsqueeze(-2), SELF_SCORE)
        scores = scores.masked_fill(~key_real.unsqueeze(-2), NEG_INF)
        lse = scores.logsumexp(dim=-1)  # [B, H, R, chunks, chunk]
        out = torch.softmax(scores, dim=-1) @ values

        # Undo the sort, then merge the rounds by their log-sum-exp.
        inverse = order.argsort(dim=-1)
        out = out.view(batch, heads, rounds, length, d).gather(3, inverse.unsqueeze(-1).expand(-1, -1, -1, -1, d))
        lse = lse.view(batch, heads, rounds, length).gather(3, inverse)
        weights = torch.softmax(lse, dim=2).unsqueeze(-1)
        return (weights * out).sum(dim=2)[:, :, :n]
