"""BigBird attention, ITC (Zaheer et al. 2020, §2 and App. D), as the LRA code runs it.

The sequence is cut into blocks of b positions (padded internally to a whole number of blocks,
nb of them). Query block i attends to the key blocks

    global   {0, nb − 1}                         (the first and last blocks: 2b global tokens),
    window   {i − 1, i, i + 1}                    (3 blocks, the sliding window),
    random   R(i), r blocks drawn from {1, …, nb − 2} \\ {i − 1, i, i + 1},

and the two global query blocks attend to every key. Within the attended blocks it is softmax over the
real keys, scaled by 1/√d, each key counted once. As the LRA code (Google's BigBird code before it),
random blocks come only from the first ``random_blocks_within`` tokens: R(i) ⊆ {1, …, ⌊1024/b⌋ − 1}.

The random plan R is drawn per head from a generator seeded by the layer's ``plan_seed`` (the ``seed``
option, or a draw from the global, seeded generator at construction, saved with the weights), so it
is fixed for the whole run, in training and evaluation alike, as the LRA code's per-layer
``connectivity_seed``. Memory O(n · (5 + r) · b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attention_zoo import _flex
from attention_zoo._common import NEG_INF, at_least_float32, kept_draws, pad_to_multiple, scaled
from attention_zoo.options import choice, number, whole
from attention_zoo.registry import Attention, register

_SEED_LIMIT = 2**62


@dataclass
class BigBirdOptions:
    block_size: int = 64
    """b: 64 in the LRA code (``bigbird.py``'s default, every task's config)."""
    num_random_blocks: int = 3
    """r: random key blocks per query block, 3 in the LRA code (``BigBirdAttention``'s default)."""
    random_blocks_within: Optional[int] = 1024
    """Random blocks lie within the first this many tokens (the LRA code's ``last_idx=1024``); null:
    anywhere in the sequence."""
    seed: Optional[int] = None
    """The random plan's seed; null: each layer draws its own from the global generator when built."""
    dropout: float = 0.0
    """Dropout on the attention probabilities, active in training mode only (the LRA code's
    block-sparse path applies none)."""
    impl: str = "auto"
    """``eager`` (gathered blocks in PyTorch, the reference), ``flex`` (FlexAttention,
    ``attention_zoo._flex``) or ``auto`` (Flex on CUDA, eager elsewhere)."""

    def __post_init__(self):
        whole(self, 1, "block_size")
        whole(self, 0, "num_random_blocks")
        whole(self, 1, "random_blocks_within", optional=True)
        whole(self, 0, "seed", optional=True, maximum=_SEED_LIMIT - 1)
        number(self, "dropout", 0.0, 1.0, high_open=True)
        choice(self, "impl", _flex.IMPLS)


def highest_random_block(blocks: int, block_size: int, within: Optional[int]) -> int:
    """The last block a random block may be: nb − 2, or the last whole block before ``within``."""
    return blocks - 2 if within is None else min(blocks - 2, within // block_size - 1)


def draw_random_blocks(seed: int, heads: int, blocks: int, count: int, highest: int) -> torch.Tensor:
    """The plan [heads, nb − 2, count] (int64): for each head and middle query block i = 1 … nb − 2,
    ``count`` distinct blocks uniformly from {1, …, highest} \\ {i − 1, i, i + 1}, in random order; −1
    where fewer candidates remain. Uniform because candidates are ranked by i.i.d. uniform keys."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    query = torch.arange(1, blocks - 1)[:, None]
    key = torch.arange(blocks)[None, :]
    candidate = (key >= 1) & (key <= highest) & ((key - query).abs() > 1)  # [nb − 2, nb]
    ranks = torch.rand(heads, blocks - 2, blocks, generator=generator).masked_fill(~candidate, 2.0)
    chosen = ranks.argsort(dim=-1, stable=True)[..., :count]
    plan = torch.where(candidate.expand(heads, -1, -1).gather(-1, chosen), chosen, -1)
    if count > blocks:
        plan = torch.cat([plan, plan.new_full((heads, blocks - 2, count - blocks), -1)], dim=-1)
    return plan


@torch.library.custom_op("attention_zoo::bigbird_random_blocks", mutates_args=())
def random_blocks(seed: int, heads: int, blocks: int, count: int, highest: int, device: torch.device) -> torch.Tensor:
    """:func:`draw_random_blocks` on ``device``, made once per key (:func:`kept_draws`): an operator, so
    that torch.compile keeps it whole (a Generator object cannot be traced)."""
    def make():
        return (draw_random_blocks(seed, heads, blocks, count, highest).to(device),)

    return kept_draws(("bigbird_plan", seed, heads, blocks, count, highest, str(device)), make)[0]


@random_blocks.register_fake
def _(seed, heads, blocks, count, highest, device):
    return torch.empty((heads, blocks - 2, count), dtype=torch.long, device=device)


def block_plan(block_size: int, count: int, within: Optional[int], seed: int, heads: int, n: int, rows: int,
               device) -> torch.Tensor:
    """[heads, rows, rows] bool: key block j attended by query block i at length n (global, window or
    random; every pair when nb ≤ 2), padded with False to ``rows`` ≥ nb blocks."""
    blocks = math.ceil(n / block_size)
    index = torch.arange(rows, device=device)
    inside = index < blocks
    outer = ((index == 0) | (index == blocks - 1)) & inside
    seen = outer[:, None] | outer[None, :] | ((index[:, None] - index[None, :]).abs() <= 1)
    seen = (seen & inside[:, None] & inside[None, :]).expand(heads, rows, rows).clone()
    if blocks > 2:
        highest = highest_random_block(blocks, block_size, within)
        plan = random_blocks(seed, heads, blocks, count, highest, torch.device(device))  # [H, nb − 2, r]
        chosen = torch.zeros(heads, rows, rows + 1, dtype=torch.bool, device=device)
        chosen[:, 1:blocks - 1].scatter_(-1, torch.where(plan < 0, rows, plan), True)
        seen |= chosen[:, :, :rows]
    return seen


@torch.library.custom_op("attention_zoo::bigbird_block_plan", mutates_args=())
def kept_block_plan(block_size: int, count: int, within: Optional[int], seed: int, heads: int, n: int, rows: int,
                    device: torch.device) -> torch.Tensor:
    """:func:`block_plan`, built once per key (:func:`kept_draws`), so that a Flex call at a shape seen
    before reads the plan rather than building it again; an operator, as :func:`random_blocks`."""
    def make():
        return (block_plan(block_size, count, within, seed, heads, n, rows, device),)

    key = ("bigbird_block_plan", block_size, count, within, seed, heads, n, rows, str(device))
    return kept_draws(key, make)[0]


@kept_block_plan.register_fake
def _(block_size, count, within, seed, heads, n, rows, device):
    return torch.empty((heads, rows, rows), dtype=torch.bool, device=device)


@_flex.pattern_family("bigbird")
def global_window_or_random(params, heads, query_length, key_length, device):
    """The pattern, params [block_size, random blocks, within, plan seed], as a predicate of (head, query,
    key) positions over :func:`block_plan` (kept, :func:`kept_block_plan`), which ``attended_keys``
    evaluates densely and the Flex path block-sparsely (its table covers every position of Flex's last
    partial block)."""
    size = params[0]
    rows = math.ceil(math.ceil(max(query_length, key_length) / _flex.BLOCK) * _flex.BLOCK / size)
    plan = kept_block_plan(*params, heads, query_length, rows, torch.device(device))

    def allowed(head, query, key):
        return plan[head, query // size, key // size]

    return allowed


@register("bigbird", BigBirdOptions)
class BigBirdAttention(Attention):
    subquadratic = True
    has_flex_path = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        seed = options.seed if options.seed is not None else int(torch.randint(0, _SEED_LIMIT, ()))
        self.register_buffer("plan_seed", torch.tensor(seed, dtype=torch.long))
        self.plan_seed_value = seed  # a Python int, so that a compiled graph reads a constant
        self.register_load_state_dict_post_hook(_refresh_plan_seed)

    @classmethod
    def label(cls, options: BigBirdOptions) -> str:
        return "BigBird"

    def random_plan(self, n: int, device=None) -> torch.Tensor:
        """R for inputs of length n: [heads, nb − 2, r] key-block indices, −1 for none."""
        size, blocks = self.options.block_size, math.ceil(n / self.options.block_size)
        highest = highest_random_block(blocks, size, self.options.random_blocks_within)
        return random_blocks(self.plan_seed_value, self.num_heads, blocks, self.options.num_random_blocks,
                             highest, torch.device(device or "cpu"))

    def attended_keys(self, q, k, mask: Optional[torch.Tensor]):
        """Dense [B, H, n, n] bool: the keys each query attends to (for analysis at small n)."""
        batch, heads, n, _ = q.shape
        mask = torch.ones(batch, n, dtype=torch.bool, device=q.device) if mask is None else mask.bool()
        position = torch.arange(n, device=q.device)
        head = torch.arange(heads, device=q.device)[:, None, None]
        seen = global_window_or_random(list(self.flex_pattern(n).params), heads, n, n, q.device)(head, position[:, None], position[None, :])
        return seen[None] & mask[:, None, None, :]

    def flex_pattern(self, n: int) -> _flex.Pattern:
        o = self.options
        params = (o.block_size, o.num_random_blocks, o.random_blocks_within, self.plan_seed_value)
        return _flex.Pattern("bigbird", params, self.num_heads, n, n)

    def _flex_forward(self, q, k, v, mask):
        tables = _flex.block_tables(self.flex_pattern(q.shape[2]), q.device)
        return _flex.attend(scaled(q), k, v, tables, mask)

    def _dropout(self, weights):
        if self.training and self.options.dropout:
            return F.dropout(weights, self.options.dropout)
        return weights

    def _attend(self, q, k, v, allowed):
        weights = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~allowed, NEG_INF), dim=-1)
        return self._dropout(weights) @ v

    @at_least_float32
    def forward(self, q, k, v, mask):
        if _flex.use_flex(self, q, k, v):
            return self._flex_forward(q, k, v, mask)
        batch, heads, n, _ = q.shape
        size = self.options.block_size
        blocks = math.ceil(n / size)
        q = scaled(q)
        if blocks <= 2:  # every block is global: full attention
            return self._attend(q, k, v, mask[:, None, None, :])

        q, k, v = (pad_to_multiple(x, size, dim=2) for x in (q, k, v))
        real = pad_to_multiple(mask, size, dim=1, value=False)
        qb, kb, vb = (x.view(batch, heads, blocks, size, x.shape[-1]) for x in (q, k, v))

        # The two global query blocks attend to every key.
        global_q = torch.cat([qb[:, :, 0], qb[:, :, -1]], dim=2)
        global_out = self._attend(global_q, k, v, real[:, None, None, :])

        # Middle block i: global blocks 0 and nb − 1, window i − 1 … i + 1, random R(i); a window
        # block that is a global one is marked invalid (counted once).
        middle = torch.arange(1, blocks - 1, device=q.device)
        fixed = torch.stack([torch.zeros_like(middle), torch.full_like(middle, blocks - 1),
                             middle - 1, middle, middle + 1], dim=-1)  # [nb − 2, 5]
        fixed_valid = torch.stack([middle >= 0, middle >= 0, middle - 1 >= 1, middle >= 0,
                                   middle + 1 <= blocks - 2], dim=-1)
        plan = self.random_plan(n, q.device)
        index = torch.cat([fixed.expand(heads, -1, -1), plan.clamp_min(0)], dim=-1)  # [H, nb − 2, 5 + r]
        valid = torch.cat([fixed_valid.expand(heads, -1, -1), plan >= 0], dim=-1)
        head = torch.arange(heads, device=q.device)[:, None, None]
        keys = kb[:, head, index].flatten(3, 4)  # [B, H, nb − 2, (5 + r) · b, d]
        values = vb[:, head, index].flatten(3, 4)
        allowed = (valid[None, :, :, :, None] & real.view(batch, blocks, size)[:, index]).flatten(3, 4)
        middle_out = self._attend(qb[:, :, 1:-1], keys, values, allowed[:, :, :, None, :])

        out = torch.cat([global_out[:, :, None, :size], middle_out, global_out[:, :, None, size:]], dim=2)
        return out.reshape(batch, heads, blocks * size, v.shape[-1])[:, :, :n]


def _refresh_plan_seed(module: BigBirdAttention, incompatible_keys) -> None:
    module.plan_seed_value = int(module.plan_seed)
