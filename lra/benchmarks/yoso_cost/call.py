"""One YOSO attention call as the GPU cost model sees it: its shape, its buckets, and the work that
surrounds the kernels (torch's sort of the codes, PyTorch's elementwise passes around the operator).

Codes are taken uniform over 2^τ (random unit q and k: each bit a fair coin), so a token meets
λ = n / 2^τ tokens of the other side per hash, Poisson; trained models collide more
(``lra-fidelity`` measures it, and :func:`measured` takes the statistics of real codes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import List, Optional

from lra.benchmarks.yoso_cost.gpu import WARP, Kernel, Machine, streaming


@dataclass(frozen=True)
class Buckets:
    """Per (sequence, hash) pair: distinct key codes, the share of queries whose bucket holds a key,
    keys per query (= queries per key)."""

    distinct: float
    hit: float
    per_query: float


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
        hit = 1 - (1 - 2.0**-self.bits) ** self.n
        return Buckets(2**self.bits * hit, hit, self.n / 2**self.bits)

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

    distinct, hits, collisions = [], [], 0
    for q, k in zip(codes_q.reshape(-1, call.n), codes_k.reshape(-1, call.n)):
        values, counts = np.unique(k, return_counts=True)
        distinct.append(len(values))
        found = np.isin(q, values)
        hits.append(found.mean())
        collisions += counts[np.searchsorted(values, q[found])].sum()
    return replace(call, buckets=Buckets(float(np.mean(distinct)), float(np.mean(hits)),
                                         collisions / (call.pairs * call.n)))


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


def torch_sort(c: Call, sides: int, machine: Machine) -> List[Kernel]:
    """``sort_codes`` (yoso_cuda.cpp): at::sort(stable) of [B·m, n] int32 along n, then the int64 order
    to int32. Up to n = 4,096 torch sorts each row in one block (cub's block radix sort, 8 passes of
    4 bits in shared memory; ATen's Sort.cpp, should_use_small_sort): codes and the order through DRAM
    once (indices filled, codes copied, 12 bytes read and written per element, the order converted:
    52 bytes per element). Above, a segmented device radix sort: 5 more passes of 24 bytes through
    DRAM per element."""
    elements = sides * c.pairs * c.n
    small = c.n <= 4096
    per_element = 52 + (0 if small else 5 * 24)
    name = f"sort codes ({'q, k' if sides == 2 else 'k'})"
    sort = Kernel(name, blocks=sides * c.pairs if small else elements / 2048, threads=512 if small else 256,
                  launches=sides * (1 if small else 5), registers=64, shared_bytes=min(c.n, 4096) * 16 if small else 0,
                  instructions=elements * (8 * 15 if small else 5 * 20) / WARP, dram_bytes=elements * per_element,
                  l2_bytes=elements * per_element, chain=8 * 40 * machine.shared_latency + 2 * machine.dram_latency,
                  loaded=elements * per_element / 2, stored=elements * per_element / 2)
    return [sort, streaming(f"{name}: order filled, codes copied, order to int32", 0, machine, launches=3 * sides)]


def around_operator(c: Call, backward: bool, machine: Machine) -> Kernel:
    """PyTorch's elementwise work around the operator (attention_zoo/yoso.py): q, k out of the heads
    layout, their unit rows, the output's unit rows (forward: ~13 passes over [B, n, d] floats, 10
    launches); the same in reverse, the gradients zeroed (backward: ~19 passes, 14 launches)."""
    passes, launches = (19, 14) if backward else (13, 10)
    kernel = streaming("PyTorch around the operator (copies, unit rows)", passes * c.B * c.n * c.d * 4, machine)
    return replace(kernel, launches=launches, blocks=max(1.0, kernel.blocks / launches))
