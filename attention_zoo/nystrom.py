"""Nyströmformer attention (Xiong et al. 2021).

softmax(QKᵀ/√d) V ≈ F · pinv(A) · (B V) with landmarks Q̃, K̃ the means of ``num_landmarks``
segments of the real tokens: F = softmax(Q K̃ᵀ), A = softmax(Q̃ K̃ᵀ), B = softmax(Q̃ Kᵀ) (padded keys
masked). pinv(A) by the paper's iteration Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))) from
Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞). A depthwise convolution of the masked values along the sequence is added
as a skip (kernel ``conv_kernel_size``, at most 2N − 1 for inputs of N positions; 0 disables).

Two deliberate departures from the authors' code (Xiong et al.'s and the YOSO LRA code, Hugging
Face ``NystromformerSelfAttention``, nystrom-attention), each an option:

- ``pinv_init``: ``per_matrix`` (default) takes the norms of each matrix; ``batch`` takes their
  maximum over the whole batch and all heads, as the reference does, which makes one sequence's
  output depend on the others in its batch.
- ``landmarks``: ``real_tokens`` (default) averages the real tokens only, cut into
  ``num_landmarks`` near-equal segments by rank; ``padded_segments`` cuts the padded length into
  equal segments and averages padded positions in as zero vectors (the reference; n must be a
  multiple of ``num_landmarks``), and with ``num_landmarks`` = n computes exact softmax attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attention_zoo._common import NEG_INF, depthwise_sequence_conv, at_least_float32
from attention_zoo.options import InvalidOption, choice, odd_window, whole, window_within
from attention_zoo.registry import Attention, register


@dataclass
class NystromOptions:
    num_landmarks: int = 64
    conv_kernel_size: int = 33  # 0 disables the convolution skip
    pinv_iterations: int = 6
    pinv_init: str = "per_matrix"  # per_matrix | batch (the reference: the maximum over the batch)
    landmarks: str = "real_tokens"  # real_tokens | padded_segments (the reference)

    def __post_init__(self):
        whole(self, 1, "num_landmarks", "pinv_iterations")
        odd_window(self, "conv_kernel_size")
        choice(self, "pinv_init", ("per_matrix", "batch"))
        choice(self, "landmarks", ("real_tokens", "padded_segments"))


def iterative_pinv(a: torch.Tensor, iterations: int, per_matrix: bool = True) -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of each matrix in ``a`` [..., m, m] (Nyströmformer eq. 15), from
    Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞) with the norms of each matrix, or (``per_matrix=False``) their maxima over
    every matrix in ``a``."""
    identity = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    column_norm = a.abs().sum(dim=-2).amax(dim=-1, keepdim=True)
    row_norm = a.abs().sum(dim=-1).amax(dim=-1, keepdim=True)
    if not per_matrix:
        column_norm, row_norm = column_norm.amax(), row_norm.amax()
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
        self.conv = depthwise_sequence_conv(num_heads, options.conv_kernel_size)

    @classmethod
    def label(cls, options: NystromOptions) -> str:
        return "Nystromformer"

    @classmethod
    def check_shape(cls, options: NystromOptions, num_heads, head_dim, max_seq_len) -> None:
        if options.num_landmarks > max_seq_len:  # an n × n pseudo-inverse and more: slower than softmax
            raise InvalidOption("num_landmarks", options.num_landmarks,
                                f"at most the input length {max_seq_len} (= {max_seq_len}: exact softmax)")
        if options.landmarks == "padded_segments" and max_seq_len % options.num_landmarks:
            raise InvalidOption("num_landmarks", options.num_landmarks,
                                f"a divisor of the input length {max_seq_len} with landmarks=padded_segments "
                                "(or use landmarks=real_tokens)")
        window_within(options, "conv_kernel_size", max_seq_len)

    @at_least_float32
    def forward(self, q, k, v, mask):
        batch, heads, n, d = q.shape
        m = min(self.options.num_landmarks, n)
        scale = d**-0.25
        q, k = q * scale, k * scale
        real = mask.to(q.dtype)
        if self.options.landmarks == "padded_segments":
            if n % m:
                raise ValueError(f"attention.landmarks=padded_segments needs a length that is a multiple of "
                                 f"num_landmarks={m}, got n={n}; use landmarks=real_tokens or pad the input")
            q, k = q * real[:, None, :, None], k * real[:, None, :, None]
            if m == n:
                scores = q @ k.transpose(-1, -2) + torch.where(mask, 0.0, NEG_INF)[:, None, None, :]
                return self.with_conv(torch.softmax(scores, dim=-1) @ v, v, real)
            q_landmarks = q.view(batch, heads, m, n // m, d).mean(dim=-2)
            k_landmarks = k.view(batch, heads, m, n // m, d).mean(dim=-2)
            f = torch.softmax(q @ k_landmarks.transpose(-1, -2), dim=-1)
            a = torch.softmax(q_landmarks @ k_landmarks.transpose(-1, -2), dim=-1)
        else:
            q_landmarks, k_landmarks, f, a = self.real_token_landmarks(q, k, mask, m)
        b = torch.softmax(q_landmarks @ k.transpose(-1, -2) + torch.where(mask, 0.0, NEG_INF)[:, None, None, :], dim=-1)
        pinv = iterative_pinv(a, self.options.pinv_iterations, self.options.pinv_init == "per_matrix")
        return self.with_conv(f @ (pinv @ (b @ v)), v, real)

    def with_conv(self, out, v, real):
        return out if self.conv is None else out + self.conv(v * real[:, None, :, None])

    @staticmethod
    def real_token_landmarks(q, k, mask, m):
        """Landmarks of the real tokens only: (Q̃, K̃, F, A), empty landmarks masked out of F and A."""
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
        return q_landmarks, k_landmarks, f, a
