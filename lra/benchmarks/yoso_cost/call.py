"""One YOSO attention call as the GPU cost model sees it: its shape and its buckets, and the statistics
the kernels' costs take from them (the busiest lane, the rounds of a contended atomic, a binary search's
latency); the ops around the kernels are :mod:`.ops`'.

Codes are taken uniform over 2^τ (random unit q and k: each bit a fair coin), so a token meets
λ = n / 2^τ tokens of the other side per hash, Poisson; trained models collide more
(``lra-fidelity`` measures it, and :func:`measured` takes the statistics of real codes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

from lra.benchmarks.yoso_cost.gpu import WARP, Machine


MEASURED_MOST_SLICES = 16  # yoso_cuda_kernels.cu's kMostSlices in the kernels the committed measurements ran


@dataclass(frozen=True)
class Buckets:
    """Per (sequence, hash) pair: distinct key codes, the share of queries whose bucket holds a key,
    keys per query (= queries per key), the share of queries whose bucket holds two keys or more."""

    distinct: float
    hit: float
    per_query: float
    two_or_more: float


@dataclass(frozen=True)
class Call:
    """One attention call: B = batch·heads sequences of n tokens, head dim d (values dv), m hashes of
    τ bits; ``buckets`` measured from real codes, or None for uniform codes."""

    B: int
    n: int
    d: int
    dv: int
    m: int = 32
    tau: int = 0  # 0: ⌈log2 n⌉, the backend's default
    buckets: Optional[Buckets] = None
    # The kernels the committed H100 measurements ran (csrc/yoso at a94d93d) instead of today's: 16 slices a
    # pair's shared-memory table at most, the codes sorted by torch's sort, a warp per row in the deterministic
    # cumulation, q and k normalized by PyTorch around the backward. Measured calls are modelled with them
    # (measured.call_as_measured).
    measured_kernels: bool = False
    bf16_rows: bool = False  # attention.bf16_rows: the rows the kernels read (q̂, k̂, v, ∇Y) in 2 bytes a coordinate

    @property
    def row_bytes(self) -> int:
        """Bytes a coordinate of a row the kernels read: float32, or bfloat16 with bf16_rows."""
        return 2 if self.bf16_rows else 4

    @property
    def most_slices(self) -> Optional[int]:
        """The kernels' limit on a table's slices: the measured kernels' 16; None: today's (kernels.MOST_SLICES)."""
        return MEASURED_MOST_SLICES if self.measured_kernels else None

    @property
    def bits(self) -> int:
        return self.tau or max(1, math.ceil(math.log2(max(2, self.n))))

    @property
    def padded(self) -> int:
        return 1 << max(0, math.ceil(math.log2(self.d)))

    @property
    def products(self) -> int:
        return self.bits * math.ceil(self.m / self.padded)

    @property
    def stats(self) -> Buckets:
        if self.buckets is not None:
            return self.buckets
        p = 2.0**-self.bits
        hit = 1 - (1 - p) ** self.n
        two_or_more = hit - self.n * p * (1 - p) ** (self.n - 1)
        return Buckets(2**self.bits * hit, hit, self.n / 2**self.bits, two_or_more)

    @property
    def search(self) -> float:
        """Loads of one binary search over n sorted codes (⌊log2 n⌋ or ⌊log2 n⌋ + 1 halvings)."""
        return math.log2(self.n + 1)

    @property
    def pairs(self) -> int:
        return self.B * self.m

    @property
    def lane_max(self) -> float:
        """Colliding tokens of the busiest of a warp's 32 lanes, one token each, under one hash: a warp
        runs as long as its longest lane."""
        return max_of_poisson(self.stats.per_query, WARP)

    @property
    def run(self) -> float:
        """Tokens in a non-empty bucket's run."""
        b = self.stats
        return b.per_query / b.hit if b.hit else 0.0


def measured(call: Call, codes_q, codes_k) -> Call:
    """``call`` with its bucket statistics taken from codes [B, m, n] (numpy)."""
    import numpy as np

    distinct, hits, two_or_more, collisions = [], [], [], 0
    for q, k in zip(codes_q.reshape(-1, call.n), codes_k.reshape(-1, call.n)):
        values, counts = np.unique(k, return_counts=True)
        distinct.append(len(values))
        found = np.isin(q, values)
        hits.append(found.mean())
        keys = counts[np.searchsorted(values, q[found])]
        two_or_more.append((keys >= 2).sum() / call.n)
        collisions += keys.sum()
    return replace(call, buckets=Buckets(float(np.mean(distinct)), float(np.mean(hits)),
                                         collisions / (call.pairs * call.n), float(np.mean(two_or_more))))


@lru_cache(maxsize=None)
def max_of_poisson(mean: float, draws: int) -> float:
    """E[max of ``draws`` independent Poisson(mean)] (summed tail probabilities)."""
    if mean <= 0:
        return 0.0
    expected, cdf, term, k = 0.0, 0.0, math.exp(-mean), 0
    while True:
        cdf += term
        tail = 1 - cdf**draws
        if tail < 1e-9:
            return expected
        expected += tail
        k += 1
        term *= mean / k


@lru_cache(maxsize=None)
def most_on_one(lanes: int, addresses: int) -> float:
    """E[the most of ``lanes`` lanes that pick one of ``addresses`` addresses uniformly at random]: the rounds
    of a warp's shared atomic whose lanes hit random counters. Exact: P(max ≤ t) = L! [x^L] (Σ_{j ≤ t}
    (x/A)^j/j!)^A, the power by squaring, summed over t until P(max ≤ t) is 1 to 1e-12."""
    if addresses <= 1 or lanes <= 1:
        return float(lanes)
    expected = 0.0
    for t in range(lanes):
        power, base, exponent = [1.0], [addresses ** -j / math.factorial(j) for j in range(t + 1)], addresses
        while exponent:
            if exponent & 1:
                power = _truncated_product(power, base, lanes)
            exponent >>= 1
            if exponent:
                base = _truncated_product(base, base, lanes)
        at_most = (power[lanes] if len(power) > lanes else 0.0) * math.factorial(lanes)
        expected += 1.0 - at_most
        if at_most > 1.0 - 1e-12:
            break
    return expected


def _truncated_product(a: list, b: list, degree: int) -> list:
    """The coefficients of the product of two polynomials, up to x^degree."""
    out = [0.0] * min(len(a) + len(b) - 1, degree + 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b[: len(out) - i]):
            out[i + j] += x * y
    return out


def dependent_latency(machine: Machine, array_bytes: float, cached: float = 64 * 1024) -> float:
    """Cycles of one load of a binary search (a chain of dependent loads) over a sorted array that a
    block searches again and again: the top levels of the search stay in L1 (``cached`` bytes of the
    array), the levels below miss to L2, so a load costs L1's latency plus L2's for the share
    log2(array / cached) / log2(array / 4) of the levels."""
    l1 = machine.l1_latency
    if array_bytes <= cached:
        return l1
    missing = math.log2(array_bytes / cached) / math.log2(array_bytes / 4)
    return l1 + (machine.l2_latency - l1) * missing
