"""The fixed sparse patterns (Local, Sparse Transformer, BigBird, Longformer) as FlexAttention block-sparse
kernels: one pattern definition, a position predicate ``allowed(h, q, kv)`` in tensor operations, executed
two ways: densely by a backend's ``attended_keys`` and block-sparsely here.

What runs where is the backends' ``impl`` option (:data:`IMPLS`): ``eager`` is their own PyTorch path
(the CPU path and the reference), ``flex`` is FlexAttention (compiled with inductor on CUDA; on a CPU it
runs its unfused forward only, for tests), ``auto`` takes Flex on CUDA and eager elsewhere. A Flex path
that cannot serve a call (:func:`refusal`: a model reading rows without a real key, attention dropout in
training, a CPU backward, a head dimension or dtype its CUDA kernels are not used for, deterministic
algorithms, a torch without FlexAttention) is an error under ``flex`` and, under ``auto`` on CUDA, a
warning said once per backend and reason before the eager path runs.

Per call, the pattern's block tables (which key blocks each query block needs, and which of them are
entirely allowed) are copies of tensors kept by (pattern, options, lengths, heads, device)
(``attention_zoo._common.kept_draws``) — for BigBird the layer's seeded plan is part of the key — so
the n × n predicate is evaluated once per shape. The batch's key-padding mask is then folded in at
block level: a key block holding no real key is skipped, one holding only real keys stays "full" (no
per-element mask). A query that attends no real key gets 0 here where the eager paths average its
candidate keys (their masks are a finite −1e9); those rows are padded queries, which callers ignore
(``registry.Attention``), except a model that pools every position (``Attention.padded_rows_read``):
there the Flex path is refused (``auto``: the eager path, said once), unless the backend's Flex path is
exact on every row (``flex_exact_on_every_row``: strided Local).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from attention_zoo._common import forget_kept, kept_draws

IMPLS = ("auto", "eager", "flex")
BLOCK = 128  # FlexAttention's default block of queries and keys
_NONE = -(2**62)  # None among a pattern's parameters, as the operator's int list carries it
_PREDICATE_CELLS = 1 << 22  # positions evaluated at once when a pattern's block tables are built

Predicate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class FlexUnavailable(RuntimeError):
    """``impl=flex`` was asked for a call FlexAttention cannot serve; the message names the fix."""


@dataclass
class BlockTables:
    """A pattern's block structure at one shape: ``needed`` and ``full`` [heads, query blocks, key blocks]
    (bool), the predicate it was built from and the lengths."""

    needed: torch.Tensor
    full: torch.Tensor
    allowed: Predicate
    query_length: int
    key_length: int


@dataclass(frozen=True)
class Pattern:
    """A backend's pattern at one shape: its registered ``family`` with ``params``, per head or shared
    (``heads`` 1), over ``query_length`` queries and ``key_length`` keys."""

    family: str
    params: tuple
    heads: int
    query_length: int
    key_length: int
    folds_padding: bool = True  # a batch's key padding is folded into the block mask (else a score bias)


PatternBuilder = Callable[[list, int, int, int, torch.device], Predicate]
_FAMILIES: Dict[str, PatternBuilder] = {}
_ANNOUNCED: set = set()


def pattern_family(name: str):
    """Register ``builder(params, heads, query_length, key_length, device) → allowed(head, query, key)``, the
    pattern of family ``name`` from plain parameters (ints, bools and None), so that the cached tables can
    be made again from the key alone (inside an operator that a compiled graph calls)."""
    def register(builder: PatternBuilder) -> PatternBuilder:
        _FAMILIES[name] = builder
        return builder

    return register


@functools.lru_cache(maxsize=None)
def flex_missing() -> Optional[str]:
    """Why this torch has no FlexAttention, or None."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as error:  # torch < 2.5
        return f"this torch ({torch.__version__}) has no torch.nn.attention.flex_attention ({error})"
    return None


def refusal(backend, options, *, training: bool, device_type: str, dtype: torch.dtype, head_dim: int,
            deterministic: bool, backward: bool, padded_rows_read: bool = False) -> Optional[str]:
    """Why the Flex path of ``backend`` (an ``Attention`` class) with ``options`` cannot serve a call with
    these facts (one line naming the fix), or None: the rules :func:`use_flex` applies per call and
    ``lra.validation`` to a run's config. ``padded_rows_read``: the model reads the rows without a real
    key, which Flex computes differently unless the backend's Flex path is exact on every row."""
    name, dropout = backend.name, getattr(options, "dropout", 0.0)
    missing = flex_missing()
    if missing:
        return missing
    if padded_rows_read and not backend.flex_exact_on_every_row(options):
        return (f"the model pools every position, padded ones included (model.pooling=mean_unmasked), and "
                f"{name}'s Flex path gives a row without a real key 0 where the eager path averages; set "
                f"attention.impl=eager (or auto)")
    if training and dropout:
        return (f"FlexAttention has no attention dropout and {name} is training with dropout={dropout}; "
                f"set attention.dropout=0 or attention.impl=eager")
    if device_type != "cuda":
        if backward:
            return (f"FlexAttention has no backward on {device_type} in torch {torch.__version__}; "
                    f"attention.impl=flex is for CUDA (on a CPU it runs forward only): set attention.impl=auto or eager")
        return None
    if head_dim < 16 or head_dim & (head_dim - 1):
        return (f"FlexAttention's CUDA kernels are used here only for a head dimension that is a power of two "
                f"≥ 16, and this one is {head_dim}; set attention.impl=eager")
    if dtype == torch.float64:
        return "FlexAttention's CUDA kernels are not used for float64 here; set attention.impl=eager"
    if deterministic:
        return ("deterministic algorithms are on and FlexAttention's Inductor kernels are not verified "
                "deterministic here; set attention.impl=eager (or trainer.deterministic=false)")
    return None


def eager_reason(module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why the Flex path cannot run this call of ``module`` (:func:`refusal`), or None."""
    backward = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    return refusal(type(module), module.options, training=module.training, device_type=q.device.type,
                   dtype=q.dtype, head_dim=q.shape[-1], deterministic=torch.are_deterministic_algorithms_enabled(),
                   backward=backward, padded_rows_read=module.padded_rows_read)


def use_flex(module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``module`` (a backend with an ``impl`` option) computes this call with FlexAttention."""
    impl = module.options.impl
    if impl == "eager" or (impl == "auto" and q.device.type != "cuda"):
        return False
    reason = eager_reason(module, q, k, v)
    if reason is None:
        return True
    if impl == "flex":
        raise FlexUnavailable(f"attention.impl=flex cannot run {module.name} here: {reason}")
    if (module.name, reason) not in _ANNOUNCED:
        _ANNOUNCED.add((module.name, reason))
        warnings.warn(f"{module.name}: attention.impl=auto runs the eager path on CUDA because {reason}",
                      RuntimeWarning, stacklevel=3)
    return False


@torch.library.custom_op("attention_zoo::flex_block_tables", mutates_args=())
def _block_tables_op(family: str, params: List[int], heads: int, query_length: int, key_length: int,
                     device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(needed, full) of a registered pattern family at one shape, evaluated once per key and then copied
    (:func:`kept_draws`): an operator, so that a compiled graph calls it whole (what is kept is Python state)."""
    def evaluate():
        decoded = [None if value == _NONE else value for value in params]
        allowed = _FAMILIES[family](decoded, heads, query_length, key_length, device)
        return _evaluate(allowed, heads, query_length, key_length, device)

    key = ("flex_block_tables", family, tuple(params), heads, query_length, key_length, str(device))
    return kept_draws(key, evaluate)


@_block_tables_op.register_fake
def _(family, params, heads, query_length, key_length, device):
    shape = (heads, math.ceil(query_length / BLOCK), math.ceil(key_length / BLOCK))
    return torch.empty(shape, dtype=torch.bool, device=device), torch.empty(shape, dtype=torch.bool, device=device)


def block_tables(pattern: Pattern, device: torch.device) -> BlockTables:
    """The :class:`BlockTables` of ``pattern``: the tables from the cache (:func:`_block_tables_op`), the
    predicate built by the same registered builder."""
    p = pattern
    encoded = [_NONE if value is None else int(value) for value in p.params]
    needed, full = _block_tables_op(p.family, encoded, p.heads, p.query_length, p.key_length, device)
    allowed = _FAMILIES[p.family](list(p.params), p.heads, p.query_length, p.key_length, device)
    return BlockTables(needed, full, allowed, p.query_length, p.key_length)


def clear_cache() -> None:
    """Forget the kept block tables and what they were built from (BigBird's plan and draws): the next
    call builds its pattern from nothing, as ``lra.benchmarks.sparse_speed`` times it."""
    forget_kept()


def _bands(allowed: Predicate, heads: int, query_length: int, key_length: int, device: torch.device):
    """``allowed`` on every (head, query, key) position, a band of query blocks at a time: yields
    [heads, band blocks, BLOCK, key blocks, BLOCK] bool, False past either end."""
    query_blocks, key_blocks = math.ceil(query_length / BLOCK), math.ceil(key_length / BLOCK)
    keys = torch.arange(key_blocks * BLOCK, device=device)
    key_inside = keys < key_length
    head = torch.arange(heads, device=device)[:, None, None]
    band = max(1, _PREDICATE_CELLS // (heads * BLOCK * key_blocks * BLOCK))
    for start in range(0, query_blocks, band):
        stop = min(query_blocks, start + band)
        queries = torch.arange(start * BLOCK, stop * BLOCK, device=device)
        inside = (queries < query_length)[:, None] & key_inside[None, :]
        pairs = allowed(head, queries[None, :, None], keys[None, None, :]) & inside
        yield pairs.broadcast_to(heads, *inside.shape).reshape(heads, stop - start, BLOCK, key_blocks, BLOCK)


@torch.no_grad()
def _evaluate(allowed: Predicate, heads: int, query_length: int, key_length: int,
              device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """The block tables of ``allowed``: ``needed`` where any pair of a block is allowed, ``full`` where
    every pair is and no position lies past the end (a partial block keeps its per-element mask)."""
    needed, full = [], []
    for pairs in _bands(allowed, heads, query_length, key_length, device):
        needed.append(pairs.any(dim=4).any(dim=2))
        full.append(pairs.all(dim=4).all(dim=2))
    return torch.cat(needed, dim=1), torch.cat(full, dim=1)


@torch.no_grad()
def allowed_pairs(pattern: Pattern, device: torch.device) -> int:
    """How many (head, query, key) triples ``pattern`` attends (shared patterns: per head)."""
    p = pattern
    allowed = _FAMILIES[p.family](list(p.params), p.heads, p.query_length, p.key_length, device)
    return sum(int(pairs.sum()) for pairs in _bands(allowed, p.heads, p.query_length, p.key_length, device))


def _ordered(dense: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """[..., key blocks] bool → (count [...] int32, indices [..., key blocks] int32 with the needed
    blocks first, in increasing order): FlexAttention's kv_num_blocks / kv_indices."""
    count = dense.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count, indices


def block_mask(tables: BlockTables, key_real: Optional[torch.Tensor]):
    """The BlockMask of ``tables`` for one batch: with ``key_real`` [B, key_length] (bool) the key blocks
    without a real key are skipped and the mask also requires a real key; without it, one mask for all."""
    from torch.nn.attention.flex_attention import BlockMask

    allowed = tables.allowed
    needed, full = tables.needed[None], tables.full[None]
    if key_real is None:
        def mask_mod(b, h, q, kv):
            return allowed(h, q, kv)
    else:
        key_blocks = tables.needed.shape[-1]
        real = torch.zeros(key_real.shape[0], key_blocks * BLOCK, dtype=torch.bool, device=key_real.device)
        real[:, :tables.key_length] = key_real
        per_block = real.view(key_real.shape[0], key_blocks, BLOCK)
        needed = needed & per_block.any(dim=-1)[:, None, None, :]
        full = full & per_block.all(dim=-1)[:, None, None, :]

        def mask_mod(b, h, q, kv):
            return allowed(h, q, kv) & real[b, kv]
    count, indices = _ordered(needed & ~full)
    full_count, full_indices = _ordered(full)
    return BlockMask.from_kv_blocks(count, indices, full_count, full_indices, BLOCK_SIZE=BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(tables.query_length, tables.key_length))


RECOMPILE_LIMIT = 64  # compiled Flex graphs kept per process: patterns × lengths × (training, evaluation)


@functools.lru_cache(maxsize=None)
def _compiled_flex() -> Callable:
    """flex_attention compiled with Inductor (once per process; a new length first recompiles, then the
    lengths are dynamic)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _loud_recompile_limit():
    """Dynamo's limits for the compiled Flex call: more room than its default 8 graphs, and an error
    rather than its silent fall-back to the unfused (n × n) Flex when they are exhausted."""
    from torch._dynamo import config

    limits = {name: value for name, value in (("recompile_limit", RECOMPILE_LIMIT),
                                             ("fail_on_recompile_limit_hit", True)) if hasattr(config, name)}
    return config.patch(**limits)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: BlockTables,
           key_real: Optional[torch.Tensor], score_mod=None) -> torch.Tensor:
    """Softmax attention of q [B, H, n_q, d] (already scaled) over k, v [B, H, n_kv, d] restricted to the
    pattern of ``tables`` (and the real keys of ``key_real``), as FlexAttention computes it."""
    from torch.nn.attention.flex_attention import flex_attention

    mask = block_mask(tables, key_real)
    if torch.compiler.is_compiling():  # inside a compiled model: its graph compiles Flex
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=1.0)
    if q.device.type == "cuda":
        with _loud_recompile_limit():
            return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=mask, scale=1.0)
    with warnings.catch_warnings():  # the CPU's unfused forward, as asked
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=1.0)
