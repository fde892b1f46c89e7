"""The CUDA kernels of csrc/yoso after issue 44, on paper: the deterministic sorted path and the atomic
path (the YOSO authors' design: atomicAdd into per-hash tables), as lra.benchmarks.gpu_model counts
them. What changed from lra.benchmarks.yoso_kernels_before:

- hashing: a warp per token, the Walsh–Hadamard stages by warp shuffles (and in registers above 32
  coordinates), positions by shifts and masks, the bits kept in registers; 8 tokens per block;
- chunks of a fixed size (``CHUNK_BYTES`` of tables), not the L2's, so results do not depend on the GPU;
- the backward in one pass: a thread per sorted position finds the heavy runs (a bucket's first
  position searches its run on both sides), tables only for those, and each gradient kernel runs
  once over every pair, its token's rows and sums in registers (templated on head dim);
- the atomic path's forward: per chunk the tables [pairs, 2^τ, dv] cleared, a warp per key adds its
  value row into its bucket's row under each hash with atomicAdd (a 128-byte line per warp), a warp
  per query sums its rows; no sort of the keys. Its backward is the same single-writer gradient
  kernels (pair weights cannot be tabled without dv × d tables per bucket).
"""

from __future__ import annotations

import math
from typing import List

from lra.benchmarks import yoso_kernels_before as before
from lra.benchmarks.gpu_model import H100, SECTOR, Kernel, Machine
from lra.benchmarks.yoso_call import WARP, Call, dependent_latency, torch_sort

CHUNK_BYTES = 32 * 2**20  # tables per chunk of (sequence, hash) pairs, whatever the GPU
TOKENS_PER_BLOCK = 8
TOKEN_THREADS = 128


def chunk_pairs(c: Call, floats_per_pair: float) -> int:
    return max(1, min(c.pairs, 65535, int(CHUNK_BYTES / 4 // max(floats_per_pair, 1))))


def fast_hash(c: Call, machine: Machine = H100) -> Kernel:
    """A warp per token: each lane holds P/32 coordinates (or a token per 32/P lanes below 32); per
    product three diagonal products (L1 hits), log2 min(P, 32) shuffle stages and log2(P/32) stages in
    registers per transform, a bit per code in registers. For q and k (two launches)."""
    P, R = c.padded, c.products
    per_lane = max(1, P // WARP)
    lanes_per_token = min(P, WARP)
    shuffle_stages, register_stages = int(math.log2(lanes_per_token)), int(math.log2(per_lane))
    transform = shuffle_stages * per_lane * 4 + register_stages * per_lane * 2
    per_product = 3 * (per_lane * 2 + transform) + per_lane * 3 + 4
    tokens = c.B * c.n
    warps = tokens * lanes_per_token / WARP
    diag = dependent_latency(machine, R * 3 * P * 4)
    chain = machine.dram_latency + R * 3 * (diag + shuffle_stages * (machine.shared_latency + 4) + register_stages * 4)
    return Kernel("fast_hash (q, k)", blocks=warps / TOKENS_PER_BLOCK, threads=WARP * TOKENS_PER_BLOCK, launches=2,
                  registers=48, instructions=2 * warps * (R * per_product + 20 + c.m / WARP * 4),
                  dram_bytes=2 * (tokens * 4 * (c.d + c.m) + c.B * R * 3 * P * 4),
                  l2_bytes=2 * tokens * 4 * (c.d + c.m), chain=chain,
                  loaded=2 * tokens * 4 * c.d + 2 * warps * R * 3 * P * 4 / (WARP // lanes_per_token),
                  stored=2 * tokens * 4 * c.m)


def sorted_forward(c: Call, machine: Machine = H100) -> List[Kernel]:
    """The sorted path's forward: the kernels of before, in chunks of CHUNK_BYTES of tables."""
    chunk = chunk_pairs(c, c.n * c.dv)
    rows, gather = before.bucket_rows(c, machine), before.gather_rows(c, machine)
    launches = math.ceil(c.pairs / chunk)
    batches = before.chunk_batches(c, chunk)
    rows = Kernel(rows.name, blocks=math.ceil(c.n / 8) * chunk, threads=rows.threads, launches=launches,
                  registers=rows.registers, instructions=rows.instructions, dram_bytes=rows.dram_bytes,
                  l2_bytes=rows.l2_bytes, chain=rows.chain, loaded=rows.loaded, stored=rows.stored)
    visits = c.n * launches * batches
    gather = Kernel(gather.name, blocks=math.ceil(c.n / 8) * batches, threads=gather.threads, launches=launches,
                    registers=gather.registers, shared_bytes=gather.shared_bytes, instructions=gather.instructions,
                    dram_bytes=c.pairs * c.n * 4 + visits * 8 * c.dv, l2_bytes=gather.l2_bytes, chain=gather.chain,
                    loaded=gather.loaded, stored=visits * 4 * c.dv)
    return [fast_hash(c, machine), *torch_sort(c, 1, machine), rows, gather]


def atomic_forward(c: Call, machine: Machine = H100) -> List[Kernel]:
    """The atomic path's forward: per chunk, tables cleared, atomicAdd of value rows, rows gathered."""
    floats = 2**c.bits * c.dv
    chunk = chunk_pairs(c, floats)
    launches = math.ceil(c.pairs / chunk)
    batches = before.chunk_batches(c, chunk)
    slices = math.ceil(c.dv / WARP)
    table_bytes = c.pairs * floats * 4
    visits = c.pairs * c.n  # (token, hash)
    warps = c.n * launches * batches  # (token, chunk): a warp visits its sequence's hashes in the chunk
    hashes = min(chunk, c.m)
    clear = Kernel("atomic: tables cleared", blocks=chunk * floats / 1024, threads=256, launches=launches,
                   instructions=table_bytes / 16 / WARP * 2, l2_bytes=table_bytes, chain=machine.l2_latency)
    scatter = Kernel("atomic: values added into tables", blocks=math.ceil(c.n / TOKENS_PER_BLOCK) * batches,
                     threads=WARP * TOKENS_PER_BLOCK, launches=launches, registers=32,
                     instructions=warps * 20 + visits * slices * 8,
                     dram_bytes=c.pairs * c.n * 4 + c.B * c.n * 4 * (c.dv + 1),
                     l2_bytes=warps * (c.dv * 4 + hashes * 4) + visits * slices * 2 * 128,
                     chain=machine.dram_latency + hashes * machine.shared_latency,
                     loaded=warps * (c.dv + hashes + 1) * 4, stored=visits * c.dv * 4)
    in_flight = 4
    gather = Kernel("atomic: rows gathered", blocks=math.ceil(c.n / TOKENS_PER_BLOCK) * batches,
                    threads=WARP * TOKENS_PER_BLOCK, launches=launches, registers=40,
                    instructions=warps * 30 + visits * slices * 8,
                    dram_bytes=c.pairs * c.n * 4 + warps * 8 * c.dv,
                    l2_bytes=warps * (hashes * 4 + 2 * c.dv * 4) + visits * slices * 128,
                    chain=machine.dram_latency + math.ceil(hashes / in_flight) * machine.l2_latency
                    + machine.l2_latency,
                    loaded=warps * (hashes + c.dv) * 4 + visits * c.dv * 4, stored=warps * c.dv * 4)
    return [fast_hash(c, machine), clear, scatter, gather]


def heavy_runs(c: Call, machine: Machine = H100) -> Kernel:
    """A thread per sorted position of both sides: a bucket's first position (where the code changes)
    finds its run's end and the other side's run (three binary searches) and counts it if heavy. A
    warp's lanes search one pair's sorted codes (L1-resident) for neighbouring codes, so most of their
    loads share sectors: a twentieth of them reach L2."""
    b = c.stats
    positions = 2 * c.pairs * c.n
    starts = 2 * c.pairs * b.distinct
    search = dependent_latency(machine, c.n * 4)
    return Kernel("heavy runs counted (both sides)", blocks=positions / 256, threads=256, registers=32,
                  instructions=positions / WARP * 12 + starts / WARP * 3 * c.search * 6 * 2,
                  dram_bytes=positions * 4, l2_bytes=positions * 4 + starts * 3 * c.search * SECTOR * 0.05,
                  chain=machine.l2_latency + 3 * c.search * search,
                  loaded=positions * 8 + starts * 3 * c.search * 4, stored=0)


def token_gradients(c: Call, side: str, machine: Machine = H100) -> Kernel:
    """query_gradients or key_gradients in one launch over every pair: a thread per token and sequence
    visits its m hashes; its rows and sums in registers (templated on head dim: no stack frame), so a
    colliding token costs its loads and two FMAs per coordinate. ∇Q, or ∇K and ∇V, written once."""
    b = c.stats
    key = side == "key"
    own = c.d + c.dv if key else c.d
    registers = min(255, 32 + c.d + (2 * c.dv if key else c.dv))
    per_pair = 10 + 2 * c.dv + 2 * c.d + (c.dv if key else 0)
    per_hash = 6 + 2 * c.search * 6 + b.hit * (2 * c.search * 6 + 10) + c.lane_max * per_pair
    warps = c.B * c.n / WARP
    search = dependent_latency(machine, c.n * 4)
    pair_chain = 3 * machine.l2_latency + c.dv * 4
    chain = c.m * (machine.l2_latency + 2 * c.search * search + b.hit * 2 * c.search * search
                   + c.lane_max * pair_chain)
    collisions = c.pairs * c.n * b.per_query
    loaded_per_hash = 1 + 2 * c.search + b.hit * 2 * c.search + b.per_query * ((1 if key else 2) + c.dv + c.d)
    return Kernel(f"{side}_gradients", blocks=math.ceil(c.n / TOKEN_THREADS) * c.B, threads=TOKEN_THREADS,
                  registers=registers, instructions=warps * (c.m * per_hash + 8 * own),
                  dram_bytes=c.B * c.n * 4 * (c.d + c.dv + own) + c.pairs * c.n * 12,
                  l2_bytes=collisions * (4 * (c.dv + c.d) + 2 * SECTOR) + c.pairs * c.n * 12, chain=chain,
                  loaded=c.pairs * c.n * 4 * loaded_per_hash + c.B * c.n * 4 * (c.dv + own + (1 if key else 0)),
                  stored=c.B * c.n * 4 * own)


def backward(c: Call, machine: Machine = H100) -> List[Kernel]:
    """The default backward (exact pair weights), both paths: its sorts, the heavy runs, two kernels."""
    return [*torch_sort(c, 2, machine), heavy_runs(c, machine), token_gradients(c, "query", machine),
            token_gradients(c, "key", machine)]


def forward(c: Call, atomic: bool, machine: Machine = H100) -> List[Kernel]:
    return atomic_forward(c, machine) if atomic else sorted_forward(c, machine)
