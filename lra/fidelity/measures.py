"""What ``lra-fidelity`` measures, as functions of tensors (attention-math.md, last section).

Shapes: q, k, v [B, H, n, d]; mask [B, n] bool (True = real token); attention A [B, H, n, n].
Every error is taken over the rows of real queries only.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F


def exact_attention(q, k, v, mask) -> Tuple[torch.Tensor, torch.Tensor]:
    """softmax(QKᵀ/√d) V over real keys, in float64: (output [B, H, n, d], A [B, H, n, n])."""
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    attention = torch.softmax(scores.masked_fill(~mask[:, None, None, :], float("-inf")), dim=-1)
    return attention @ v, attention


def real_rows(x: torch.Tensor, mask) -> torch.Tensor:
    """[B, H, n, d] → [rows, d]: the rows of real queries."""
    return x[mask[:, None, :].expand(x.shape[:3])]


def output_error(approximate, exact, mask) -> Dict[str, float]:
    """Relative error ‖Ô − O‖_F / ‖O‖_F and mean row angle (radians) between Ô and O, over real
    queries. A zero row has angle π/2 to everything (it points nowhere)."""
    a, b = real_rows(approximate.double(), mask), real_rows(exact.double(), mask)
    unit_a, unit_b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    # 2·atan2(‖â − b̂‖, ‖â + b̂‖) is the angle, accurate near 0 where arccos(â·b̂) is not.
    angle = 2 * torch.atan2((unit_a - unit_b).norm(dim=-1), (unit_a + unit_b).norm(dim=-1))
    zero = (a.norm(dim=-1) == 0) | (b.norm(dim=-1) == 0)
    return {"relative_error": float((a - b).norm() / b.norm().clamp(min=1e-300)),
            "mean_angle": float(angle.masked_fill(zero, math.pi / 2).mean())}


def weight_ranks(attention: torch.Tensor) -> torch.Tensor:
    """Each weight's rank in its row, 0 for the largest (ties in index order)."""
    order = attention.argsort(dim=-1, descending=True, stable=True)
    positions = torch.arange(attention.shape[-1], device=attention.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, positions)


def keep_top(attention: torch.Tensor, r, ranks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Optimal-v-oblivious-r (Gupta & Berant 2021): each row's r largest weights, renormalized. ``r``
    is one budget (≥ 1) or a budget per row (a tensor of attention's shape without the last
    dimension; a row with budget 0 becomes zeros); ``ranks`` from :func:`weight_ranks`, to reuse."""
    ranks = weight_ranks(attention) if ranks is None else ranks
    budget = torch.as_tensor(r, device=attention.device)
    kept = attention * (ranks < (budget[..., None] if budget.dim() else budget.clamp(min=1)))
    return kept / kept.sum(-1, keepdim=True).clamp(min=1e-300)


def nearest_value(exact: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """Optimal-v-aware-1: for each row o_i of ``exact`` the real value v_j nearest to it (the best
    convex combination of a single value) → [B, H, n, d]."""
    distance = torch.cdist(exact, v.to(exact.dtype)).masked_fill(~mask[:, None, None, :], float("inf"))
    index = distance.argmin(-1)
    return v.to(exact.dtype).gather(2, index[..., None].expand(*index.shape, v.shape[-1]))


def _null_vector(block: torch.Tensor) -> torch.Tensor:
    """A nonzero z with block z = 0 for each [d + 1, d + 2] matrix: z = (A⁻¹b, −1) for block = [A | b],
    or the last right singular vector where A is singular."""
    kept, new = block[..., :-1], block[..., -1:]
    solution, info = torch.linalg.solve_ex(kept, new)
    null = torch.cat([solution[..., 0], -torch.ones_like(solution[..., :1, 0])], dim=-1)
    singular = (info != 0) | ~torch.isfinite(null).all(-1)
    if singular.any():
        null[singular] = torch.linalg.svd(block[singular]).Vh[:, -1]
    return null


def caratheodory(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Carathéodory's reduction: the same point Σ_j w_j v_j (rows [R], w [R, n] on the simplex, v
    [R, n, d]) written with at most d + 1 nonzero weights, so optimal-v-aware-(d+1) has error 0.

    Keep a block of d + 2 candidates; the affinely dependent points [v_j; 1] have a null vector z
    (Σz = 0, Σ z_j v_j = 0); moving the weights along −z until one reaches 0 keeps the point and
    the weights' sum, and frees that slot for the next candidate. Returns the reduced weights."""
    rows, n, d = values.shape
    if n <= d + 1:
        return weights.clone()
    weights = weights.double().clone()
    lifted = torch.cat([values.double(), torch.ones(rows, n, 1, dtype=torch.float64, device=values.device)], dim=-1)
    slots = torch.arange(d + 2, device=values.device).repeat(rows, 1)  # candidate indices [R, d + 2]
    arange = torch.arange(rows, device=values.device)
    for candidate in range(d + 1, n):
        slots[:, -1] = candidate
        block = lifted.gather(1, slots[..., None].expand(-1, -1, d + 1)).transpose(1, 2)  # [R, d + 1, d + 2]
        null = _null_vector(block)
        null = torch.where(null.amax(-1, keepdim=True) > -null.amin(-1, keepdim=True), null, -null)
        current = weights.gather(1, slots)
        ratio = torch.where(null > 1e-12, current / null.clamp(min=1e-12), float("inf"))
        step, leaving = ratio.min(-1)
        updated = (current - step[:, None] * null).clamp(min=0)
        updated[arange, leaving] = 0
        weights.scatter_(1, slots, updated)
        # The slot whose weight reached 0 takes the next candidate; keep the live ones in front.
        last = slots[:, -1].clone()
        slots[arange, leaving] = last
        slots[:, -1] = last  # overwritten by the next candidate
    return weights


def attention_utility(attention: torch.Tensor, attended: torch.Tensor, mask) -> Dict[str, float]:
    """LHA paper: the mean over real queries of Σ_{j ∈ S_i} A_ij, the mean |S_i| (keys per query) and
    the share of real queries with no key at all (S_i empty: LHA's queries no bucket selects)."""
    real = mask[:, None, :].expand(attention.shape[:3])
    return {"utility": float((attention * attended).sum(-1)[real].mean()),
            "keys_per_query": float(attended.sum(-1).double()[real].mean()),
            "uncovered_queries": float((~attended.any(-1))[real].double().mean())}


def bucket_balance(query_counts: torch.Tensor, key_counts: torch.Tensor) -> Dict[str, float]:
    """Per-bucket query and key counts [..., buckets] → max/mean of each (averaged over the leading
    dimensions) and the share of occupied buckets whose query:key ratio is beyond 2:1 either way."""
    query_counts, key_counts = query_counts.double(), key_counts.double()

    def max_over_mean(counts):
        return float((counts.amax(-1) / counts.mean(-1).clamp(min=1e-300)).mean())

    occupied = (query_counts + key_counts) > 0
    skewed = (query_counts > 2 * key_counts) | (key_counts > 2 * query_counts)
    return {"query_max_over_mean": max_over_mean(query_counts), "key_max_over_mean": max_over_mean(key_counts),
            "skewed_bucket_share": float((skewed & occupied).sum() / occupied.sum().clamp(min=1))}
