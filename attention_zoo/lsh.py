"""Content-based sparse attention with LSH buckets on separate Q and K hashes, balanced (the LSH
baseline of Sun, Yang & Yoo 2022).

Queries and keys are hashed with the same random rotations (angular LSH), each side is sorted by
(bucket, position) with padded positions last, and both sorted sequences are cut into
``num_buckets`` equal chunks; query chunk b attends to key chunk b (softmax within the chunk,
q·k/√d). Equal chunks keep the work balanced however skewed the buckets are: O(n² / num_buckets)
memory. Padding goes last on both sides, so the real queries and the real keys fill the same
leading slots and every chunk that holds a real query holds a real key.

``num_buckets`` is at most the input length N (``check_shape``): N buckets make chunks of one query and
one key, and more would still cut the sequence into N chunks while hashing into every bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention_zoo._common import (NEG_INF, draw_rotations, gather_rows, at_least_float32, pad_to_multiple, random_rotation_buckets,
                                   register_rotation_seed, sort_by_bucket)
from attention_zoo.options import InvalidOption, at_most_length, whole
from attention_zoo.registry import Attention, register


@dataclass
class LSHOptions:
    num_buckets: int = 32

    def __post_init__(self):
        whole(self, 1, "num_buckets")
        if self.num_buckets > 1 and self.num_buckets % 2:  # argmax over ±rotations: an odd count is one fewer
            raise InvalidOption("num_buckets", self.num_buckets, "even (argmax over ±rotations) or 1 (one bucket)")


@register("lsh", LSHOptions)
class LSHAttention(Attention):
    subquadratic = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        register_rotation_seed(self)

    @classmethod
    def label(cls, options: LSHOptions) -> str:
        return "LSH"

    @classmethod
    def check_shape(cls, options: LSHOptions, num_heads, head_dim, max_seq_len) -> None:
        at_most_length(options, "num_buckets", max_seq_len, "chunks of one query and one key")

    def sorted_chunks(self, q, k, mask):
        """Per head: query order, key order (padded positions last on both sides), chunk count and size."""
        n = q.shape[2]
        size = math.ceil(n / max(1, min(self.options.num_buckets, n)))
        chunks = math.ceil(n / size)
        rotations = draw_rotations(self, 1, q.shape[-1], self.options.num_buckets, q.device)
        query_order = sort_by_bucket(random_rotation_buckets(q, rotations)[:, :, 0], mask[:, None], self.options.num_buckets)
        key_order = sort_by_bucket(random_rotation_buckets(k, rotations)[:, :, 0], mask[:, None], self.options.num_buckets)
        return query_order, key_order, chunks, size

    def bucket_counts(self, q, k, mask):
        """Real queries and real keys per bucket, before the equal-chunk cut: two [B, H, 1, buckets]."""
        rotations = draw_rotations(self, 1, q.shape[-1], self.options.num_buckets, q.device)

        def counts(x):
            one_hot = torch.nn.functional.one_hot(random_rotation_buckets(x.float(), rotations), self.options.num_buckets)
            return (one_hot * mask[:, None, None, :, None]).sum(-2)

        return counts(q), counts(k)

    def attended_keys(self, q, k, mask):
        """Dense [B, H, n, n] bool: which keys each query attends to (for analysis at small n)."""
        query_order, key_order, chunks, size = self.sorted_chunks(q.float(), k.float(), mask)
        chunk_of_slot = torch.arange(q.shape[2], device=q.device).expand_as(query_order) // size

        def chunk_of_position(order):  # position order[..., s] sits in slot s
            return torch.empty_like(order).scatter_(-1, order, chunk_of_slot)

        query_chunk, key_chunk = chunk_of_position(query_order), chunk_of_position(key_order)
        return (query_chunk.unsqueeze(-1) == key_chunk.unsqueeze(-2)) & mask[:, None, None, :]

    @at_least_float32
    def forward(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        query_order, key_order, chunks, size = self.sorted_chunks(q, k, mask)
        length = chunks * size

        def arrange(x, order):
            return pad_to_multiple(gather_rows(x, order), length, 2).view(batch, heads, chunks, size, -1)

        real = mask[:, None, :, None].expand(batch, heads, n, 1).to(q.dtype)
        sq, sk, sv = arrange(q, query_order), arrange(k, key_order), arrange(v, key_order)
        key_real = arrange(real, key_order)[..., 0] > 0.5
        scores = (sq @ sk.transpose(-1, -2) / math.sqrt(d)).masked_fill(~key_real.unsqueeze(-2), NEG_INF)
        out = (torch.softmax(scores, dim=-1) @ sv).view(batch, heads, length, d)[:, :, :n]
        inverse = query_order.argsort(dim=-1)
        no_key = ~key_real.any(dim=-1)  # a chunk whose keys are all padding attends to nothing
        out = out.masked_fill(no_key.repeat_interleave(size, dim=-1)[:, :, :n].unsqueeze(-1), 0.0)
        return gather_rows(out, inverse)
