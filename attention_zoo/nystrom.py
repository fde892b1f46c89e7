"""Nyströmformer attention (Xiong et al. 2021).

softmax(QKᵀ/√d) V ≈ F · pinv(A) · (B V) with landmarks Q̃, K̃ the means of ``num_landmarks``
segments of the real tokens: F = softmax(Q K̃ᵀ), A = softmax(Q̃ K̃ᵀ), B = softmax(Q̃ Kᵀ) (padded keys
masked). pinv(A) by the paper's iteration Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))) from
Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞), the norms taken per matrix (the reference takes them over the whole batch).
Padding never enters a landmark mean (the reference averages it in). A depthwise convolution of the
masked values along the sequence is added as a skip (kernel ``conv_kernel_size``; 0 disables).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attention_zoo._common import NEG_INF, depthwise_sequence_conv, in_float32
from attention_zoo.registry import Attention, register


@dataclass
class NystromOptions:
    num_landmarks: int = 64
    conv_kernel_size: int = 33  # 0 disables the convolution skip
    pinv_iterations: int = 6


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of each matrix in ``a`` [..., m, m] (Nyströmformer eq. 15)."""
    identity = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    column_norm = a.abs().sum(dim=-2).amax(dim=-1, keepdim=True)
    row_norm = a.abs().sum(dim=-1).amax(dim=-1, keepdim=True)
    z = a.transpose(-1, -2) / (column_norm * row_norm).unsqueeze(-1)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * identity - az @ (15 * identity - az @ (7 * identity - az)))
    return z


@register("nystrom", NystromOptions)
class NystromAttention(Attention):
    subquadratic = True

    def __init__(self, num_heads, head_dim, max_seq_len, options):
        super().__init__(num_heads, head_dim, max_seq_len, options)
        self.conv = depthwise_sequence_conv(num_heads, options.conv_kernel_size, "conv_kernel_size")

    @classmethod
    def label(cls, options: NystromOptions) -> str:
        return "Nystromformer"

    @in_float32
    def forward(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        m = min(self.options.num_landmarks, n)
        scale = d**-0.25
        q, k = q * scale, k * scale
        # Segment of each real token: its rank among the real tokens, cut into m near-equal parts.
        real = mask.to(q.dtype)
        rank = real.cumsum(dim=-1) - 1
        count = real.sum(dim=-1, keepdim=True).clamp(min=1)
        segment = torch.div(rank * m, count, rounding_mode="floor").clamp(0, m - 1).long()
        membership = nn.functional.one_hot(segment, m).to(q.dtype) * real.unsqueeze(-1)  # [B, n, m]
        sizes = membership.sum(dim=1)  # [B, m]
        present = sizes > 0
        average = (membership / sizes.clamp(min=1).unsqueeze(1)).transpose(1, 2)[:, None]  # [B, 1, m, n]
        q_landmarks, k_landmarks = average @ q, average @ k

        landmark_bias = torch.where(present, 0.0, NEG_INF)[:, None, None, :]
        f = torch.softmax(q @ k_landmarks.transpose(-1, -2) + landmark_bias, dim=-1)
        a = torch.softmax(q_landmarks @ k_landmarks.transpose(-1, -2) + landmark_bias, dim=-1)
        # An empty landmark (fewer real tokens than landmarks) gets an identity row, so pinv(A) is
        # block diagonal and the empty landmark, whose column of F is 0, contributes nothing.
        empty = (~present)[:, None, :, None].to(q.dtype)
        a = a * (1 - empty) + torch.eye(m, dtype=q.dtype, device=q.device) * empty
        b = torch.softmax(q_landmarks @ k.transpose(-1, -2) + torch.where(mask, 0.0, NEG_INF)[:, None, None, :], dim=-1)
        out = f @ (iterative_pinv(a, self.options.pinv_iterations) @ (b @ v))
        if self.conv is not None:
            out = out + self.conv(v * real[:, None, :, None])
        return out
