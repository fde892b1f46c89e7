"""The three operations of YOSO attention — hashing, LSH cumulation, exact-derivative pair
gradients — as compiled kernels (``csrc/yoso``) and as a vectorized pure-PyTorch reference of the
same algorithm, behind one dispatch on ``engine``: ``kernel`` (compiled) or ``torch``, what
:func:`resolve_engine` makes of the user's ``impl`` option (``auto``, ``cpu``, ``cuda`` or ``torch``).

Shapes: B = batch·heads, m hashes, τ bits, n tokens, d head dim, dv value dim. The kernels compute in
float32; the PyTorch path in its inputs' dtype, float64 included (:func:`engine_dtype`); hashing is
float32 on both.

On CUDA the cumulation and the default backward take one of two paths at each call, by torch's own
switch (``torch.are_deterministic_algorithms_enabled()``, which ``trainer.deterministic`` sets): with
deterministic algorithms, sorted codes and one writer per output (bitwise repeatable); without, the
YOSO authors' atomicAdd cumulation (faster, float sums in arrival order, as ``index_add_`` on CUDA).

Errors, as PyTorch's device-side asserts: a hash code outside [0, 2^τ) (the hash kernel makes none;
codes given with another τ could) is checked on the device; the CPU kernels raise a RuntimeError at
once, the CUDA kernels stop with a trap, a sticky error: the op's caller sees it at the next
synchronization ("device-side assert"-like, "unspecified launch failure"), and every later CUDA call of
the process fails, so the process must restart. Shapes and sizes are checked on the host first (one
error line, nothing launched). A launch that fails (a configuration the device refuses) raises at once
naming its kernel, and its error is cleared, so no later, unrelated op is blamed for it; an error
another operation left pending is raised before the first launch, named as not YOSO's.

- Hashing (Andoni et al. 2015): x ↦ H D3 H D2 H D1 x, H the unnormalized Walsh–Hadamard matrix on
  P = next power of two ≥ d coordinates, Di random ±1 diagonals. A code's τ bits come from τ
  independent products (product g·τ + t gives bit t of hashes g·P … g·P + P − 1), so τ·⌈m/P⌉
  products. Cutting one product into ⌊P/τ⌋ codes, as the reference does, takes a code's bits from
  orthogonal directions of one rotation, which are not independent: the collision rate then misses
  (1 − θ/π)^τ (0.121 against 0.131 at θ = 1.25, τ = 4, d = 32, 40,000 draws). The dense Gaussian
  projection is an option.
- Cumulation: (1/m) Σ_h Σ_t w^q_{h,t,i} T_h[c_h(q_i), t] with T_h[c, t] = Σ_{j: c_h(k_j)=c} w^k_{h,t,j} v_j
  (YOSO paper, Algorithm 1, with p weight channels t; weights [B, 1 or m, p, n]). Only the codes the
  keys have get a row (at most n per (batch, hash), whatever τ), and never all pairs' rows at once.
- Exact-weight gradients (the default backward, eq. 4 with each colliding pair's own weight):
  ∇Q_i = (τ/2m) Σ_h Σ_{j colliding} w_j (∇Y_i·v_j) k_j and ∇K_j symmetrically, by enumerating the
  colliding pairs (the kernels switch a heavy bucket to its d_v × d tables). With ``normalize`` the
  rows may have any length: the estimator is taken on their unit rows and the gradients are those of
  the rows given (the kernels normalize themselves: yoso_cuda_rows.cu, the CPU's as it packs its rows).
- Pair gradient ("*YOSO", paper eq. 3): (1/m) Σ_h Σ_{o colliding with s} mask_o (s_s·w_o) ρ(a_s·o_o) o_o
  with ρ(x) = f'(x)/f(x) = τ / ((π − arccos x) √(1 − x²)), f(x) = (1 − arccos(x)/π)^τ, x clamped.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from attention_zoo import _yoso_build
from attention_zoo._common import (UNIT_ROWS_EPS, computation_dtype, gradients_through_unit_rows, through_unit_rows,
                                   unit_rows_with_norms)
from attention_zoo._yoso_build import KernelUnavailable

IMPLS = ("auto", "cuda", "cpu", "torch")
MAX_CODE_LENGTH = 20
DEFAULT_WORKSPACE_BYTES = 256 * 2**20  # hash tables alive at once (CUDA kernels, PyTorch reference)
_warned = set()


class KernelFallbackWarning(UserWarning):
    """impl=auto could not use the compiled kernels and runs the pure-PyTorch implementation."""


def resolve_engine(impl: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The engine, 'kernel' or 'torch', that the user's ``impl`` (auto, cpu, cuda or torch) means for
    tensors of ``dtype`` on ``device``; loud about any fallback. The kernels compute in float32 only:
    float64 tensors take the PyTorch path, which computes in float64 (``auto`` chooses it; ``cpu`` and
    ``cuda`` are refused)."""
    if dtype == torch.float64 and impl != "torch":
        if impl != "auto":
            raise ValueError(f"attention.impl={impl}: the compiled YOSO kernels compute in float32 and the inputs "
                             "are float64; use impl=torch or impl=auto (the PyTorch path computes in float64)")
        return "torch"
    return _resolve_engine(impl, device.type)


def _assume_constant_result(fn):
    """``torch.compiler.assume_constant_result`` without its import of torch._dynamo (1.9 s of every
    command's 4.7 s start-up on 2 cores): that decorator only sets this attribute (torch/_dynamo/
    decorators.py); tests/test_compile.py checks it still does, and compiles YOSO as one graph."""
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result  # torch.compile calls it once while tracing and keeps the answer
def _resolve_engine(impl: str, kind: str) -> str:
    if impl == "torch":
        return "torch"
    if impl in ("cpu", "cuda"):
        if kind != impl:
            raise ValueError(f"attention.impl={impl} but the tensors are on {kind}; use impl=auto or impl={kind}")
        _yoso_build.load(kind)
        return "kernel"
    if kind not in ("cpu", "cuda"):
        reason = f"there are no compiled YOSO kernels for {kind} tensors"
    else:
        try:
            _yoso_build.load(kind)
            return "kernel"
        except KernelUnavailable as error:
            reason = str(error)
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(
            f"YOSO falls back to the pure-PyTorch implementation (slower): {reason}. "
            "Set attention.impl=torch to choose it explicitly.",
            KernelFallbackWarning,
            stacklevel=4,
        )
    return "torch"


# ----------------------------------------------------------------------------------- hashing


def padded_dim(head_dim: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(head_dim, 1))))


def num_products(num_hashes: int, head_dim: int, tau: int) -> int:
    return tau * math.ceil(num_hashes / padded_dim(head_dim))


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh–Hadamard transform of the last dimension (a power of two), pairing
    positions p and p + h in blocks of 2h for h = 1, 2, 4, … exactly as the kernels do."""
    size, shape, half = x.shape[-1], x.shape, 1
    while half < size:
        x = x.reshape(-1, size // (2 * half), 2, half)
        x = torch.stack((x[:, :, 0] + x[:, :, 1], x[:, :, 0] - x[:, :, 1]), dim=2)
        half *= 2
    return x.reshape(shape)


def codes_from_signs(projected: torch.Tensor, tau: int) -> torch.Tensor:
    """[..., c·τ] projections → [..., c] int32 codes, bit t = (coordinate t of the code > 0)."""
    bits = (projected > 0).reshape(*projected.shape[:-1], projected.shape[-1] // tau, tau).to(torch.int32)
    return (bits << torch.arange(tau, device=bits.device, dtype=torch.int32)).sum(-1, dtype=torch.int32)


def fast_hash_torch(x: torch.Tensor, diagonals: torch.Tensor, num_hashes: int, tau: int) -> torch.Tensor:
    batch, n, d = x.shape
    products, size = diagonals.shape[1], diagonals.shape[3]
    codes = torch.empty(batch, num_hashes, n, dtype=torch.int32, device=x.device)
    if codes.numel() == 0:
        return codes
    step = max(1, 2**26 // max(1, products * n * size))  # bound the [b, R, n, P] intermediate
    for start in range(0, batch, step):
        diag = diagonals[start : start + step, :, :, None, :]  # [b, R, 3, 1, P]
        y = torch.nn.functional.pad(x[start : start + step], (0, size - d))[:, None] * diag[:, :, 0]
        y = hadamard(hadamard(hadamard(y) * diag[:, :, 1]) * diag[:, :, 2])  # [b, R = G·τ, n, P]
        y = y.reshape(y.shape[0], products // tau, tau, n, size).permute(0, 1, 4, 3, 2)  # [b, G, P, n, τ]
        chunk = codes_from_signs(y, tau).reshape(y.shape[0], -1, n)  # hash g·P + c
        codes[start : start + step] = chunk[:, :num_hashes]
    return codes


def gaussian_hash(x: torch.Tensor, projection: torch.Tensor, tau: int) -> torch.Tensor:
    """Dense option: signs of x @ projection [B, d, m·τ] → codes [B, m, n] (a matmul on any device)."""
    return codes_from_signs(x @ projection, tau).transpose(1, 2).contiguous()


def fast_hash(x, diagonals, num_hashes: int, tau: int, engine: str) -> torch.Tensor:
    return fast_hash_op(_f32(x), _f32(diagonals), num_hashes, tau, engine)


@torch.library.custom_op("attention_zoo::yoso_fast_hash", mutates_args=())
def fast_hash_op(x: Tensor, diagonals: Tensor, num_hashes: int, tau: int, engine: str) -> Tensor:
    """int32 codes [B, m, n] of x [B, n, d] (float32, contiguous); engine 'kernel' or 'torch'."""
    if engine == "kernel":
        return _yoso_build.load(x.device.type).fast_hash(x, diagonals, num_hashes, tau)
    return fast_hash_torch(x, diagonals, num_hashes, tau)


@fast_hash_op.register_fake
def _(x, diagonals, num_hashes, tau, engine):
    return x.new_empty((x.shape[0], num_hashes, x.shape[1]), dtype=torch.int32)


# -------------------------------------------------------------------------------- cumulation


def cumulation_torch(codes_q, codes_k, weight_q, weight_k, values, tau, workspace_bytes=DEFAULT_WORKSPACE_BYTES):
    """Compact tables: a key's row is the first position of its code among the pair's sorted key
    codes (at most nk rows, whatever τ), a query reads the row of its code if a key has it; (batch,
    hash) pairs in chunks whose tables and per-token products fit ``workspace_bytes``."""
    batch, m, nq = codes_q.shape
    nk, dv = values.shape[1:]
    channels = weight_q.shape[2]
    out = values.new_zeros(batch, nq, dv)
    flat_codes_q, flat_codes_k = codes_q.reshape(batch * m, nq), codes_k.reshape(batch * m, nk)
    sorted_k = flat_codes_k.sort(dim=-1).values
    key_row = torch.searchsorted(sorted_k, flat_codes_k)  # [pairs, nk] in [0, nk)
    query_row = torch.searchsorted(sorted_k, flat_codes_q).clamp(max=max(nk - 1, 0))
    hit = sorted_k.gather(1, query_row) == flat_codes_q if nk else torch.zeros_like(flat_codes_q, dtype=torch.bool)
    flat_wq = weight_q.expand(batch, m, channels, nq).reshape(batch * m, channels, nq) * hit[:, None]
    flat_wk = weight_k.expand(batch, m, channels, nk).reshape(batch * m, channels, nk)
    step = max(1, workspace_bytes // max(1, (nk + nq) * channels * dv * values.element_size() * 2))  # (n = 0: any)
    for start in range(0, batch * m, step):
        pairs = torch.arange(start, min(start + step, batch * m), device=values.device)
        local = torch.arange(len(pairs), device=values.device)[:, None] * nk
        table = values.new_zeros(len(pairs) * nk, channels, dv)
        contributions = flat_wk[pairs].transpose(1, 2)[..., None] * values[pairs // m, :, None, :]  # [P, nk, p, dv]
        table.index_add_(0, (local + key_row[pairs]).reshape(-1), contributions.reshape(-1, channels, dv))
        read = table[(local + query_row[pairs]).reshape(-1)].reshape(len(pairs), nq, channels, dv)
        out.index_add_(0, pairs // m, torch.einsum("pitl,pti->pil", read, flat_wq[pairs]))
    return out / m


def cumulation(codes_q, codes_k, weight_q, weight_k, values, tau: int, engine: str,
               workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, bf16_rows: bool = False) -> torch.Tensor:
    dtype = engine_dtype(engine, weight_q, weight_k, values)
    return cumulation_op(codes_q.contiguous(), codes_k.contiguous(), _as(weight_q, dtype), _as(weight_k, dtype),
                         _as(values, dtype), tau, workspace_bytes, engine, bf16_rows)


@torch.library.custom_op("attention_zoo::yoso_cumulation", mutates_args=())
def cumulation_op(codes_q: Tensor, codes_k: Tensor, weight_q: Tensor, weight_k: Tensor, values: Tensor, tau: int,
                  workspace_bytes: int, engine: str, bf16_rows: bool) -> Tensor:
    """[B, nq, dv] (module docstring); contiguous inputs of :func:`engine_dtype`, engine 'kernel' or 'torch';
    the values as :func:`rows_read` reads them."""
    values = rows_read(values, engine, bf16_rows)
    if engine == "kernel":
        return _yoso_build.load(values.device.type).cumulation(codes_q, codes_k, weight_q, weight_k, values, tau,
                                                                workspace_bytes)
    return cumulation_torch(codes_q, codes_k, weight_q, weight_k, values, tau, workspace_bytes)


@cumulation_op.register_fake
def _(codes_q, codes_k, weight_q, weight_k, values, tau, workspace_bytes, engine, bf16_rows):
    return values.new_empty((values.shape[0], codes_q.shape[2], values.shape[2]))


# ---------------------------------------------------------------------------- pair gradient


def exact_ratio(x: torch.Tensor, tau: int, clamp: float) -> torch.Tensor:
    """f'(x)/f(x) for f(x) = (1 − arccos(x)/π)^τ, at x clamped to [−clamp, clamp]."""
    x = x.clamp(-clamp, clamp)
    return tau / ((math.pi - torch.arccos(x)) * torch.sqrt(1 - x * x))


def colliding_pairs(codes_s, codes_o, max_pairs: int):
    """Every (b, s, o) with code_h(s) = code_h(o), once per hash h, as index tensors in chunks of about
    ``max_pairs`` pairs (a bucket of many pairs is enumerated as it is: the reference path)."""
    batch, m, ns = codes_s.shape
    no = codes_o.shape[2]
    sorted_o, order = codes_o.sort(dim=-1, stable=True)
    first = torch.searchsorted(sorted_o, codes_s, side="left").reshape(batch * m, ns)
    counts = torch.searchsorted(sorted_o, codes_s, side="right").reshape(batch * m, ns) - first
    order = order.reshape(batch * m, no)
    per_pair = counts.sum(-1).tolist()
    start = 0
    while start < batch * m:  # chunks of (batch, hash) pairs holding about max_pairs collisions
        stop, total = start + 1, per_pair[start]
        while stop < batch * m and total + per_pair[stop] <= max_pairs:
            total += per_pair[stop]
            stop += 1
        chunk_counts = counts[start:stop].reshape(-1)
        owner = torch.repeat_interleave(torch.arange(chunk_counts.numel(), device=codes_s.device), chunk_counts)
        offset = torch.arange(owner.numel(), device=codes_s.device) - (chunk_counts.cumsum(0) - chunk_counts)[owner]
        pair, i = owner // ns + start, owner % ns
        yield pair // m, i, order[pair, first[pair, i] + offset]
        start = stop


def pairs_per_chunk(workspace_bytes: int, width: int) -> int:
    """Colliding pairs one chunk may hold: each costs about ``width`` floats of temporaries."""
    return max(1024, workspace_bytes // (4 * max(width, 1) * 4))


def pair_gradient_torch(codes_s, codes_o, a, o, s, w, mask_o, tau, clamp, workspace_bytes=DEFAULT_WORKSPACE_BYTES):
    out = a.new_zeros(a.shape)
    for b, i, j in colliding_pairs(codes_s, codes_o, pairs_per_chunk(workspace_bytes, 2 * a.shape[2] + s.shape[2])):
        x = (a[b, i] * o[b, j]).sum(-1)
        coefficient = mask_o[b, j] * (s[b, i] * w[b, j]).sum(-1) * exact_ratio(x, tau, clamp)
        out.index_put_((b, i), coefficient[:, None] * o[b, j], accumulate=True)
    return out / codes_s.shape[1]


def exact_weight_backward_torch(codes_q, codes_k, q, k, v, key_weight, grad, tau,
                                workspace_bytes=DEFAULT_WORKSPACE_BYTES):
    """(∇Q, ∇K, ∇V) of Y = (1/m) Σ_h B_h (w ⊙ V) under the lower bound of eq. 4 with every colliding
    pair's exact weight w_j (∇Y_i·v_j): ∇Q_i = (τ/2m) Σ_h Σ_{j colliding} w_j (∇Y_i·v_j) k_j, ∇K_j
    symmetric in q_i, ∇V_j = (w_j/m) Σ_h Σ_{i colliding} ∇Y_i; pair by pair."""
    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    width = 2 * (q.shape[2] + v.shape[2])
    for b, i, j in colliding_pairs(codes_q, codes_k, pairs_per_chunk(workspace_bytes, width)):
        coefficient = key_weight[b, j] * (grad[b, i] * v[b, j]).sum(-1)
        grad_q.index_put_((b, i), coefficient[:, None] * k[b, j], accumulate=True)
        grad_k.index_put_((b, j), coefficient[:, None] * q[b, i], accumulate=True)
        grad_v.index_put_((b, j), key_weight[b, j, None] * grad[b, i], accumulate=True)
    m = codes_q.shape[1]
    return grad_q * (tau / (2 * m)), grad_k * (tau / (2 * m)), grad_v / m


def exact_weight_backward(codes_q, codes_k, q, k, v, key_weight, grad, tau: int, engine: str,
                          workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, normalize: bool = False,
                          bf16_rows: bool = False):
    """(∇Q, ∇K, ∇V) of :func:`exact_weight_backward_torch`. With ``normalize`` q and k are rows of any
    length: the estimator is taken on their unit rows and ∇Q, ∇K are the gradients of the rows given
    (through x ↦ x / max(‖x‖, ε), :func:`~attention_zoo._common.through_unit_rows`); the kernels do both
    (the CPU's while it packs and unpacks its rows, the CUDA's in one launch before the estimator and one
    after), the PyTorch path in passes around it. With
    ``bf16_rows`` the estimator reads its rows (unit q and k, v, ∇Y) as :func:`rows_read` gives them."""
    dtype = engine_dtype(engine, q, k, v, grad)
    return exact_weight_backward_op(codes_q.contiguous(), codes_k.contiguous(), *(_as(x, dtype) for x in (
        q, k, v, key_weight, grad)), tau, workspace_bytes, engine, normalize, bf16_rows)


@torch.library.custom_op("attention_zoo::yoso_exact_weight_backward", mutates_args=())
def exact_weight_backward_op(codes_q: Tensor, codes_k: Tensor, q: Tensor, k: Tensor, v: Tensor, key_weight: Tensor,
                             grad: Tensor, tau: int, workspace_bytes: int, engine: str, normalize: bool,
                             bf16_rows: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(∇Q [B, nq, d], ∇K [B, nk, d], ∇V [B, nk, dv]) of :func:`exact_weight_backward`; engine
    'kernel' or 'torch'."""
    # The kernels normalize themselves, the CUDA ones rounding the unit rows they make (the CPU ones read float32).
    fused = engine == "kernel" and (q.is_cuda or not bf16_rows)
    if not normalize or fused:
        return _exact_weight_backward(codes_q, codes_k, q, k, v, key_weight, grad, tau, workspace_bytes, engine,
                                      normalize, bf16_rows)
    return gradients_through_unit_rows(q, k, lambda unit_q, unit_k: _exact_weight_backward(
        codes_q, codes_k, unit_q, unit_k, v, key_weight, grad, tau, workspace_bytes, engine, False, bf16_rows))


def _exact_weight_backward(codes_q, codes_k, q, k, v, key_weight, grad, tau, workspace_bytes, engine, normalize,
                           bf16_rows):
    v, grad = (rows_read(x, engine, bf16_rows) for x in (v, grad))
    if not normalize:  # (else the kernel rounds the unit rows it makes)
        q, k = (rows_read(x, engine, bf16_rows) for x in (q, k))
    if engine == "kernel":
        return tuple(_yoso_build.load(q.device.type).exact_weight_backward(
            codes_q, codes_k, q, k, v, key_weight, grad, tau, workspace_bytes, normalize, UNIT_ROWS_EPS,
            normalize and bf16_rows))
    return exact_weight_backward_torch(codes_q, codes_k, q, k, v, key_weight, grad, tau, workspace_bytes)


@exact_weight_backward_op.register_fake
def _(codes_q, codes_k, q, k, v, key_weight, grad, tau, workspace_bytes, engine, normalize, bf16_rows):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def pair_gradient(codes_s, codes_o, a, o, s, w, mask_o, tau: int, clamp: float, engine: str) -> torch.Tensor:
    dtype = engine_dtype(engine, a, o, s, w)
    return pair_gradient_op(codes_s.contiguous(), codes_o.contiguous(), *(_as(x, dtype) for x in (a, o, s, w, mask_o)),
                            tau, clamp, engine)


@torch.library.custom_op("attention_zoo::yoso_pair_gradient", mutates_args=())
def pair_gradient_op(codes_s: Tensor, codes_o: Tensor, a: Tensor, o: Tensor, s: Tensor, w: Tensor, mask_o: Tensor,
                     tau: int, clamp: float, engine: str) -> Tensor:
    """[B, ns, d] (module docstring); contiguous inputs of :func:`engine_dtype`, engine 'kernel' or 'torch'."""
    if engine == "kernel":
        return _yoso_build.load(a.device.type).pair_gradient(codes_s, codes_o, a, o, s, w, mask_o, tau, clamp)
    return pair_gradient_torch(codes_s, codes_o, a, o, s, w, mask_o, tau, clamp)


@pair_gradient_op.register_fake
def _(codes_s, codes_o, a, o, s, w, mask_o, tau, clamp, engine):
    return a.new_empty(a.shape)


# ---------------------------------------------------------------------------- the output's unit rows


def on_cuda_kernels(x: Tensor, engine: str) -> bool:
    """Whether the CUDA kernels take rows x: the kernel engine on a CUDA device."""
    return engine == "kernel" and x.is_cuda


def unit_rows(x: Tensor, engine: str) -> Tuple[Tensor, Tensor]:
    """(x / max(‖x‖, ε), ‖x‖ [B, n]) of rows x [B, n, width] (``F.normalize``'s rows, ε = UNIT_ROWS_EPS): on the
    CUDA kernels one launch, else PyTorch's norm, clamp and division. Not differentiable (inside an operator)."""
    if on_cuda_kernels(x, engine):
        return tuple(_yoso_build.load("cuda").unit_rows(x, UNIT_ROWS_EPS))
    unit, norm = unit_rows_with_norms(x, UNIT_ROWS_EPS)
    return unit, norm.squeeze(-1)


def through_output_unit_rows(grad: Tensor, unit: Tensor, norms: Tensor, engine: str) -> Tensor:
    """The gradient of rows x from ``grad``, that of their unit rows and norms as :func:`unit_rows` made them
    (:func:`~attention_zoo._common.through_unit_rows`), in ``unit``'s dtype: on the CUDA kernels one launch;
    elsewhere, and whenever a graph of the gradient is made (create_graph: the kernel is not differentiable),
    PyTorch's passes."""
    grad = _as(grad, unit.dtype)
    if on_cuda_kernels(unit, engine) and not torch.is_grad_enabled():
        return through_unit_rows_op(grad, unit, norms)
    return through_unit_rows(grad, unit, norms.unsqueeze(-1), UNIT_ROWS_EPS)


@torch.library.custom_op("attention_zoo::yoso_through_unit_rows", mutates_args=())
def through_unit_rows_op(grad: Tensor, unit: Tensor, norms: Tensor) -> Tensor:
    """:func:`through_output_unit_rows` on the CUDA kernels (contiguous float32 CUDA tensors)."""
    return _yoso_build.load("cuda").through_unit_rows(grad, unit, norms, UNIT_ROWS_EPS)


@through_unit_rows_op.register_fake
def _(grad, unit, norms):
    return unit.new_empty(unit.shape)


def engine_dtype(engine: str, *tensors: torch.Tensor) -> torch.dtype:
    """What ``engine`` computes in: float32 for the kernels (their only precision), else
    :func:`~attention_zoo._common.computation_dtype` of the inputs (float64 stays float64)."""
    return torch.float32 if engine == "kernel" else computation_dtype(*tensors)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).contiguous()


def rows_read(x: torch.Tensor, engine: str, bf16_rows: bool) -> torch.Tensor:
    """Rows (values, unit q and k, ∇Y) as the estimator reads them: as given, or with ``bf16_rows`` rounded to
    bfloat16 (to nearest even). The CUDA kernels read those as bfloat16 (half the bytes, widened exactly as
    loaded, the sums in float32); every other path reads them widened back to x's dtype: the same values, so
    every engine computes the same estimator, and the CUDA kernels its float32 sums bitwise where deterministic."""
    if not bf16_rows:
        return x
    rounded = x.to(torch.bfloat16)
    return rounded.contiguous() if on_cuda_kernels(x, engine) else rounded.to(x.dtype)


# ------------------------------------------------- the YOSO authors' *YOSO backward (their yoso_v2)

# mlpen/YOSO encoders/backbones/efficient_attentions/yoso/yoso_v2: weighted_lsh_cumulation/cuda_kernel.h
# (NORMALIZER, WARP_SIZE, INV_PI) and cuda_kernel.cu (the three lookup tables), kernel.py (the workspace).
AUTHORS_SCALE = 0.99
AUTHORS_TABLE_SIZE = 32
AUTHORS_INV_PI = 0.31830989
AUTHORS_TABLE_CAP = 10.0
AUTHORS_WORKSPACE = 1024


def _interpolate(table: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The kernels' interpolate(): linear between table[⌊p⌋] and table[⌊p⌋ + 1], p ≥ 0 (p = size − 1, where
    their weight on the entry past the end is 0, reads the last entry)."""
    floor = position.floor().clamp(max=table.numel() - 2)
    index = floor.long()
    dist = position - floor
    return (1 - dist) * table[index] + dist * table[index + 1]


def authors_derivative(cosine: torch.Tensor, tau: int) -> torch.Tensor:
    """f'(0.99·c), f(x) = (1 − arccos(x)/π)^τ, as the authors' yoso_v2 backward evaluates it for a colliding
    pair of unit rows with q̂·k̂ = c: x = 0.99·c and τ·s^(τ−1)·(1/π)·(1 − x²)^(−1/2), s = 1 − arccos(x)/π,
    each of arccos(·)/π, r ↦ min(10, (r + 1e-6)^(−1/2)) and r ↦ min(10, (r + 1e-6)^(τ−1)) read from a
    32-entry table by linear interpolation, in the dtype of ``cosine``. No chain factor 0.99."""
    grid = torch.arange(AUTHORS_TABLE_SIZE, dtype=cosine.dtype, device=cosine.device) / (AUTHORS_TABLE_SIZE - 1)
    arccos_table = torch.arccos(2 * grid - 1) * AUTHORS_INV_PI
    inv_sqrt_table = (1 / torch.sqrt(grid + 1e-6)).clamp(max=AUTHORS_TABLE_CAP)
    pow_table = ((grid + 1e-6) ** (tau - 1)).clamp(max=AUTHORS_TABLE_CAP)
    last = AUTHORS_TABLE_SIZE - 1
    x = AUTHORS_SCALE * cosine
    inv_sqrt = _interpolate(inv_sqrt_table, (1 - x * x) * last)
    collision = 1 - _interpolate(arccos_table, (1 + x) * last / 2)
    return tau * _interpolate(pow_table, collision * last) * AUTHORS_INV_PI * inv_sqrt


def collided_at_least_once(codes_q: torch.Tensor, codes_k: torch.Tensor) -> torch.Tensor:
    """[B, nq, nk] bool: code_h(q_i) = code_h(k_j) for at least one of the m hashes of codes [B, m, n]."""
    hit = torch.zeros(codes_q.shape[0], codes_q.shape[2], codes_k.shape[2], dtype=torch.bool, device=codes_q.device)
    for h in range(codes_q.shape[1]):
        hit |= codes_q[:, h, :, None] == codes_k[:, h, None, :]
    return hit


def authors_pair_gradients(codes_q, codes_k, q, k, v, key_weight, grad, tau: int,
                           workspace_bytes: int = DEFAULT_WORKSPACE_BYTES):
    """(∇Q, ∇K) of *YOSO as the authors' released kernel (yoso_v2, config ``yoso-v2-16``) computes them, on
    unit rows q [B, nq, d], k [B, nk, d]: with C_ij = [i, j collide in at least one hash] · w_j ·
    (∇Y_i·v_j) · :func:`authors_derivative` (q_i·k_j), ∇Q = C K and ∇K = Cᵀ Q. Each colliding pair counts
    once whatever the number of hashes it collides in, with f' itself (not f'/f, and not averaged over
    the m hashes): the pairs that collided, with the true derivative's weights. Dense in chunks of the
    batch (O(nq·nk) per element, as backward=expectation); the authors' kernel keeps at most 1,024 keys
    per query (key j in slot j mod 1,024, one survivor per slot), which is not reproduced."""
    grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)
    per_element = 4 * q.shape[1] * k.shape[1] * q.element_size()
    step = max(1, workspace_bytes // max(1, per_element))
    for start in range(0, q.shape[0], step):
        part = slice(start, start + step)
        weights = authors_derivative(q[part] @ k[part].transpose(-1, -2), tau)
        coefficient = (grad[part] @ v[part].transpose(-1, -2)) * key_weight[part, None, :] * weights
        coefficient = coefficient * collided_at_least_once(codes_q[part], codes_k[part])
        grad_q[part] = coefficient @ k[part]
        grad_k[part] = coefficient.transpose(-1, -2) @ q[part]
    return grad_q, grad_k


def _f32(x: Optional[torch.Tensor]) -> torch.Tensor:
    return _as(x, torch.float32)
