"""Softmax attention on an H100 at published achieved throughput, not peak: what YOSO is projected against.

Measured TFLOP/s of non-causal bf16 attention on an H100 80GB SXM5, from FlashAttention-3 (Shah et al.
2024, arXiv:2407.08608, the panels without causal mask of Figures 5 (forward) and 6 (backward), the
values printed on the bars; batch × length = 16k tokens, hidden 2,048): FlashAttention-2,
which PyTorch's SDPA runs for bf16 on an H100 (its flash backend), and "standard attention" (PyTorch's
eager matmul–softmax–matmul), forward and backward, head dims 64 and 128, lengths 512 … 16k. FLOPs are
counted as the papers count them: 4 n² d per head forward, 2.5× that backward. Head dim 32 is not
published; it is extrapolated per length from 64 and 128 by taking a (query, key) pair's time as
a·d + c (the matmuls grow with d, the softmax's exponentials and bookkeeping do not). Beyond 16k the
16k rate is kept, below 512 the 512 rate. A grid with fewer tiles of 128 queries (keys, backward)
than the H100's 132 SMs runs at that fraction of the rate.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

from lra.benchmarks.yoso_cost.gpu import H100, Machine

LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
# (kernel, direction, head dim) -> TFLOP/s at LENGTHS (FlashAttention-3, Figures 5 and 6 without causal
# mask; standard attention ran out of memory at 16k in every panel: its 8k rate is kept)
PUBLISHED: Dict[Tuple[str, str, int], Tuple[float, ...]] = {
    ("flash2", "forward", 64): (282, 306, 318, 321, 322, 324),
    ("flash2", "forward", 128): (309, 350, 362, 368, 370, 370),
    ("flash2", "backward", 64): (198, 238, 264, 279, 287, 291),
    ("flash2", "backward", 128): (214, 260, 291, 310, 318, 322),
    ("standard", "forward", 64): (52, 63, 67, 72, 73, 73),
    ("standard", "forward", 128): (74, 100, 119, 133, 139, 139),
    ("standard", "backward", 64): (68, 76, 88, 92, 95, 95),
    ("standard", "backward", 128): (104, 131, 159, 174, 181, 181),
}
TILE = 128  # queries (forward) or keys (backward) per FlashAttention-2 thread block


def _published(kernel: str, direction: str, d: int, n: int) -> float:
    """TFLOP/s at length n (log-linear between the published lengths, flat outside them)."""
    rates = PUBLISHED[(kernel, direction, d)]
    if n <= LENGTHS[0]:
        return rates[0]
    if n >= LENGTHS[-1]:
        return rates[-1]
    i = next(i for i, length in enumerate(LENGTHS) if length >= n)
    share = (math.log2(n) - math.log2(LENGTHS[i - 1])) / (math.log2(LENGTHS[i]) - math.log2(LENGTHS[i - 1]))
    return rates[i - 1] + share * (rates[i] - rates[i - 1])


def achieved_tflops(kernel: str, direction: str, d: int, n: int) -> float:
    """The published rate for head dim 64 or 128; others from a pair's time a·d + c fitted to both."""
    if d in (64, 128):
        return _published(kernel, direction, d, n)
    per_pair = 4.0 if direction == "forward" else 10.0  # FLOPs per (query, key) pair per head dim
    t64, t128 = (per_pair * dim / _published(kernel, direction, dim, n) for dim in (64, 128))
    slope = (t128 - t64) / 64
    return per_pair * d / (t64 + slope * (d - 64))


def flops(batch_heads: int, n: int, d: int, direction: str) -> float:
    return 4.0 * batch_heads * n * n * d * (2.5 if direction == "backward" else 1.0)


def attention_seconds(kernel: str, batch_heads: int, n: int, d: int, direction: str, machine: Machine = H100) -> float:
    """Seconds of one SDPA (``flash2``) or eager (``standard``) attention pass, bf16, on an H100."""
    rate = achieved_tflops(kernel, direction, d, n) * 1e12
    tiles = batch_heads * math.ceil(n / TILE)
    filled = min(1.0, tiles / machine.sms)
    launches = (1 if direction == "forward" else 3) if kernel == "flash2" else (3 if direction == "forward" else 5)
    return flops(batch_heads, n, d, direction) / (rate * filled) + launches * machine.launch_s


def eager_bytes(batch_heads: int, n: int) -> float:
    """The eager forward + backward's largest live tensors: bf16 scores and probabilities kept for the
    backward, and the gradient of the scores (6 bytes per (query, key) pair)."""
    return 6.0 * batch_heads * n * n
