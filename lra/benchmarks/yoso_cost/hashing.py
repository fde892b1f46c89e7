"""The hash kernel of csrc/yoso (yoso_cuda_hash.cu) on paper, as :mod:`lra.benchmarks.yoso_cost.gpu` counts it:
Hadamard products of each token's padded vector (P coordinates) held by P/S lanes of S coordinates each, the
transform's stages in registers and warp shuffles; registers from ptxas (nvcc 13.0, sm_90, no stack frame)."""

from __future__ import annotations

import math

from lra.benchmarks.yoso_cost.call import Call, dependent_latency
from lra.benchmarks.yoso_cost.gpu import H100, WARP, Kernel, Machine


HASH_REGISTERS = {1: 25, 2: 32, 4: 32, 8: 53, 16: 79, 32: 128, 64: 255, 128: 168}  # ptxas sm_90, by S


def hash_coordinates(c: Call) -> int:
    """Coordinates a lane holds (S) as launch_fast_hash chooses them (the measured kernels: 4 up to P = 128)."""
    P, (small, most) = c.padded, (4, 128) if c.measured_kernels else (32, 1024)
    return P if P <= small else small if P <= most else P // WARP


def fast_hash(c: Call, machine: Machine = H100) -> Kernel:
    """A block of min(128, 4,096 / S) threads, P / S lanes a token; per product three rounds of a diagonal (S
    loads from L1) and a transform: log2 S stages in registers, log2(P/S) by shuffles; the bits in registers;
    a group's codes staged in shared memory and stored side by side. For q and k (two launches)."""
    P, R = c.padded, c.products
    S = hash_coordinates(c)
    lanes = P // S
    threads = min(128, 4096 // S)
    tokens_per_block = threads // lanes
    shuffles, in_lane = int(math.log2(lanes)), int(math.log2(S))
    per_product = 3 * (2 * S + in_lane * S + shuffles * (4 * S + 2)) + 3 * S + 4  # per lane = per warp
    groups = math.ceil(R / c.bits)
    tokens = c.B * c.n
    warps = tokens * lanes / WARP
    blocks = c.B * math.ceil(c.n / tokens_per_block)
    diag = dependent_latency(machine, R * 3 * P * 4)
    chain = machine.dram_latency + R * 3 * (diag + in_lane * 4 + shuffles * (machine.shared_latency + 8)) \
        + groups * (2 * machine.shared_latency + machine.l2_latency)
    held = blocks * tokens_per_block  # a block's tokens past n load the diagonals too
    return Kernel("fast_hash (q, k)", blocks=blocks, threads=threads, launches=2, registers=HASH_REGISTERS[S],
                  shared_bytes=P * tokens_per_block * 4,
                  instructions=2 * warps * (R * per_product + 20 + groups * (S + 12)),
                  dram_bytes=2 * (tokens * 4 * (c.d + c.m) + c.B * R * 3 * P * 4),
                  l2_bytes=2 * tokens * 4 * (c.d + c.m), chain=chain,
                  loaded=2 * 4 * (tokens * c.d + held * 3 * P * R), stored=2 * tokens * 4 * c.m)
