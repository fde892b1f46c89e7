"""Longformer attention (Beltagy et al. 2020): a sliding window plus global tokens.

Each token attends to keys within ``window_size // 2`` positions on either side; the first
``num_global_tokens`` tokens attend to every key and are attended by every query. Computed block by
block: the sequence is cut into blocks of ``window_size // 2`` and each query block scores only its
own and the two neighbouring key blocks, so memory is O(n · window), never n × n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attention_zoo import _flex
from attention_zoo._common import NEG_INF, at_least_float32, pad_to_multiple, scaled
from attention_zoo.options import choice, whole
from attention_zoo.registry import Attention, register


@dataclass
class LongformerOptions:
    window_size: int = 128  # the full window: window_size // 2 keys on each side
    num_global_tokens: int = 1  # the first tokens (CLS) are global
    impl: str = "auto"
    """``eager`` (blocked PyTorch, the reference), ``flex`` (FlexAttention, ``attention_zoo._flex``) or
    ``auto`` (Flex on CUDA, eager elsewhere)."""

    def __post_init__(self):
        whole(self, 2, "window_size")
        whole(self, 0, "num_global_tokens")
        choice(self, "impl", _flex.IMPLS)


@_flex.pattern_family("longformer")
def window_or_global(params, heads, query_length, key_length, device):
    """The pattern, params [half window, global tokens, causal], as a predicate of positions: keys within
    the half window, the global keys and the global queries' every key (causal: key ≤ query).
    ``attended_keys`` evaluates it densely, the Flex path block-sparsely."""
    half, globals_, causal = params

    def allowed(head, query, key):
        seen = ((query - key).abs() <= half) | (key < globals_) | (query < globals_)
        return seen & (key <= query) if causal else seen

    return allowed


@register("longformer", LongformerOptions)
class LongformerAttention(Attention):
    """Causal: the window's later half and later global tokens are masked (Beltagy et al. 2020, §3.1's
    autoregressive windowed attention)."""

    subquadratic = True
    has_flex_path = True
    supports_causal = True

    @classmethod
    def label(cls, options: LongformerOptions) -> str:
        return "Longformer"

    def attended_keys(self, q, k, mask):
        """Dense [B, H, n, n] bool: the window and the global tokens (for analysis at small n)."""
        n = q.shape[2]
        position = torch.arange(n, device=q.device)
        seen = window_or_global(list(self.flex_pattern(n).params), 1, n, n, q.device)(None, position[:, None], position[None, :])
        return (seen & mask[:, None, None, :]).expand(q.shape[0], q.shape[1], n, n)

    def flex_pattern(self, n: int) -> _flex.Pattern:
        params = (max(1, self.options.window_size // 2), min(self.options.num_global_tokens, n), self.causal)
        return _flex.Pattern("longformer", params, 1, n, n)

    def _flex_forward(self, q, k, v, mask):
        tables = _flex.block_tables(self.flex_pattern(q.shape[2]), q.device)
        return _flex.attend(scaled(q), k, v, tables, mask)

    @at_least_float32
    def forward(self, q, k, v, mask):
        if _flex.use_flex(self, q, k, v):
            return self._flex_forward(q, k, v, mask)
        batch, heads, n, _ = q.shape
        half = max(1, self.options.window_size // 2)
        block = min(half, n)
        globals_ = min(self.options.num_global_tokens, n)
        blocks = math.ceil(n / block)
        q = scaled(q)
        qb = pad_to_multiple(q, block, dim=2).view(batch, heads, blocks, block, -1)

        def neighbourhood(x):  # [B, H, blocks, 3 * block, ...]: previous, own and next block
            padded = pad_to_multiple(x, block, dim=2)
            padded = torch.cat([padded.new_zeros(padded[:, :, :block].shape), padded,
                                padded.new_zeros(padded[:, :, :block].shape)], dim=2)
            view = padded.view(*x.shape[:2], blocks + 2, block, *x.shape[3:])
            return torch.cat([view[:, :, :-2], view[:, :, 1:-1], view[:, :, 2:]], dim=3)

        keys, values = neighbourhood(k), neighbourhood(v)
        query_pos = torch.arange(blocks * block, device=q.device).view(blocks, block, 1)
        key_pos = (torch.arange(blocks, device=q.device).view(blocks, 1, 1) - 1) * block + \
            torch.arange(3 * block, device=q.device).view(1, 1, -1)
        allowed = ((query_pos - key_pos).abs() <= half) & (key_pos >= globals_) & (key_pos < n)
        if self.causal:
            allowed = allowed & (key_pos <= query_pos)
        key_real = neighbourhood(mask[:, None, :, None].float())[..., 0].unsqueeze(3) > 0.5
        allowed = allowed & key_real  # [B, 1, blocks, block, 3 * block]
        local_scores = (qb @ keys.transpose(-1, -2)).masked_fill(~allowed, NEG_INF)

        # Every query also sees the global keys.
        global_real = mask[:, None, None, None, :globals_]
        if self.causal:  # [B, 1, blocks, block, globals]
            global_real = global_real & (torch.arange(globals_, device=q.device) <= query_pos)
        global_scores = (qb @ k[:, :, None, :globals_].transpose(-1, -2)).masked_fill(~global_real, NEG_INF)
        weights = torch.softmax(torch.cat([global_scores, local_scores], dim=-1), dim=-1)
        out = weights[..., :globals_] @ v[:, :, None, :globals_] + weights[..., globals_:] @ values
        out = out.reshape(batch, heads, blocks * block, -1)[:, :, :n]

        if globals_:  # global queries attend to every key
            seen = mask[:, None, None, :]
            if self.causal:
                seen = seen & (torch.arange(n, device=q.device) <= torch.arange(globals_, device=q.device)[:, None])
            full = (q[:, :, :globals_] @ k.transpose(-1, -2)).masked_fill(~seen, NEG_INF)
            out = torch.cat([torch.softmax(full, dim=-1) @ v, out[:, :, globals_:]], dim=2)
        return out
