"""Attention through a feature map, the part that Linear Transformer and RFA share.

With features φ(q), φ(k) of every query and key (φ(k) zero on padded keys), softmax attention's
weights exp(q·k) are replaced by φ(q)·φ(k), and the sums over keys are reordered so that no n × n
matrix is formed (Katharopoulos et al. 2020, §3.2; Peng et al. 2021, §3.1):

    numerator_i  = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ        normalizer_i = φ(q_i) · Σ_j φ(k_j)

Causal (Katharopoulos et al. §3.3, RFA's causal form), the sums run over j ≤ i.
They are taken chunk by chunk: the keys of earlier chunks enter through the chunks' running sums of
φ(k) vᵀ, and a query's own chunk through a masked C × C block, so memory stays linear in n
(n·(C + F·d_v / C) numbers per head, F features) instead of the n·F·d_v of a running sum per position.
"""

from __future__ import annotations

from typing import Tuple

import torch

from attention_zoo._common import pad_to_multiple

CAUSAL_CHUNK = 64  # C: positions per chunk of the causal sums


def feature_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, causal: bool,
                      chunk: int = CAUSAL_CHUNK) -> Tuple[torch.Tensor, torch.Tensor]:
    """(numerator [B, H, n, d_v], normalizer [B, H, n, 1]) of queries' features ``phi_q`` [B, H, n, F]
    against keys' ``phi_k`` [B, H, n, F] and values ``v`` [B, H, n, d_v]; padded keys must already be
    zero in ``phi_k`` and ``v``. ``causal``: query i sums over keys j ≤ i only."""
    if not causal:
        numerator = phi_q @ (phi_k.transpose(-1, -2) @ v)
        normalizer = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
        return numerator, normalizer
    return _causal_sums(phi_q, phi_k, v, chunk)


def _causal_sums(phi_q, phi_k, v, chunk: int):
    """The sums over j ≤ i in chunks of ``chunk`` positions. A query's value depends only on keys at
    or before it (a later key enters an earlier chunk's sums nowhere, and its own chunk's block as an
    exact zero), so earlier outputs are bitwise independent of later tokens."""
    batch, heads, n, features = phi_q.shape
    size = max(1, min(chunk, n))
    blocks = -(-n // size)

    def chunked(x):  # [B, H, n, e] → [B, H, blocks, size, e], zero rows after n
        return pad_to_multiple(x, size, dim=2).reshape(batch, heads, blocks, size, x.shape[-1])

    q, k, values = chunked(phi_q), chunked(phi_k), chunked(v)
    chunk_kv = k.transpose(-1, -2) @ values  # [B, H, blocks, F, d_v]: Σ φ(k_j) v_jᵀ within each chunk
    chunk_k = k.sum(dim=-2)  # [B, H, blocks, F]
    # The sums of the chunks before each chunk (shifted, not cumsum minus self: that would mix in the
    # chunk's own later keys and round differently when they change).
    before_kv = torch.cat([torch.zeros_like(chunk_kv[:, :, :1]), chunk_kv[:, :, :-1].cumsum(dim=2)], dim=2)
    before_k = torch.cat([torch.zeros_like(chunk_k[:, :, :1]), chunk_k[:, :, :-1].cumsum(dim=2)], dim=2)
    earlier = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    within = (q @ k.transpose(-1, -2)).masked_fill(~earlier, 0.0)  # [B, H, blocks, size, size]
    numerator = q @ before_kv + within @ values
    normalizer = (q @ before_k.unsqueeze(-1)) + within.sum(dim=-1, keepdim=True)
    return (numerator.reshape(batch, heads, blocks * size, v.shape[-1])[:, :, :n],
            normalizer.reshape(batch, heads, blocks * size, 1)[:, :, :n])
