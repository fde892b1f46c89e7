"""The reference LRA encoder and classifier (docs/reference-setup.md), with any attention_zoo backend."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

import attention_zoo
from lra.config import Initialization, PaddingMask, Pooling, PositionEmbedding


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    """[length, dim]: sin(p·ω_i) in the even columns, cos(p·ω_i) in the odd ones, ω_i = 10000^(−2i/dim)
    (Vaswani et al. 2017, as the LRA models' fixed position embedding)."""
    position = torch.arange(length, dtype=torch.float64)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: dim // 2])
    return table.float()


def token_embedding_std(cfg) -> float:
    """σ of the token table's N(0, σ²) start: ``model.token_embedding_init_std``, else the position
    table's ``embedding_init_std`` (the YOSO reference starts both at 0.02, the LRA code tokens at 1)."""
    return cfg.embedding_init_std if cfg.token_embedding_init_std is None else cfg.token_embedding_init_std


def input_length(task_max_length: int, cap: Optional[int]) -> int:
    """Tokens per document the model reads: the task's padded length, or ``trainer.max_length`` when
    that is smaller (longer documents are truncated)."""
    return task_max_length if cap is None else min(task_max_length, cap)


def attention_length(pooling: Pooling, tokens: int) -> int:
    """Positions the attention sees for ``tokens`` input tokens: one more with a CLS token."""
    return tokens + int(pooling is Pooling.cls)


def projection_bias(attention: attention_zoo.AttentionSpec) -> bool:
    """Whether the Q, K and V projections carry a bias: yes, unless the backend has a
    ``projection_bias`` option that says no (Reformer as Hugging Face's ``LSHSelfAttention``)."""
    return bool(getattr(attention.options, "projection_bias", True))


# The LRA code's Flax initialisers (google-research/long-range-arena, models/*/<model>.py and
# layers/common_layers.py): its blocks' Dense layers (attention projections, MLP) take
# xavier_uniform kernels and N(0, 1e-6) biases; the classifier head's take Flax's default,
# lecun_normal (a normal truncated at ±2σ, rescaled to variance 1 / fan_in), and zero biases.
FLAX_BLOCK_BIAS_STD = 1e-6
TRUNCATED_NORMAL_STD = 0.87962566103423978  # the std of N(0, 1) truncated to [−2, 2]


def xavier_initialized(layers) -> None:
    """xavier_uniform kernels, N(0, 1e-6) biases: the LRA code's blocks."""
    for layer in layers:
        nn.init.xavier_uniform_(layer.weight)
        if layer.bias is not None:
            nn.init.normal_(layer.bias, std=FLAX_BLOCK_BIAS_STD)


def lecun_normal_initialized(layers) -> None:
    """lecun_normal kernels (truncated normal of variance 1 / fan_in), zero biases: Flax's Dense default."""
    for layer in layers:
        std = math.sqrt(1.0 / layer.weight.shape[1]) / TRUNCATED_NORMAL_STD
        nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


def linear_layers(module: nn.Module) -> list:
    return [layer for layer in module.modules() if isinstance(layer, nn.Linear)]


class MultiHeadAttention(nn.Module):
    """Separate Q, K, V projections to heads × head_dim, a backend, an output projection; all four with a
    bias when ``bias``, the Q, K, V ones not where :func:`projection_bias` says so."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, max_seq_len: int,
                 attention: attention_zoo.AttentionSpec, attention_fp32: bool, causal: bool = False,
                 bias: bool = True):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        inner = num_heads * head_dim
        qkv_bias = bias and projection_bias(attention)
        self.query, self.key, self.value = (nn.Linear(dim, inner, bias=qkv_bias) for _ in range(3))
        self.backend = attention.build(num_heads, head_dim, max_seq_len, causal)
        self.output = nn.Linear(inner, dim, bias=bias)
        self.attention_fp32 = attention_fp32

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, n, _ = x.shape
        return x.view(batch, n, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        if self.attention_fp32 and torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                out = self.backend(q.float(), k.float(), v.float(), mask)
        else:
            out = self.backend(q, k, v, mask)
        batch, _, n, _ = out.shape
        return self.output(out.transpose(1, 2).reshape(batch, n, -1).to(x.dtype))


class Block(nn.Module):
    """Pre-LN: x + dropout(attn(LN(x))), then x + MLP(LN(x)). ``model.initialization=lra``: the model's
    own linear layers (not the backend's) as the LRA code's blocks (:func:`xavier_initialized`)."""

    def __init__(self, cfg, max_seq_len: int, attention: attention_zoo.AttentionSpec, causal: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.layer_norm_eps)
        self.attention = MultiHeadAttention(cfg.dim, cfg.num_heads, cfg.head_dim, max_seq_len, attention,
                                            cfg.attention_fp32, causal, bias=cfg.attention_bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.layer_norm_eps)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, cfg.ff_dim), nn.GELU(), nn.Dropout(cfg.dropout),
            nn.Linear(cfg.ff_dim, cfg.dim), nn.Dropout(cfg.dropout),
        )
        if cfg.initialization is Initialization.lra:
            a = self.attention
            xavier_initialized([a.query, a.key, a.value, a.output, *linear_layers(self.mlp)])

    def forward(self, x, mask):
        x = x + self.dropout(self.attention(self.norm1(x), mask))
        return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    """Token + position embeddings, pre-LN blocks, final LayerNorm, pooling to one vector.

    ``causal`` (self-pretraining's next-token stage): every backend attends to earlier positions only.
    Its parameters are the same either way, so a causal encoder's weights load into a bidirectional one."""

    def __init__(self, cfg, vocab_size: int, max_length: int, attention: attention_zoo.AttentionSpec,
                 causal: bool = False):
        super().__init__()
        self.pooling = cfg.pooling
        self.mask_zero_ids = cfg.padding_mask is PaddingMask.nonzero_ids
        self.use_cls = self.pooling is Pooling.cls
        positions = attention_length(self.pooling, max_length)
        self.token_embedding = nn.Embedding(vocab_size, cfg.dim)
        self.position_embedding = nn.Embedding(positions, cfg.dim)
        nn.init.normal_(self.token_embedding.weight, std=token_embedding_std(cfg))
        nn.init.normal_(self.position_embedding.weight, std=cfg.embedding_init_std)
        if cfg.position_embedding is PositionEmbedding.sinusoidal:
            self.position_embedding.weight.data.copy_(sinusoidal_positions(positions, cfg.dim))
            self.position_embedding.weight.requires_grad_(False)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if self.use_cls else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg, positions, attention, causal) for _ in range(cfg.num_layers)
        )
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.layer_norm_eps)
        for block in self.blocks[1:]:
            block.attention.backend.share_parameters_with(self.blocks[0].attention.backend)
        for block in self.blocks:
            block.attention.backend.padded_rows_read = self.pooling is Pooling.mean_unmasked

    def real_tokens(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[batch, n] bool: the tokens the model treats as real (the reference's `ids != 0` quirk makes
        black pixels of Image and Pathfinder padding)."""
        return mask & (ids != 0) if self.mask_zero_ids else mask

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor, masked: Optional[torch.Tensor] = None,
                      mask_vector: Optional[torch.Tensor] = None):
        """([batch, positions, dim] after the final LayerNorm, [batch, positions] real-token mask); with a
        CLS token it is position 0. ``masked`` [batch, n] positions get ``mask_vector`` in place of their
        token embedding (masked-token pretraining)."""
        mask = self.real_tokens(ids, mask)
        x = self.token_embedding(ids)
        if masked is not None:
            x = torch.where(masked[..., None], mask_vector.to(x.dtype), x)
        if self.use_cls:
            x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)
            mask = torch.cat([mask.new_ones(len(x), 1), mask], dim=1)
        x = x + self.position_embedding.weight[: x.shape[1]]
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x), mask

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One vector per sequence (docs/reference-setup.md, "Pooling"): the CLS position; or the mean
        of the real positions (``mean``); or a mean over all n padded positions, of every position's
        own state (``mean_unmasked``, the LRA code's classifier head) or of the states with padded
        ones zeroed, Σ_real x / n (``mean_zeroed_padding``, the YOSO/Nyströmformer code's
        ``mean(norm(X) · mask)``)."""
        x, mask = self.hidden_states(ids, mask)
        if self.use_cls:
            return x[:, 0]
        if self.pooling is Pooling.mean_unmasked:
            return x.mean(dim=1)
        weights = mask.to(x.dtype).unsqueeze(-1)
        if self.pooling is Pooling.mean_zeroed_padding:
            return (x * weights).mean(dim=1)
        return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class Classifier(nn.Module):
    """Encoder + Linear(dim→hidden) · ReLU · Linear(hidden→classes).

    With ``dual_encoder`` (retrieval) both documents go through the one encoder and the head sees
    ``[X1, X2, X1*X2, X1-X2]``.
    """

    def __init__(self, model_cfg, task_cfg, attention: attention_zoo.AttentionSpec, max_length: int):
        super().__init__()
        self.encoder = Encoder(model_cfg, task_cfg.vocab_size, max_length, attention)
        self.dual_encoder = bool(task_cfg.dual_encoder)
        self.dual_aux_loss: Optional[torch.Tensor] = None
        width = model_cfg.dim * (4 if self.dual_encoder else 1)
        self.head = nn.Sequential(
            nn.Linear(width, model_cfg.classifier_dim), nn.ReLU(),
            nn.Linear(model_cfg.classifier_dim, task_cfg.num_classes),
        )
        if model_cfg.initialization is Initialization.lra:
            lecun_normal_initialized(linear_layers(self.head))

    def forward(self, ids: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.dual_encoder:
            x1 = self.encoder(ids[0], masks[0])
            first = attention_aux_loss(self.encoder)  # the second pass replaces each backend's aux_loss
            x2 = self.encoder(ids[1], masks[1])
            second = attention_aux_loss(self.encoder)
            self.dual_aux_loss = None if first is None else (first + second) / 2
            features = torch.cat([x1, x2, x1 * x2, x1 - x2], dim=-1)
        else:
            features = self.encoder(ids[0], masks[0])
        return self.head(features)

    def aux_loss(self) -> Optional[torch.Tensor]:
        """The backends' auxiliary losses of the last forward; with the dual encoder, the mean over its two
        documents (each document's batch weighs as a single-document task's batch does)."""
        return self.dual_aux_loss if self.dual_encoder else attention_aux_loss(self.encoder)


def attention_aux_loss(encoder: Encoder) -> Optional[torch.Tensor]:
    """The sum of the attention backends' auxiliary losses, or None if none set one. Read for the training
    loss: one outside the autograd graph (detached, or computed under torch.no_grad) would train nothing,
    so it is refused (:class:`attention_zoo.BackendError`)."""
    backends = [b.attention.backend for b in encoder.blocks if b.attention.backend.aux_loss is not None]
    for backend in backends:
        if torch.is_grad_enabled() and not backend.aux_loss.requires_grad:
            raise attention_zoo.BackendError(
                f"{type(backend).__module__}.{type(backend).__qualname__} set aux_loss outside the autograd graph "
                "(detached, or computed under torch.no_grad), so adding it to the loss trains nothing: compute it "
                "from the module's parameters or q, k with gradients on, or leave it None")
    return torch.stack([backend.aux_loss for backend in backends]).sum() if backends else None


class LanguageModel(nn.Module):
    """Self-pretraining's stage 1 (Amos, Berant & Gupta, ICLR 2024): the encoder with a token-prediction
    head, Linear(dim → vocabulary) on every position's hidden state, and a learned vector that stands in
    for a masked token's embedding (so the vocabulary, and the encoder's weights, stay those of the
    classifier). ``causal``: next-token prediction through causal attention."""

    def __init__(self, model_cfg, task_cfg, attention: attention_zoo.AttentionSpec, max_length: int, causal: bool):
        super().__init__()
        self.encoder = Encoder(model_cfg, task_cfg.vocab_size, max_length, attention, causal)
        # masked inputs only: every parameter must take part in the loss (DDP)
        self.mask_vector = None if causal else nn.Parameter(
            torch.empty(model_cfg.dim).normal_(std=token_embedding_std(model_cfg)))
        self.head = nn.Linear(model_cfg.dim, task_cfg.vocab_size)
        if model_cfg.initialization is Initialization.lra:
            lecun_normal_initialized([self.head])

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, masked: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[batch, n, vocabulary] logits, one per input position (a CLS position is left out)."""
        x, _ = self.encoder.hidden_states(ids, mask, masked, self.mask_vector)
        return self.head(x[:, 1:] if self.encoder.use_cls else x)

    def aux_loss(self) -> Optional[torch.Tensor]:
        return attention_aux_loss(self.encoder)
