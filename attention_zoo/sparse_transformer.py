"""Sparse Transformer attention, the fixed pattern (Child et al. 2019, §4.2–4.3), as the LRA code runs it.

With block length l and summary width c, query i attends to the union ("merged" heads, §4.3) of

    A(1)_i = {j : ⌊j / l⌋ = ⌊i / l⌋}                  its own block,
    A(2)_i = {j : j mod l ∈ {t, t + 1, …, l}}, t = l − c   the summary positions of every block,

where the paper's j mod l = l is 0: each block's first position and its last c are summaries (c + 1
per block). As in the LRA code (``sparse_attention.py``: "all attention patterns are causal") both
sets are cut to j ≤ i even in the classifier's encoder (``unidirectional``). With ``cls_token``
position 0 is the classifier's CLS token, as the LRA code's ``use_cls_token``: it attends to every
key, every query attends to it, and the pattern above indexes the positions after it from 0.

Computed per query block: its own block (l keys) plus the summary positions of the other blocks,
gathered once; never an n × n mask. The summaries grow with n, so memory is O(n · (l + n(c + 1)/l)):
quadratic, (c + 1)/l of dense attention's (22 % at the LRA's l = 50, c = 10); the paper takes l ≈ √n.
A block as long as the positions after the CLS token, or longer, holds them all (its own block is every key:
softmax, cut to j ≤ i when ordered), computed as that one block whatever ``block_size`` says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attention_zoo import _flex
from attention_zoo._common import NEG_INF, at_least_float32, pad_to_multiple, scaled
from attention_zoo.options import choice, number, whole
from attention_zoo.registry import Attention, register


@dataclass
class SparseTransformerOptions:
    block_size: int = 50
    """l, the stride of the fixed pattern: 50 in the LRA code (``train_utils.get_model``:
    ``Fixed1Pattern(block_size=50)``, ``Fixed2Pattern(block_size=50, c=10)``, every task)."""
    summary_size: int = 10
    """c: the last c positions of each block (and its first, see the module docstring) are summaries."""
    unidirectional: bool = True
    """Keys at or before the query only, as the LRA encoder (its patterns are causal); false: the
    fixed pattern in both directions."""
    cls_token: bool = True
    """Position 0 attends and is attended densely (the LRA code whenever it pools by CLS: ListOps,
    Text, Retrieval, Image; its Pathfinder pools by mean, so set false there)."""
    dropout: float = 0.0
    """Dropout on the attention probabilities, active in training mode only."""
    impl: str = "auto"
    """``eager`` (blocks and gathered summaries in PyTorch, the reference), ``flex`` (FlexAttention,
    ``attention_zoo._flex``) or ``auto`` (Flex on CUDA, eager elsewhere)."""

    def __post_init__(self):
        whole(self, 1, "block_size")
        whole(self, 0, "summary_size", maximum=self.block_size - 1)
        number(self, "dropout", 0.0, 1.0, high_open=True)
        choice(self, "impl", _flex.IMPLS)


def summary_offsets(block_size: int, summary_size: int) -> list:
    """Offsets within a block of its summary positions: 0 and l − c … l − 1."""
    return [0] + list(range(max(1, block_size - summary_size), block_size))


def summary_count(n: int, size: int, summary_size: int, first: int) -> int:
    """How many summary positions a sequence of length n has (after the CLS position)."""
    full, rest = divmod(n - first, size)
    offsets = summary_offsets(size, summary_size)
    return full * len(offsets) + sum(offset < rest for offset in offsets)


def summary_position(index: torch.Tensor, size: int, summary_size: int, first: int) -> torch.Tensor:
    """The sequence position of the index-th summary position, in order (:func:`summary_offsets` per block:
    0, then l − c … l − 1), computed on index's device."""
    per_block = summary_size + 1
    slot = index.remainder(per_block)
    offset = torch.where(slot == 0, 0, size - summary_size + slot - 1)
    return first + index.div(per_block, rounding_mode="floor") * size + offset


def pattern_parts(size: int, summary_size: int, first: int, ordered: bool, causal: bool):
    """The pattern as two predicates of positions: ``own(query, key)``, the query's own block and the CLS
    row and column, and ``other(query, key)``, the summary keys of the other blocks. ``attended_keys``
    evaluates their union densely, the Flex path block-sparsely (:func:`own_block_or_summary`)."""
    def own(query, key):
        q_at, k_at = query - first, key - first  # the pattern's indices
        block = (q_at >= 0) & (k_at >= 0) & (q_at.div(size, rounding_mode="floor") == k_at.div(size, rounding_mode="floor"))
        if ordered:
            block = block & (k_at <= q_at)
        cls_column = (key < first) & (query >= first)
        cls_row = (query < first) & ((key <= 0) if causal else (key >= 0))
        return block | cls_column | cls_row

    def other(query, key):
        q_at, k_at = query - first, key - first
        offset = k_at.remainder(size)
        summary = (k_at >= 0) & ((offset == 0) | (offset >= size - summary_size))
        q_block, k_block = q_at.div(size, rounding_mode="floor"), k_at.div(size, rounding_mode="floor")
        elsewhere = k_block < q_block if ordered else k_block != q_block
        return summary & elsewhere & (q_at >= 0)

    return own, other


@_flex.pattern_family("sparse_transformer")
def own_block_or_summary(params, heads, query_length, key_length, device):
    """The pattern over n + S keys, params [block_size, summary_size, first, ordered, causal]: key j < n is
    position j (own block, CLS), key n + s is the s-th summary position (:func:`summary_position`), seen
    from the other blocks."""
    own, other = pattern_parts(*params)
    n, count = query_length, key_length - query_length

    def allowed(head, query, key):
        summary_at = summary_position((key - n).clamp_min(0), *params[:3])
        return torch.where(key < n, own(query, key), other(query, summary_at) & (key < n + count))

    return allowed


@register("sparse_transformer", SparseTransformerOptions)
class SparseTransformerAttention(Attention):
    """Causal: keys at or before the query, the CLS row included (it then sees only itself)."""

    has_flex_path = True
    supports_causal = True

    @classmethod
    def label(cls, options: SparseTransformerOptions) -> str:
        return "Sparse Transformer"

    @property
    def ordered(self) -> bool:
        return self.options.unidirectional or self.causal

    def attended_keys(self, q, k, mask: Optional[torch.Tensor]):
        """Dense [B, H, n, n] bool: the keys each query attends to (for analysis at small n)."""
        n = q.shape[2]
        mask = torch.ones(q.shape[0], n, dtype=torch.bool, device=q.device) if mask is None else mask.bool()
        position = torch.arange(n, device=q.device)
        own, other = pattern_parts(*self._params(n))
        seen = own(position[:, None], position[None, :]) | other(position[:, None], position[None, :])
        return (seen & mask[:, None, None, :]).expand(q.shape[0], q.shape[1], n, n)

    def _params(self, n: int) -> list:
        first = 1 if self.options.cls_token and n > 0 else 0
        return [self.options.block_size, self.options.summary_size, first, self.ordered, self.causal]

    def flex_pattern(self, n: int) -> _flex.Pattern:
        """Over n + S keys: the sequence (own block and CLS) then its S summary positions gathered once
        (the other blocks' summaries), so the block mask is banded plus an n × S strip, not n × n."""
        params = self._params(n)
        return _flex.Pattern("sparse_transformer", tuple(params), 1, n, n + summary_count(n, *params[:3]))

    def _flex_forward(self, q, k, v, mask):
        pattern = self.flex_pattern(q.shape[2])
        index = torch.arange(pattern.key_length - pattern.query_length, device=q.device)
        summaries = summary_position(index, *pattern.params[:3])  # on the device: nothing crosses from the host
        tables = _flex.block_tables(pattern, q.device)
        keys, values = torch.cat([k, k[:, :, summaries]], dim=2), torch.cat([v, v[:, :, summaries]], dim=2)
        return _flex.attend(scaled(q), keys, values, tables, torch.cat([mask, mask[:, summaries]], dim=1))

    @at_least_float32
    def forward(self, q, k, v, mask):
        if _flex.use_flex(self, q, k, v):
            return self._flex_forward(q, k, v, mask)
        n = q.shape[2]
        first = 1 if self.options.cls_token and n > 0 else 0
        q = scaled(q)
        body = self._pattern_rows(q[:, :, first:], k, v, mask, first)
        if not first:
            return body
        return torch.cat([self._cls_row(q[:, :, :1], k, v, mask), body], dim=2)

    def _dropout(self, weights):
        if self.training and self.options.dropout:
            return F.dropout(weights, self.options.dropout)
        return weights

    def _cls_row(self, q, k, v, mask):
        """Position 0's queries over every real key (only itself when causal)."""
        allowed = mask[:, None, None, :]
        if self.causal:
            allowed = allowed & (torch.arange(k.shape[2], device=k.device) == 0)
        weights = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~allowed, NEG_INF), dim=-1)
        return self._dropout(weights) @ v

    def _pattern_rows(self, q, k, v, mask, first: int):
        """The fixed pattern for the queries after the first ``first`` positions."""
        batch, heads, m, _ = q.shape
        size = min(self.options.block_size, max(m, 1))  # a longer block is all of it: never padded past m
        blocks = math.ceil(m / size)

        def blocked(x):  # [B, H, m, d] → [B, H, blocks, size, d]
            return pad_to_multiple(x, size, dim=2).view(batch, heads, blocks, size, x.shape[-1])

        qb, kb, vb = blocked(q), blocked(k[:, :, first:]), blocked(v[:, :, first:])
        real = pad_to_multiple(mask[:, first:], size, dim=1, value=False).view(batch, blocks, size)

        own_allowed = real[:, None, :, None, :]  # [B, 1, blocks, 1, size]
        if self.ordered:
            own_allowed = own_allowed & torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        own = (qb @ kb.transpose(-1, -2)).masked_fill(~own_allowed, NEG_INF)

        # The summary positions of the other blocks (the query's own are already among ``own``).
        offsets = torch.tensor(summary_offsets(size, self.options.summary_size), device=q.device)
        per_block = len(offsets)
        summary_k = kb[:, :, :, offsets].reshape(batch, heads, 1, blocks * per_block, k.shape[-1])
        summary_v = vb[:, :, :, offsets].reshape(batch, heads, 1, blocks * per_block, v.shape[-1])
        key_block = torch.arange(blocks, device=q.device).repeat_interleave(per_block)
        query_block = torch.arange(blocks, device=q.device)[:, None]
        other = key_block < query_block if self.ordered else key_block != query_block  # [blocks, blocks · s]
        summary_real = real[:, :, offsets].reshape(batch, 1, 1, 1, blocks * per_block)
        summary_allowed = other[:, None, :] & summary_real  # [B, 1, blocks, 1, blocks · s]
        summary = (qb @ summary_k.transpose(-1, -2)).masked_fill(~summary_allowed, NEG_INF)

        parts = [own, summary]
        if first:  # every query sees the CLS key
            cls_allowed = mask[:, None, None, None, :1]
            parts.append((qb @ k[:, :, None, :1].transpose(-1, -2)).masked_fill(~cls_allowed, NEG_INF))
        weights = self._dropout(torch.softmax(torch.cat(parts, dim=-1), dim=-1))
        summaries = blocks * per_block
        out = weights[..., :size] @ vb + weights[..., size:size + summaries] @ summary_v
        if first:
            out = out + weights[..., size + summaries:] @ v[:, :, None, :1]
        return out.reshape(batch, heads, blocks * size, v.shape[-1])[:, :, :m]
