"""YOSO-m and YOSO-C (Zeng et al., ICML 2021): attention by LSH-based Bernoulli sampling.

Q and K are L2-normalized per token; m hashes of τ sign bits (fast Hadamard hashing, or a dense
Gaussian projection; a sign does not depend on a row's length, so the rows are hashed as they come
and normalized only inside the backward, fused into the kernels) put queries and keys in buckets,
and Y_i = (1/m) Σ_h Σ_{j: same bucket} v_j — an unbiased estimate of Σ_j (1 − arccos(q̂_i·k̂_j)/π)^τ v_j
(paper eq. 2) at O(n·m·d) — normalized per row (N-YOSO). Backward (``backward``):

- ``lower_bound`` (plain "YOSO", paper eq. 4): ∇̂_Q = [(∇_Y Vᵀ) ⊙ (τ/2) E] K, E the collision
  probabilities, sampled with the forward's buckets. By default each colliding pair carries its
  exact weight ∇_Y,i·v_j, as the paper's estimator and the authors' kernels (a cumulation with d_v
  weight channels, O(n·m·d_v·d)). ``backward_projections=p`` < d_v estimates the weight instead
  from p random orthogonal directions per hash, Σ_t (∇_Y,i·r_t)(v_j·r_t): unbiased, p/d_v of the
  cost, but a second source of gradient variance (docs/attention.md measures it). ∇_K symmetric,
  ∇_V = Eᵀ∇_Y by the cumulation with queries and keys swapped.
- ``exact`` ("*YOSO", paper eq. 3): each colliding pair weighted by f'(x)/f(x) (importance
  sampling of the true derivative), x = q̂·k̂ clamped to ±``exact_clamp``; cost grows with the
  number of collisions.
- ``exact_collided`` ("*YOSO" as the authors' released ``yoso_v2`` kernel computes it): every pair that
  collides in at least one hash, once, weighted by f'(0.99·q̂·k̂) itself, read from their lookup tables
  (``_yoso_ops.authors_pair_gradients``; dense, O(n²) like ``expectation``, on every ``impl``).
- ``expectation``: the dense gradient of YOSO-E (O(n²)), for studies.

``impl``: ``auto`` (the compiled kernels for the tensors' device, with a warning if they cannot be
built), ``cpu``/``cuda`` (the kernels or an error), ``torch`` (the vectorized PyTorch reference). The
CUDA kernels are bitwise repeatable under torch's deterministic algorithms (``trainer.deterministic``)
and use the authors' atomicAdd cumulation otherwise (attention_zoo._yoso_ops).
Precision: float32 inputs (float16 and bfloat16 widened) are computed in float32; float64 inputs in
float64 end to end, on the PyTorch path (the kernels are float32-only: ``auto`` takes the PyTorch path
for float64, ``cpu`` and ``cuda`` refuse it). The hash codes are computed from the rows rounded to
float32 whatever the dtype, so a float64 call collides the pairs its float32 twin does and differs
from it by rounding only; a float64 port of the estimator given the same codes checks it to float64
rounding (tests/test_float64.py). ``bf16_rows`` (lower-bound backward only): the rows the estimator reads
(v in the forward; unit q and k, v and ∇Y in the default backward; with ``backward_projections`` the rows of
its cumulations, τ/2·q̂, τ/2·k̂ and ∇Y, v entering through its float32 projected weights) are rounded to
bfloat16, sums and outputs stay in the computation dtype; the CUDA kernels read them in half the bytes, every
other engine widened (the same values): each output of the default backward then moves by at most ~3·2^-8 of
its sum of absolute terms (tests/test_yoso_bf16_rows.py).
Random draws come from the global (seeded) generator in training; in evaluation (``eval_hashes``)
from a per-module seed, the same hashes at every call (``fixed``), or, as the authors' code, from the
global generator afresh at every call (``fresh``: a test number then carries the hashes' noise). YOSO-C adds a depthwise convolution of the masked V along the sequence (one filter per
head, no bias) to the normalized output.

Input length N: the default τ = ⌈log2 N⌉ must fit the kernels' 20 bits (N ≤ 2^20; beyond, set
``hash_code_len``), and YOSO-C's ``conv_window`` is at most 2N − 1 (a wider one's outer taps never reach a
token); both are refused before anything is built (``check_shape``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from attention_zoo import _yoso_ops as ops
from attention_zoo._common import (depthwise_sequence_conv, gradients_through_unit_rows, hash_code_length,
                                   at_least_float32, kept_draws, register_rotation_seed)
from attention_zoo.options import InvalidOption, choice, number, odd_window, whole, window_within
from attention_zoo.registry import Attention, register
from attention_zoo.yoso_e import CLAMP

BACKWARDS = ("lower_bound", "exact", "exact_collided", "expectation")
STAR_BACKWARDS = ("exact", "exact_collided")  # the paper's "*": trained with eq. 3
# *YOSO's derivative ratio τ/((π − arccos x)·√(1 − x²)) at the clamp: 1.4e3·τ at 1 − 1e-6; nearer 1,
# float32's 1 − x² cancels to 0 or a few ulps and a pair's gradient to inf or noise.
MAX_EXACT_CLAMP = 1 - 1e-6
HASHINGS = ("hadamard", "gaussian")
EVAL_HASHES = ("fixed", "fresh")


@dataclass
class YosoOptions:
    num_hashes: int = 32  # m
    hash_code_len: Optional[int] = None  # τ; None: ceil(log2(max_seq_len))
    backward: str = "lower_bound"  # lower_bound | exact | exact_collided | expectation
    hashing: str = "hadamard"  # hadamard | gaussian
    impl: str = "auto"  # auto | cuda | cpu | torch
    backward_projections: Optional[int] = None  # lower_bound: None = exact per-pair weights (the paper); p: p random projections
    exact_clamp: float = 0.99  # *YOSO: |q̂·k̂| at which the derivative is evaluated at most
    workspace_mb: int = 256  # hash tables alive at once (CUDA kernels and the PyTorch path)
    eval_hashes: str = "fixed"  # fixed: seeded per module in evaluation | fresh: drawn at every call (the authors')
    bf16_rows: bool = False  # the rows the kernels read rounded to bfloat16 (v; unit q, k, v, ∇Y in the backward)

    def __post_init__(self):
        whole(self, 1, "num_hashes", "workspace_mb")
        whole(self, 1, "hash_code_len", optional=True, maximum=ops.MAX_CODE_LENGTH)
        whole(self, 1, "backward_projections", optional=True)
        choice(self, "backward", BACKWARDS)
        choice(self, "hashing", HASHINGS)
        choice(self, "impl", ops.IMPLS)
        choice(self, "eval_hashes", EVAL_HASHES)
        number(self, "exact_clamp", 0.0, MAX_EXACT_CLAMP, low_open=True)
        if self.bf16_rows and self.backward != "lower_bound":
            raise InvalidOption("bf16_rows", self.bf16_rows, f"false with backward={self.backward} (bfloat16 rows are "
                                "read by the cumulation and the lower-bound backward's kernels only; or set "
                                "backward=lower_bound)")


@dataclass
class YosoCOptions(YosoOptions):
    num_hashes: int = 16
    conv_window: int = 33  # odd; 0 disables the convolution

    def __post_init__(self):
        super().__post_init__()
        odd_window(self, "conv_window")


@dataclass(frozen=True)
class Setup:
    tau: int
    backward: str
    engine: str
    exact_clamp: float
    workspace_bytes: int
    normalize: bool = False  # q and k are raw rows: the estimator is taken on their unit rows
    bf16_rows: bool = False  # the estimator's rows rounded to bfloat16 (_yoso_ops.rows_read)
    unit_output: bool = False  # the output's unit rows (N-YOSO), made and differentiated inside the operator


@dataclass
class Draws:
    diagonals: Optional[torch.Tensor]  # [B, R, 3, P] ±1 (hadamard)
    projection: Optional[torch.Tensor]  # [B, d, m·τ] (gaussian)
    projections: torch.Tensor  # [B, m, p, dv], the lower-bound backward's projections; empty: exact weights


def value_projections(batch: int, num_hashes: int, value_dim: int, count: int,
                      generator: Optional[torch.Generator], device=None) -> torch.Tensor:
    """[B, m, p, dv] with E[Σ_t r_t r_tᵀ] = I: p rows, without replacement, of a randomly signed
    Hadamard basis of P = 2^⌈log2 dv⌉ (truncated to dv), scaled by 1/√p; so Σ_t (g·r_t)(v·r_t) is
    unbiased for g·v. For p ≥ dv the weights are exact: an empty tensor, nothing drawn or stored."""
    if count >= value_dim:
        return torch.empty(0, device=device)
    size = 1 << math.ceil(math.log2(value_dim))
    basis = ops.hadamard(torch.eye(size, device=device))
    signs = torch.randint(0, 2, (batch, num_hashes, 1, size), generator=generator, device=device) * 2 - 1
    rows = torch.rand(batch, num_hashes, size, generator=generator, device=device).argsort(-1)[..., :count]
    return (signs * basis[rows] / math.sqrt(count))[..., :value_dim]


def draw(batch: int, head_dim: int, value_dim: int, num_hashes: int, tau: int, hashing: str, projections: int,
         generator: Optional[torch.Generator], device) -> Draws:
    """Every random number one YOSO call uses: from ``generator`` (a CPU generator, copied to
    ``device`` once), or with None from the global generator of ``device`` itself (training: nothing
    is drawn on the host, nothing waits for a copy)."""
    where = "cpu" if generator is not None else device

    def signs(*shape):
        return (torch.randint(0, 2, shape, generator=generator, device=where) * 2 - 1).float().to(device)

    if hashing == "hadamard":
        diagonals = signs(batch, ops.num_products(num_hashes, head_dim, tau), 3, ops.padded_dim(head_dim))
        projection = None
    else:
        diagonals = None
        projection = torch.randn(batch, head_dim, num_hashes * tau, generator=generator, device=where).to(device)
    rows = value_projections(batch, num_hashes, value_dim, projections, generator, where)
    return Draws(diagonals, projection, rows.float().to(device))


def seeded_draws(seed: int, batch: int, head_dim: int, value_dim: int, num_hashes: int, tau: int, hashing: str,
                 projections: int, device) -> Draws:
    """:func:`draw` from a CPU generator seeded with ``seed`` (evaluation), made once per shape and
    device and kept there (see :func:`seeded_draws_op`)."""
    hash_draws, rows = seeded_draws_op(seed, batch, head_dim, value_dim, num_hashes, tau, hashing, projections,
                                       torch.device(device))
    return Draws(hash_draws, None, rows) if hashing == "hadamard" else Draws(None, hash_draws, rows)


@torch.library.custom_op("attention_zoo::yoso_seeded_draws", mutates_args=())
def seeded_draws_op(seed: int, batch: int, head_dim: int, value_dim: int, num_hashes: int, tau: int, hashing: str,
                    projections: int, device: torch.device) -> Tuple[Tensor, Tensor]:
    """(the hash draws: diagonals or Gaussian projection, the backward's projections), an operator
    because torch.compile cannot trace a Generator object; made once per (seed, shape, device) and
    kept there (:func:`attention_zoo._common.kept_draws`)."""
    def make():
        draws = draw(batch, head_dim, value_dim, num_hashes, tau, hashing, projections,
                     torch.Generator().manual_seed(seed), device)
        return draws.diagonals if hashing == "hadamard" else draws.projection, draws.projections

    key = ("yoso", seed, batch, head_dim, value_dim, num_hashes, tau, hashing, projections, str(device))
    return kept_draws(key, make)


@seeded_draws_op.register_fake
def _(seed, batch, head_dim, value_dim, num_hashes, tau, hashing, projections, device):
    if hashing == "hadamard":
        hash_draws = torch.empty(batch, ops.num_products(num_hashes, head_dim, tau), 3, ops.padded_dim(head_dim),
                                 device=device)
    else:
        hash_draws = torch.empty(batch, head_dim, num_hashes * tau, device=device)
    rows = torch.empty(batch, num_hashes, projections, value_dim, device=device) if projections < value_dim else \
        torch.empty(0, device=device)
    return hash_draws, rows


def hash_codes(x: torch.Tensor, draws: Draws, num_hashes: int, tau: int, engine: str) -> torch.Tensor:
    """int32 codes [B, m, n] of the rows of x [B, n, d], projected in float32 whatever the autocast
    state (a sign flipped by bf16 rounding would move a token to another bucket) and whatever x's dtype
    (float64 rows are rounded to float32 first: the codes of their float32 twins). Each bit is the sign
    of a linear projection, so a row and its unit row have the same code: rows are hashed as given."""
    with torch.autocast(x.device.type, enabled=False):
        if draws.diagonals is not None:
            return ops.fast_hash(x.float(), draws.diagonals, num_hashes, tau, engine)
        return ops.gaussian_hash(x.float(), draws.projection.float(), tau)


def yoso_cumulation(q, k, v, key_weight, codes_q, codes_k, projections, setup: Setup) -> torch.Tensor:
    """Y = (1/m) Σ_h B_h V on q, k [B, n, d], v [B, n, dv], key weights [B, n] (0 = padding),
    differentiable in q, k and v by ``setup.backward``: q, k are unit rows, or with ``setup.normalize``
    rows of any length whose unit rows the estimator is taken on (their gradients then go through
    x ↦ x/‖x‖, fused into the kernels of the default backward); with ``setup.unit_output`` Y's unit rows
    (N-YOSO's output, F.normalize's, eps included: one launch each way on the CUDA kernels)."""
    return sample_op(q, k, v, key_weight, codes_q, codes_k, projections, setup.tau, setup.backward, setup.engine,
                     setup.exact_clamp, setup.workspace_bytes, setup.normalize, setup.bf16_rows, setup.unit_output)[0]


@torch.library.custom_op("attention_zoo::yoso_sample", mutates_args=())
def sample_op(q: Tensor, k: Tensor, v: Tensor, key_weight: Tensor, codes_q: Tensor, codes_k: Tensor,
              projections: Tensor, tau: int, backward: str, engine: str, exact_clamp: float,
              workspace_bytes: int, normalize: bool, bf16_rows: bool, unit_output: bool) -> Tuple[Tensor, Tensor]:
    """The forward of :func:`yoso_cumulation` (one operator, so that torch.compile keeps it whole): Y, and with
    ``unit_output`` its unit rows and norms [B, n] instead (the norms not differentiable; else empty)."""
    ones = q.new_ones(q.shape[0], 1, 1, q.shape[1])
    y = ops.cumulation(codes_q, codes_k, ones, key_weight[:, None, None], v, tau, engine, workspace_bytes, bf16_rows)
    return ops.unit_rows(y, engine) if unit_output else (y, y.new_empty(0))


@sample_op.register_fake
def _(q, k, v, key_weight, codes_q, codes_k, projections, tau, backward, engine, exact_clamp, workspace_bytes,
      normalize, bf16_rows, unit_output):
    y = q.new_empty((q.shape[0], q.shape[1], v.shape[2]), dtype=ops.engine_dtype(engine, q, k, v))
    return y, y.new_empty(y.shape[:2] if unit_output else (0,))


def _save_for_backward(ctx, inputs, output):
    q, k, v, key_weight, codes_q, codes_k, projections, *setup = inputs
    ctx.setup = Setup(*setup)
    kept = output if ctx.setup.unit_output else ()  # the output's unit rows and norms
    ctx.save_for_backward(q, k, v, key_weight, codes_q, codes_k, projections, *kept)
    ctx.mark_non_differentiable(output[1])


def _sample_backward(ctx, grad, _):
    q, k, v, key_weight, codes_q, codes_k, projections, *unit_rows = ctx.saved_tensors
    s = ctx.setup
    if s.unit_output:  # back through the output's unit rows first
        grad = ops.through_output_unit_rows(grad, *unit_rows, s.engine)
    grad = grad.to(q.dtype).contiguous()
    if s.backward == "lower_bound" and projections.numel() == 0:  # the default: exact per-pair weights
        gradients = ops.exact_weight_backward(codes_q, codes_k, q, k, v, key_weight, grad, s.tau, s.engine,
                                              s.workspace_bytes, s.normalize, s.bf16_rows)
    elif s.normalize:  # the other backwards take unit rows: normalized around them
        gradients = gradients_through_unit_rows(q, k, lambda unit_q, unit_k: _unit_row_gradients(
            unit_q, unit_k, v, key_weight, grad, codes_q, codes_k, projections, s))
    else:
        gradients = _unit_row_gradients(q, k, v, key_weight, grad, codes_q, codes_k, projections, s)
    return (*gradients, *[None] * 12)  # nothing for key_weight, the codes, the projections and the setup


def _unit_row_gradients(q, k, v, key_weight, grad, codes_q, codes_k, projections, s: Setup):
    """(∇Q, ∇K, ∇V) of the expectation, projected lower-bound or either exact ("*YOSO") backward, on unit q, k."""
    if s.backward == "expectation":
        return expectation_gradients(q, k, v, key_weight, grad, s.tau)
    ones = q.new_ones(q.shape[0], 1, 1, q.shape[1])
    grad_v = ops.cumulation(codes_k, codes_q, key_weight[:, None, None], ones, grad, s.tau, s.engine,
                            s.workspace_bytes, s.bf16_rows)
    if s.backward == "lower_bound":
        grad_q, grad_k = projected_gradients(q, k, v, key_weight, grad, codes_q, codes_k, projections, s)
    elif s.backward == "exact_collided":
        grad_q, grad_k = ops.authors_pair_gradients(codes_q, codes_k, q, k, v, key_weight, grad, s.tau,
                                                    s.workspace_bytes)
    else:
        grad_q = ops.pair_gradient(codes_q, codes_k, q, k, grad, v, key_weight, s.tau, s.exact_clamp, s.engine)
        every_query = q.new_ones(q.shape[0], q.shape[1])
        grad_k = ops.pair_gradient(codes_k, codes_q, k, q, v, grad, every_query, s.tau, s.exact_clamp,
                                   s.engine) * key_weight[..., None]
    return grad_q, grad_k, grad_v


sample_op.register_autograd(_sample_backward, setup_context=_save_for_backward)


# The per-token weights [batch elements, hashes, p, n] of one cumulation call are kept within a budget:
# on CPU the last-level cache (weights spilling to DRAM made the backward superlinear in n), on CUDA a
# quarter of the workspace. Calls split the batch first (each output written once), hashes only when
# one batch element's weights exceed the budget.
CPU_WEIGHT_BYTES = 16 * 2**20


def projected_gradients(q, k, v, key_weight, grad, codes_q, codes_k, projections, s: Setup):
    """∇Q, ∇K of eq. 4 with each pair's weight ∇Y_i·v_j estimated from p random projections, the
    cumulation's weight channels (``backward_projections``)."""
    batch, m, count, n = q.shape[0], codes_q.shape[1], projections.shape[2], q.shape[1]
    cpu = q.device.type == "cpu"
    budget = CPU_WEIGHT_BYTES if cpu else s.workspace_bytes // 4
    per_hash = 2 * q.element_size() * count * n  # bytes of both weight tensors for one (batch element, hash)
    chunk = max(torch.get_num_threads() if cpu else 1, budget // (per_hash * m))  # every core gets work
    group = max(1, min(m, budget // (per_hash * chunk)))
    grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)
    half_tau_q, half_tau_k = q * (s.tau / 2), k * (s.tau / 2)
    weighted_v = v * key_weight[..., None]
    for first in range(0, batch, chunk):
        elements = slice(first, first + chunk)
        for start in range(0, m, group):
            hashes = slice(start, min(start + group, m))
            rows = projections[elements, hashes]
            share = rows.shape[1] / m  # a cumulation averages over its own hashes; both take grad_r's share
            grad_r = torch.einsum("bnl,bhtl->bhtn", grad[elements], rows * share).contiguous()
            value_r = torch.einsum("bnl,bhtl->bhtn", weighted_v[elements], rows).contiguous()
            cq, ck = codes_q[elements, hashes], codes_k[elements, hashes]
            grad_q[elements] += ops.cumulation(cq, ck, grad_r, value_r, half_tau_k[elements], s.tau, s.engine,
                                               s.workspace_bytes, s.bf16_rows)
            grad_k[elements] += ops.cumulation(ck, cq, value_r, grad_r, half_tau_q[elements], s.tau, s.engine,
                                               s.workspace_bytes, s.bf16_rows)
    return grad_q, grad_k


def expectation_gradients(q, k, v, key_weight, grad, tau):
    """∇ of Y = (E ⊙ w) V, E = (1 − arccos(c)/π)^τ with c = q̂·k̂ clamped as YOSO-E does, densely
    (the YOSO-E gradient): ∇V = (E ⊙ w)ᵀ∇Y; with D = (∇Y Vᵀ) ⊙ w ⊙ ∂E/∂c (zero where the clamp
    holds), ∂E/∂c = τ (1 − arccos(c)/π)^(τ−1) / (π √(1 − c²)), ∇Q = D K and ∇K = Dᵀ Q."""
    cosine = q @ k.transpose(-1, -2)
    inside = (cosine >= -1 + CLAMP) & (cosine <= 1 - CLAMP)  # where torch.clamp passes the gradient
    cosine = cosine.clamp(-1 + CLAMP, 1 - CLAMP)
    base = 1 - torch.arccos(cosine) / math.pi
    weights = base**tau * key_weight[:, None, :]
    slope = tau * base ** (tau - 1) / (math.pi * torch.sqrt(1 - cosine * cosine))
    d_cosine = (grad @ v.transpose(-1, -2)) * key_weight[:, None, :] * slope * inside
    return d_cosine @ k, d_cosine.transpose(-1, -2) @ q, weights.transpose(-1, -2) @ grad


@register("yoso", YosoOptions)
class YosoAttention(Attention):
    subquadratic = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        YosoAttention.check_shape(options, num_heads, head_dim, max_seq_len)  # τ: the kernels take no longer codes
        register_rotation_seed(self)

    @property
    def tau(self) -> int:
        return hash_code_length(self.options.hash_code_len, self.max_seq_len)

    pinned_engine: Optional[str] = None  # Attention.pin_engine's

    def engine(self, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
        """'kernel' (the compiled kernels) or 'torch' (the PyTorch path): the engine pinned, else what ``impl``
        means for tensors of ``dtype`` on ``device``."""
        return self.pinned_engine or ops.resolve_engine(self.options.impl, device, dtype)

    def pin_engine(self, engine: str) -> None:
        if engine not in ("kernel", "torch"):
            raise ValueError(f"YOSO has no engine {engine!r}: 'kernel' or 'torch'")
        self.pinned_engine = engine

    @classmethod
    def check_shape(cls, options: YosoOptions, num_heads, head_dim, max_seq_len) -> None:
        """The default τ = ⌈log2 N⌉ exceeds the kernels' codes of at most 20 bits above N = 2^20 positions
        (a τ set explicitly is checked by the options)."""
        tau = hash_code_length(options.hash_code_len, max_seq_len)
        if tau > ops.MAX_CODE_LENGTH:
            raise InvalidOption("hash_code_len", options.hash_code_len,
                                f"a whole number between 1 and {ops.MAX_CODE_LENGTH} for the input length N = "
                                f"{max_seq_len} (null means ⌈log2 N⌉ = {tau}, longer codes than the kernels take)")

    @classmethod
    def label(cls, options: YosoOptions) -> str:
        star = "*" if options.backward in STAR_BACKWARDS else ""
        return f"{star}YOSO-{options.num_hashes}"

    def sample(self, q, k, v, mask, unit_output: bool = False):
        """YOSO-m output [B·H, n, dv] of q, k, v [B, H, n, ·]: unnormalized, or its unit rows (N-YOSO)."""
        batch, heads, n, d = q.shape
        flat = batch * heads
        q, k = q.reshape(flat, n, d), k.reshape(flat, n, d)  # unit rows only inside the op (Setup.normalize)
        key_weight = mask.to(q.dtype).repeat_interleave(heads, dim=0)
        o = self.options
        engine = self.engine(q.device, q.dtype)
        projections = v.shape[-1] if o.backward_projections is None else o.backward_projections
        if self.training or o.eval_hashes == "fresh":
            draws = draw(flat, d, v.shape[-1], o.num_hashes, self.tau, o.hashing, projections, None, q.device)
        else:
            draws = seeded_draws(self.rotation_seed_value, flat, d, v.shape[-1], o.num_hashes, self.tau, o.hashing,
                                 projections, q.device)
        with torch.no_grad():
            codes_q = hash_codes(q.detach(), draws, o.num_hashes, self.tau, engine)
            codes_k = hash_codes(k.detach(), draws, o.num_hashes, self.tau, engine)
        setup = Setup(self.tau, o.backward, engine, o.exact_clamp, o.workspace_mb * 2**20, normalize=True,
                      bf16_rows=o.bf16_rows, unit_output=unit_output)
        return yoso_cumulation(q, k, v.reshape(flat, n, -1), key_weight, codes_q, codes_k, draws.projections.to(q.dtype),
                               setup)

    @at_least_float32
    def forward(self, q, k, v, mask):
        return self.sample(q, k, v, mask, unit_output=True).reshape(v.shape)


@register("yoso_c", YosoCOptions)
class YosoCAttention(YosoAttention):
    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        self.conv = depthwise_sequence_conv(num_heads, options.conv_window)

    @classmethod
    def check_shape(cls, options: YosoCOptions, num_heads, head_dim, max_seq_len) -> None:
        super().check_shape(options, num_heads, head_dim, max_seq_len)
        window_within(options, "conv_window", max_seq_len)

    @classmethod
    def label(cls, options: YosoCOptions) -> str:
        star = "*" if options.backward in STAR_BACKWARDS else ""
        return f"{star}YOSO-C-{options.num_hashes}"

    @at_least_float32
    def forward(self, q, k, v, mask):
        y = self.sample(q, k, v, mask, unit_output=True).reshape(v.shape)
        return y if self.conv is None else y + self.conv(v * mask[:, None, :, None].to(v.dtype))
