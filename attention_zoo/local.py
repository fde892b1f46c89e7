"""Local attention (the LRA baseline, Tay et al. 2021): softmax within non-overlapping groups of keys.

``grouping=contiguous`` (the default): the sequence is cut into blocks of ``block_size`` consecutive
positions and each query attends to the real keys of its own block only:

    out_i = Σ_{j ∈ B(i)} softmax_j(q_i · k_j / √d) v_j,   B(i) = {j : ⌊j / b⌋ = ⌊i / b⌋, j real}

(causal: also j ≤ i). A length that is not a multiple of b is padded internally with masked
positions; the last block is then shorter. Memory O(n · b). A block of n or more is the whole sequence
(softmax attention, causal or not), computed as one block of n whatever ``block_size`` says.

``grouping=strided``: what the LRA code's ``LocalAttention`` (models/local/local_attention.py) computes,
and so what LRA Table 1's Local row ran. It pads n to P = n + b − (n mod b) (a whole extra block when b
divides n) with zero q, k, v and reshapes [P] to [b, G = P / b]: position t = a·G + g is slot a of
group g, so a query attends to the b positions t' ≡ t (mod G), strided by G, not to its neighbours
(causal: slot a' ≤ a; a causal language model refuses it, see ``causal_leak``). Its padding mask is
reshaped the other way, [G, b] (``padding_mask.reshape(bs·num_blocks, block_size)``), so the pair
(a, a') of group g is allowed when positions g·b + a and g·b + a' are real, and otherwise scores the
LRA code's float32 s − 1e10 (−1e10 for |s| < 512); the padded positions count as real (``jnp.pad`` of
the boolean mask with −1e9 pads True). Both quirks are reproduced as they are.
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


GROUPINGS = ("contiguous", "strided")
# The LRA code's bias on a masked pair: it adds lax.select(mask > 0, 0, -1e10) to float32 scores, and in float32
# s − 1e10 is −1e10 for any |s| < 512. A masked pair's score is that float32 sum in any dtype (a row with every
# pair masked is then a uniform average in float64 too; a float64 addition would keep s).
LRA_MASK_BIAS = -1e10


def lra_masked(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``scores`` where ``allowed``, else the score plus −1e10 as the LRA code's float32 addition leaves it, in
    any dtype: −1e10 exactly for |s| < 512."""
    return torch.where(allowed, scores, (scores.float() + LRA_MASK_BIAS).to(scores.dtype))


@dataclass
class LocalOptions:
    block_size: int = 50
    """Positions per block: 50 is the LRA code's default (``LocalTransformerEncoder``, used by ListOps,
    Text and Retrieval); its Image and Pathfinder configs set 64."""
    grouping: str = "contiguous"
    """``contiguous``: blocks of consecutive positions; ``strided``: the LRA code's reshape (module
    docstring), which LRA Table 1's Local row sets."""
    dropout: float = 0.0
    """Dropout on the attention probabilities, active in training mode only."""
    impl: str = "auto"
    """``eager`` (blocked PyTorch, the reference), ``flex`` (FlexAttention, ``attention_zoo._flex``) or
    ``auto`` (Flex on CUDA, eager elsewhere)."""

    def __post_init__(self):
        whole(self, 1, "block_size")
        choice(self, "grouping", GROUPINGS)
        number(self, "dropout", 0.0, 1.0, high_open=True)
        choice(self, "impl", _flex.IMPLS)


@_flex.pattern_family("local")
def same_block(params, heads, query_length, key_length, device):
    """The contiguous pattern, params [block_size, causal], as a predicate of positions: same block of
    ``block_size`` (causal: key ≤ query). ``attended_keys`` evaluates it densely, the Flex path
    block-sparsely (the strided grouping uses it without causality on the permuted sequence)."""
    size, causal = params

    def allowed(head, query, key):
        seen = query // size == key // size
        return seen & (key <= query) if causal else seen

    return allowed


@register("local", LocalOptions)
class LocalAttention(Attention):
    """Causal: within its block a query sees only the keys at or before its position."""

    subquadratic = True
    has_flex_path = True
    supports_causal = True

    @classmethod
    def label(cls, options: LocalOptions) -> str:
        return "Local Attention"

    @classmethod
    def causal_leak(cls, options: LocalOptions) -> Optional[str]:
        """Strided: slot a of group g reads the mask bits of positions g·b + a and g·b + a', later ones among
        them, so a causal position would learn where the sequence ends."""
        if options.grouping == "strided":
            return ("grouping=strided reads the padding mask of later positions (the LRA code's reshape), so a "
                    "position would learn where its sequence ends; use attention.grouping=contiguous")
        return None

    @classmethod
    def flex_exact_on_every_row(cls, options: LocalOptions) -> bool:
        """Strided: its Flex path gives a masked pair the eager path's −1e10 score over the same padded groups."""
        return options.grouping == "strided"

    def attended_keys(self, q, k, mask: Optional[torch.Tensor]):
        """Dense [B, H, n, n] bool: the keys among the n positions each query attends to (for analysis at
        small n; ``strided`` also attends the zero keys of its internal padding, which this leaves out)."""
        n = q.shape[2]
        mask = torch.ones(q.shape[0], n, dtype=torch.bool, device=q.device) if mask is None else mask.bool()
        if self.options.grouping == "strided":
            return self._strided_pairs(mask, n)[:, None].expand(q.shape[0], q.shape[1], n, n)
        position = torch.arange(n, device=q.device)
        seen = same_block([self.options.block_size, self.causal], 1, n, n, q.device)(None, position[:, None], position[None, :])
        return (seen & mask[:, None, None, :]).expand(q.shape[0], q.shape[1], n, n)

    def _strided_geometry(self, n: int):
        """(P, G): the LRA code's padded length n + b − (n mod b) and its number of groups P / b."""
        size = self.options.block_size
        padded = n + size - n % size
        return padded, padded // size

    def _strided_real(self, mask: torch.Tensor, n: int) -> torch.Tensor:
        """[B, P] bool: the mask padded to P with True, as the LRA code's ``jnp.pad`` of its boolean mask
        (the padded positions count as real)."""
        padded, _ = self._strided_geometry(n)
        return torch.cat([mask, mask.new_ones(mask.shape[0], padded - n)], dim=1)

    def _strided_allowed(self, mask: torch.Tensor, n: int) -> torch.Tensor:
        """[B, G, b, b] bool: pair (slot a, slot a') of group g allowed, as the LRA code's mask says:
        positions g·b + a and g·b + a' real (:meth:`_strided_real`), and a' ≤ a when causal."""
        size = self.options.block_size
        _, groups = self._strided_geometry(n)
        real = self._strided_real(mask, n).view(-1, groups, size)
        allowed = real[:, :, :, None] & real[:, :, None, :]
        if self.causal:
            allowed = allowed & torch.ones(size, size, dtype=torch.bool, device=mask.device).tril()
        return allowed

    def _strided_pairs(self, mask: torch.Tensor, n: int) -> torch.Tensor:
        """[B, n, n] bool: query t attends key t' (both < n) in the strided grouping."""
        _, groups = self._strided_geometry(n)
        allowed = self._strided_allowed(mask, n)  # [B, g, a, a']
        position = torch.arange(n, device=mask.device)
        slot, group = position // groups, position % groups
        same = group[:, None] == group[None, :]
        pairs = allowed[:, group[:, None], slot[:, None], slot[None, :]]
        return pairs & same

    def _grouped(self, x):
        """[B, H, n, d] → [B, H, G, b, d], zero-padded to P: slot a of group g is position a·G + g."""
        batch, heads, n, _ = x.shape
        padded, groups = self._strided_geometry(n)
        x = torch.cat([x, x.new_zeros(batch, heads, padded - n, x.shape[-1])], dim=2)
        return x.view(batch, heads, self.options.block_size, groups, x.shape[-1]).transpose(2, 3)

    def _strided(self, q, k, v, mask):
        batch, heads, n, _ = q.shape
        padded, _ = self._strided_geometry(n)
        grouped = self._grouped
        scores = grouped(scaled(q)) @ grouped(k).transpose(-1, -2)  # [B, H, G, b, b]
        allowed = self._strided_allowed(mask, n)[:, None]
        weights = torch.softmax(lra_masked(scores, allowed), dim=-1)
        if self.training and self.options.dropout:
            weights = F.dropout(weights, self.options.dropout)
        out = (weights @ grouped(v)).transpose(2, 3).reshape(batch, heads, padded, v.shape[-1])
        return out[:, :, :n]

    def flex_pattern(self, n: int) -> _flex.Pattern:
        """What the Flex path computes at length n (strided: the groups of the permuted, padded sequence,
        causality in its score bias)."""
        if self.options.grouping == "strided":
            padded, _ = self._strided_geometry(n)
            return _flex.Pattern("local", (self.options.block_size, False), 1, padded, padded, folds_padding=False)
        return _flex.Pattern("local", (self.options.block_size, self.causal), 1, n, n)

    def _flex_contiguous(self, q, k, v, mask):
        tables = _flex.block_tables(self.flex_pattern(q.shape[2]), q.device)
        return _flex.attend(scaled(q), k, v, tables, mask)

    def _flex_strided(self, q, k, v, mask):
        """The strided grouping as contiguous blocks of the permuted sequence (slot a of group g at g·b + a),
        its mask quirk as a −1e10 score: in permuted coordinates the pair (r, r') is allowed when
        the positions r and r' of the padded mask are real, which is the LRA code's reshape."""
        batch, heads, n, _ = q.shape
        size = self.options.block_size
        padded, groups = self._strided_geometry(n)

        def permuted(x):  # [B, H, n, d] → [B, H, P, d]: position a·G + g at g·b + a
            return self._grouped(x).reshape(batch, heads, padded, -1)

        real = self._strided_real(mask, n)
        causal = self.causal

        def lra_bias(score, b, h, query, key):
            allowed = real[b, query] & real[b, key]
            if causal:
                allowed = allowed & (key <= query)
            return lra_masked(score, allowed)

        tables = _flex.block_tables(self.flex_pattern(n), q.device)
        out = _flex.attend(permuted(scaled(q)), permuted(k), permuted(v), tables, None, score_mod=lra_bias)
        out = out.view(batch, heads, groups, size, v.shape[-1]).transpose(2, 3).reshape(batch, heads, padded, -1)
        return out[:, :, :n]

    @at_least_float32
    def forward(self, q, k, v, mask):
        if _flex.use_flex(self, q, k, v):
            if self.options.grouping == "strided":
                return self._flex_strided(q, k, v, mask)
            return self._flex_contiguous(q, k, v, mask)
        if self.options.grouping == "strided":
            return self._strided(q, k, v, mask)
        batch, heads, n, _ = q.shape
        size = min(self.options.block_size, n)  # a longer block is the whole sequence: never padded past it
        blocks = math.ceil(n / size)

        def blocked(x):  # [B, H, n, d] → [B, H, blocks, size, d]
            return pad_to_multiple(x, size, dim=2).view(batch, heads, blocks, size, x.shape[-1])

        scores = blocked(scaled(q)) @ blocked(k).transpose(-1, -2)  # [B, H, blocks, size, size]
        key_real = pad_to_multiple(mask, size, dim=1, value=False).view(batch, 1, blocks, 1, size)
        allowed = key_real
        if self.causal:
            allowed = allowed & torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        weights = torch.softmax(scores.masked_fill(~allowed, NEG_INF), dim=-1)
        if self.training and self.options.dropout:
            weights = F.dropout(weights, self.options.dropout)
        out = (weights @ blocked(v)).view(batch, heads, blocks * size, v.shape[-1])
        return out[:, :, :n]
