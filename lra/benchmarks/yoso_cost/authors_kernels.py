"""The YOSO authors' CUDA design on paper, to calibrate the cost model against the paper's Table 4.

The paper (Zeng et al., ICML 2021, appendix Table 4) times one BERT-base attention module (12 heads
of 64, model dim 768) per instance on an RTX 2080 Ti. The module (the authors' ``Attention`` of
encoders/backbones/efficient_attention.py, github.com/mlpen/YOSO) is: Q, K, V projections, heads
split (a copy each), Q and K normalized (training mode), YOSO-m's ``LSHCumulation`` (fast_hash, then
``lsh_cumulation`` version 1 forward; backward: ∇V by ``lsh_cumulation``, ∇Q and ∇K by
``lsh_weighted_cumulation`` version 4 after a counting sort), the output normalized, heads
combined, the output projection; all fp32 (attention runs outside autocast), τ = log2 n (the
profiling script's ``hash_code_len = log_seq_len``; the testing peak of Table 4, ~m·n·12·128 bytes,
is the size of these per-hash tables). Every kernel below follows the authors' code
(yoso_v1/cuda/fast_lsh_cumulation*.cu): its grid, ptxas's registers (nvcc 13, sm_75) and shared
memory, the instructions a warp issues per token, hash or colliding pair, the sectors it moves and
the chain of latencies a block waits on. Codes are uniform (random projections of random inputs):
a key meets n / 2^τ = 1 query per hash on average.

Per-instance time is the time of a batch divided by the batch; the batch is the largest that fits
10 GiB at Table 4's training peak per instance (the authors profiled the largest batch that fits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

from lra.benchmarks.yoso_cost.gpu import RTX_2080_TI, SECTOR, Kernel, Machine, gemm, streaming

HEADS, HEAD_DIM, DIM = 12, 64, 768  # BERT-base multi-head attention
TABLE_ROW = 32 * 4  # the authors' tables hold 32 value coordinates (one warp) per row
UNROLL = 4  # loads in flight per warp in a loop nvcc unrolls by its default factor


@dataclass(frozen=True)
class Module:
    """One Table 4 cell: YOSO-m (or softmax, m = 0) at length n, for a batch of instances."""

    n: int
    m: int
    batch: int

    @property
    def sequences(self) -> int:
        return self.batch * HEADS

    @property
    def tokens(self) -> int:
        return self.batch * self.n

    @property
    def tau(self) -> int:
        return int(math.log2(self.n))

    @property
    def unit(self) -> float:
        """Bytes of one [tokens, 768] fp32 activation."""
        return self.tokens * DIM * 4


def batch_for(training_peak_mb: float, memory_gib: float = 10.0) -> int:
    return max(1, int(memory_gib * 1024 / training_peak_mb))


def _l2_hit(region_bytes: float, machine: Machine) -> float:
    """The share of random accesses into a live region that find their line in L2."""
    return min(1.0, machine.l2_bytes / max(region_bytes, 1.0))


def fast_hash(c: Module, machine: Machine) -> List[Kernel]:
    """fast_hash_ver1: a block of d = 64 threads per (token, part); a part is d // τ hashes. Three
    diagonal sign flips, each followed by a Walsh–Hadamard transform (one shared-memory stage with
    a runtime division for stride 32, five shuffle stages); then each hash's τ bits summed from
    shared memory by one thread (τ ≠ 8, 16). For q and k."""
    parts = max(1, math.ceil(c.m / (HEAD_DIM // c.tau)))
    blocks = parts * c.n * c.sequences
    per_warp = 20 + 3 * 75 + 10 + 3 * c.tau
    chain = 2 * machine.dram_latency + 3 * (machine.l2_latency + 6 * machine.shared_latency + 60) \
        + (c.tau + 2) * machine.shared_latency
    codes = c.sequences * c.n * c.m * 4
    kernel = Kernel("fast_hash (q, k)", blocks=blocks, threads=HEAD_DIM, launches=2, registers=23,
                    shared_bytes=HEAD_DIM * 4, instructions=2 * blocks * 2 * per_warp,
                    dram_bytes=2 * (c.sequences * c.n * HEAD_DIM * 4 + blocks * SECTOR),
                    l2_bytes=2 * blocks * (4 * HEAD_DIM * 4 + 2 * SECTOR), chain=chain)
    return [streaming("hash codes zeroed (q, k)", 2 * codes, machine, launches=4), kernel]


def cumulation(c: Module, machine: Machine, name: str) -> List[Kernel]:
    """lsh_cumulation_ver1, per 32 value coordinates: the table [B, m, 2^τ, 32] cleared, a warp per key
    atomically adds its 32 values into its row under each hash (step 1), a warp per query sums its
    rows (step 2). A table row is a 128-byte line; rows of tables larger than L2 come from DRAM."""
    chunks = HEAD_DIM // 32
    table = c.sequences * c.m * 2**c.tau * TABLE_ROW
    resident_keys = machine.sms * 4 * 8  # 4 blocks of 8 warps per SM
    live = c.m * 2**c.tau * TABLE_ROW * max(1.0, resident_keys / c.n)
    miss = 1.0 - _l2_hit(live, machine)
    visits = c.sequences * c.n * c.m  # (token, hash) pairs
    warps = c.sequences * c.n
    blocks = warps / 8
    step1 = Kernel(f"{name}: step 1 (atomicAdd into tables)", blocks=blocks, threads=256, launches=chunks,
                   registers=33, instructions=chunks * (warps * 15 + visits * 8),
                   dram_bytes=chunks * (warps * TABLE_ROW + visits * miss * 2 * TABLE_ROW),
                   l2_bytes=chunks * warps * (TABLE_ROW + c.m * 4),
                   atomic_sectors=chunks * visits * TABLE_ROW / SECTOR,
                   chain=2 * machine.dram_latency + c.m * machine.shared_latency)
    in_flight = UNROLL if c.m <= 32 else 32
    step2 = Kernel(f"{name}: step 2 (rows summed)", blocks=blocks, threads=256, launches=chunks, registers=53,
                   instructions=chunks * (warps * 15 + visits * 8),
                   dram_bytes=chunks * (warps * (TABLE_ROW + c.m * 4) + visits * miss * TABLE_ROW),
                   l2_bytes=chunks * (warps * (2 * TABLE_ROW + c.m * 4) + visits * TABLE_ROW),
                   chain=2 * machine.dram_latency + math.ceil(c.m / in_flight) * machine.dram_latency)
    return [streaming(f"{name}: output zeroed", c.unit / 1, machine),
            streaming(f"{name}: tables cleared (cudaMemset)", chunks * table, machine, launches=chunks), step1, step2]


def weighted_cumulation(c: Module, machine: Machine, name: str) -> List[Kernel]:
    """lsh_weighted_cumulation_ver4 (∇Q or ∇K): a counting sort of one side's codes (atomic counts,
    a prefix sum per (sequence, hash), atomic placement, each token's offset and count per hash),
    then a block of 8 warps per token of the other side: it gathers its colliding tokens over every
    hash into a shared-memory set (atomicCAS with a modulo), then a warp per distinct colliding
    token computes the weight (a 64-wide dot product by shuffles) and atomically adds the weighted
    row into the output (2 × 128 bytes). The shared set is cleared twice per block (the loop ends on
    an empty second pass)."""
    visits = c.sequences * c.n * c.m
    counts = c.sequences * c.m * 2**c.tau * 4
    zeros = streaming(f"{name}: counts, order, offsets zeroed", counts + visits * 4 * 3 + c.unit, machine,
                      launches=4)
    scale = streaming(f"{name}: (τ/2)·k", 2 * c.unit, machine)
    per_thread = Kernel(f"{name}: counting sort (3 passes, offsets)", blocks=visits / 256, threads=256,
                        launches=3, registers=14, instructions=3 * visits / 32 * 20,
                        dram_bytes=3 * visits * 8 + 2 * counts, l2_bytes=3 * visits * 8 + visits * SECTOR,
                        atomic_sectors=2 * visits,
                        chain=3 * machine.dram_latency + machine.l2_latency)
    rows = 2**c.tau
    prefix = Kernel(f"{name}: counting sort (prefix sums)", blocks=c.sequences * c.m, threads=min(rows, 256),
                    registers=58, instructions=c.sequences * c.m * (rows / 32 * 30 + rows / 32 * 6),
                    dram_bytes=2 * counts, l2_bytes=2 * counts,
                    chain=2 * machine.dram_latency + (rows / 32) * 2 * machine.shared_latency
                    + rows / 256 * 6 * machine.shared_latency)
    per_hash = c.n / 2**c.tau  # colliding tokens per token and hash (Poisson)
    found = 1 - math.exp(-per_hash)  # the share of hashes whose bucket is not empty
    distinct = c.m * per_hash  # colliding tokens over all hashes (repeats are rare)
    rounds = math.ceil(c.m / 8)
    blocks = c.sequences * c.n
    per_block = 960 + c.m * (15 + found * 80) + distinct * 65
    shared = 15376 + (3 * HEAD_DIM) * 4
    gather = Kernel(f"{name}: gather and atomicAdd (ver4)", blocks=blocks, threads=256, registers=63,
                    shared_bytes=shared, instructions=blocks * per_block,
                    dram_bytes=blocks * (3 * HEAD_DIM * 4 * 2 + c.m * 4 * 3),
                    l2_bytes=blocks * (512 + c.m * found * SECTOR + distinct * 2 * TABLE_ROW),
                    atomic_sectors=blocks * distinct * 2 * TABLE_ROW / SECTOR,
                    chain=2 * machine.dram_latency + 200 + rounds * (machine.l2_latency + 18 * machine.shared_latency)
                    + rounds * (machine.l2_latency + 17 * machine.shared_latency) + 200)
    return [scale, zeros, per_thread, prefix, gather]


def linear(c: Module, name: str, count: int) -> Kernel:
    return gemm(name, c.tokens, DIM, DIM, launches=count)


def yoso_forward(c: Module, machine: Machine = RTX_2080_TI) -> List[Kernel]:
    return [linear(c, "Q, K, V projections", 3),
            streaming("heads split (3 copies)", 6 * c.unit, machine, 3),
            streaming("q, k normalized", 6 * c.unit, machine, 8), *fast_hash(c, machine),
            *cumulation(c, machine, "lsh_cumulation"), streaming("output normalized", 3 * c.unit, machine, 4),
            streaming("heads combined", 2 * c.unit, machine), linear(c, "output projection", 1)]


def yoso_backward(c: Module, machine: Machine = RTX_2080_TI) -> List[Kernel]:
    return [linear(c, "output projection backward (dX, dW)", 2),
            streaming("heads combined, backward", 2 * c.unit, machine),
            streaming("output normalization, backward", 5 * c.unit, machine, 6),
            *cumulation(c, machine, "∇V: lsh_cumulation"), *weighted_cumulation(c, machine, "∇Q"),
            *weighted_cumulation(c, machine, "∇K"),
            streaming("q, k normalization, backward", 10 * c.unit, machine, 12),
            streaming("heads split, backward; ∇X summed", 12 * c.unit, machine, 5),
            linear(c, "Q, K, V projections backward (dX, dW)", 6)]


def softmax_forward(c: Module, machine: Machine = RTX_2080_TI) -> List[Kernel]:
    """The authors' SoftmaxAttention: Q Kᵀ, scale, mask, softmax, dropout (training), · V; fp32."""
    scores = c.sequences * c.n * c.n * 4
    return [linear(c, "Q, K, V projections", 3),
            streaming("heads split (3 copies)", 6 * c.unit, machine, 3),
            gemm("Q Kᵀ", c.sequences * c.n, c.n, HEAD_DIM),
            streaming("scale, mask, softmax", 6 * scores, machine, 3),
            streaming("dropout (values and mask)", 2.25 * scores, machine),
            gemm("P V", c.sequences * c.n, HEAD_DIM, c.n),
            streaming("heads combined", 2 * c.unit, machine), linear(c, "output projection", 1)]


def softmax_backward(c: Module, machine: Machine = RTX_2080_TI) -> List[Kernel]:
    scores = c.sequences * c.n * c.n * 4
    return [linear(c, "output projection backward (dX, dW)", 2),
            streaming("heads combined, backward", 2 * c.unit, machine),
            gemm("P V backward (dP, dV)", c.sequences * c.n, c.n, HEAD_DIM, launches=2),
            streaming("dropout, softmax, scale backward", 9.25 * scores, machine, 4),
            gemm("Q Kᵀ backward (dQ, dK)", c.sequences * c.n, HEAD_DIM, c.n, launches=2),
            streaming("heads split, backward; ∇X summed", 12 * c.unit, machine, 5),
            linear(c, "Q, K, V projections backward (dX, dW)", 6)]
