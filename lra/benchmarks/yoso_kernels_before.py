"""The CUDA kernels of csrc/yoso before issue 44 (commit d04fab1), on paper: the deterministic sorted
path, the only one then. Each function follows its kernel's code (grid, ptxas's registers and stack
frame for sm_90, nvcc 13.0), the warp instructions per token, hash and colliding pair, the sectors it
moves, and the chain of dependent latencies of its slowest block (lra.benchmarks.gpu_model).
``loaded`` and ``stored`` are the bytes the threads load and store, counted the way the CPU emulation
counts them (tests/test_cuda_emulation.py checks them against it).

Chunks: the forward's tables are held for as many (sequence, hash) pairs as fit min(workspace, L2)
(``pairs_per_chunk``), the backward's for every table slot of every pair of a chunk, so a ListOps call
runs ~31 backward chunks of 32–64 blocks each on 132 SMs, their kernels one after another.
"""

from __future__ import annotations

import math
from typing import List

from lra.benchmarks.gpu_model import H100, SECTOR, Kernel, Machine
from lra.benchmarks.yoso_call import WARP, Call, dependent_latency, max_of_poisson, torch_sort

WORKSPACE_BYTES = 256 * 2**20  # attention.workspace_mb
ROWS_PER_BLOCK = 8  # gather/bucket kernels: a warp per sorted position or query
TOKEN_THREADS = 128  # gradient kernels: a thread per token
DIVISION = 22  # SASS instructions of a 32-bit integer division by a runtime value (with the remainder)


def pairs_per_chunk(c: Call, floats_per_pair: float, machine: Machine = H100) -> int:
    budget = min(WORKSPACE_BYTES, machine.l2_bytes) / 4
    return max(1, min(c.pairs, 65535, int(budget // max(floats_per_pair, 1))))


def chunk_batches(c: Call, chunk: int) -> float:
    """Sequences per chunk of pairs (a chunk may start and end inside a sequence's hashes)."""
    return min(c.B, chunk / c.m + 1) if chunk < c.pairs else c.B


def heavy_minimum(c: Call) -> int:
    return 2 * c.dv * c.d // (c.dv + 2 * c.d) + 1


def fast_hash(c: Call, machine: Machine = H100) -> Kernel:
    """A block per token of threads_for(P/2) threads; per product: the token times a diagonal, and
    three Walsh–Hadamard transforms in shared memory, a barrier per stage, half the lanes idle below
    64 coordinates, and an integer division per butterfly for its position; the bits of 16 code
    slots per thread checked after every product. For q and k (two launches)."""
    P, R = c.padded, c.products
    threads = min(256, max(32, (P // 2 + 31) // 32 * 32))
    warps, fill, butterflies = threads // WARP, math.ceil(P / threads), math.ceil(P / 2 / threads)
    per_product = warps * (3 * fill * 8 + 3 * int(math.log2(P)) * (butterflies * (DIVISION + 15) + 3) + 72)
    tokens = c.B * c.n
    diag = dependent_latency(machine, R * 3 * P * 4)
    chain = machine.dram_latency + R * (3 * (diag + 2 * machine.shared_latency)
                                        + 3 * int(math.log2(P)) * (DIVISION + 3 * machine.shared_latency + 10))
    return Kernel("fast_hash (q, k)", blocks=tokens, threads=threads, launches=2, registers=56,
                  shared_bytes=(P + c.d) * 4, instructions=2 * tokens * (R * per_product + warps * 30),
                  dram_bytes=2 * (tokens * 4 * (c.d + c.m) + c.B * R * 3 * P * 4),
                  l2_bytes=2 * tokens * (c.d * 4 + c.m * SECTOR), chain=chain,
                  loaded=2 * tokens * 4 * (c.d + 3 * P * R), stored=2 * tokens * 4 * c.m)


def bucket_rows(c: Call, machine: Machine = H100) -> Kernel:
    """A warp per sorted key position of a chunk's pairs (every lane reads the code and its
    predecessor); a bucket's first position sums w_j v_j into its row: per value coordinate the run's
    codes (and the one after), order, weight and value."""
    b = c.stats
    chunk = pairs_per_chunk(c, c.n * c.dv, machine)
    launches = math.ceil(c.pairs / chunk)
    slices = math.ceil(c.dv / WARP)
    longest = max_of_poisson(b.per_query, ROWS_PER_BLOCK)
    element = machine.l2_latency + 2 * machine.l1_latency
    return Kernel("bucket_rows", blocks=math.ceil(c.n / ROWS_PER_BLOCK) * chunk, threads=WARP * ROWS_PER_BLOCK,
                  launches=launches, registers=40,
                  instructions=c.pairs * (c.n * 20 + b.distinct * slices * (c.run * 12 + 8)),
                  dram_bytes=c.pairs * c.n * 8 + c.B * c.n * 4 * (c.dv + 1),
                  l2_bytes=c.pairs * (c.n * 2 * SECTOR + b.distinct * slices * (c.run * (3 * SECTOR + 128) + 128)),
                  chain=machine.l2_latency + (longest + 1) * slices * element,
                  loaded=c.pairs * 4 * (WARP * (2 * c.n - 1) + c.dv * (4 * c.n + b.distinct - 1)),
                  stored=c.pairs * 4 * b.distinct * c.dv)


def gather_rows(c: Call, machine: Machine = H100) -> Kernel:
    """A warp per query and sequence of a chunk: its lanes search 32 hashes at once (a lane per hash:
    the code, a binary search, the check of the position), then for each hash whose bucket holds a
    key the warp reads the weight and the row, one hash after another (a branch on the weight sits
    between the two loads); the output row is read and written once per chunk."""
    b = c.stats
    chunk = pairs_per_chunk(c, c.n * c.dv, machine)
    launches = math.ceil(c.pairs / chunk)
    batches = chunk_batches(c, chunk)
    visits = c.B * c.n * launches * batches / c.B  # (query, chunk) pairs: a sequence straddling two chunks twice
    groups = math.ceil(min(chunk, c.m) / WARP)
    per_group = 20 + c.search * 6 + min(c.m, WARP) * (5 + b.hit * 45)
    search = dependent_latency(machine, c.n * 4)
    rows = machine.shared_latency + machine.l1_latency + 10 + machine.l2_latency + 10
    chain = groups * (machine.dram_latency + c.search * (search + machine.l2_latency) / 2 + machine.l2_latency
                      + 2 * machine.shared_latency + min(c.m, WARP) * (b.hit * rows + (1 - b.hit) * 35))
    return Kernel("gather_rows", blocks=math.ceil(c.n / ROWS_PER_BLOCK) * batches, threads=WARP * ROWS_PER_BLOCK,
                  launches=launches, registers=32, shared_bytes=ROWS_PER_BLOCK * WARP * 4,
                  instructions=visits * (per_group * math.ceil(c.m / WARP) + 40),
                  dram_bytes=c.pairs * c.n * 4 + visits * 8 * c.dv,
                  l2_bytes=c.pairs * c.n * (SECTOR * (1 + c.search / 2) + b.hit * (SECTOR + 4 * c.dv)),
                  chain=chain,
                  loaded=c.pairs * c.n * 4 * (2 + c.search + b.hit * (WARP + c.dv)) + visits * 4 * c.dv,
                  stored=visits * 4 * c.dv)


def backward_chunk(c: Call, machine: Machine = H100) -> int:
    minimum = heavy_minimum(c)
    slots = math.ceil(c.n / minimum)
    return pairs_per_chunk(c, slots * c.dv * c.d + slots * c.dv * (c.d + 1), machine)


def heavy_tables(c: Call, machine: Machine = H100) -> Kernel:
    """key_tables and query_tables: a block of 32 threads per table slot of every pair of a chunk;
    one thread walks the slot's window of sorted positions, and for every bucket that starts there
    finds its runs on both sides (four binary searches), one dependent load after another. With
    uniform codes no bucket is heavy and no table is filled."""
    b = c.stats
    minimum = heavy_minimum(c)
    slots = math.ceil(c.n / minimum)
    chunk = backward_chunk(c, machine)
    launches = 2 * math.ceil(c.pairs / chunk)
    starts = minimum * b.distinct / c.n
    loads = 2 * minimum + starts * 4 * c.search
    blocks = 2 * c.pairs * slots
    return Kernel("key/query tables (heavy runs found)", blocks=slots * chunk, threads=WARP, launches=launches,
                  registers=34, shared_bytes=8, instructions=blocks * (loads * 6 + starts * 10 + 10),
                  dram_bytes=2 * c.pairs * c.n * 4, l2_bytes=blocks * loads * SECTOR * 0.1,
                  chain=loads * dependent_latency(machine, c.n * 4) + 2 * machine.shared_latency,
                  loaded=2 * c.pairs * 4 * (2 * c.n + 4 * b.distinct * c.search), stored=0)


def token_gradients(c: Call, side: str, machine: Machine = H100) -> Kernel:
    """query_gradients or key_gradients: a thread per token and sequence of a chunk; per hash its code
    and its run on the other side (and on its own side where that is not empty), then per colliding
    token its order, (weight,) and its rows (dv, d), the token's own rows and sums in a local-memory
    stack (2–3 KB, ptxas), so every coordinate is a load and a store (L1 hits while the rows a warp
    touches fit, else L2); a warp runs as long as its
    busiest lane. ∇Q (side 'query') or ∇K and ∇V ('key') read and written once."""
    b = c.stats
    key = side == "key"
    own = c.d + c.dv if key else c.d
    chunk = backward_chunk(c, machine)
    launches = math.ceil(c.pairs / chunk)
    batches = chunk_batches(c, chunk)
    touched = 4 * ((2 * c.dv + c.d) if key else (c.dv + c.d))  # of a 2–3 KB stack frame
    registers = 54 if key else 40
    per_pair = 10 + c.dv * (7 if key else 4) + c.d * 5
    per_hash = 6 + 2 * c.search * 6 + b.hit * (2 * c.search * 6 + 10) + c.lane_max * per_pair
    warps = c.B * c.n / WARP
    resident = min(machine.max_threads_per_sm // TOKEN_THREADS, machine.registers_per_sm // (registers * TOKEN_THREADS))
    blocks = math.ceil(c.n / TOKEN_THREADS) * batches
    per_sm = max(1.0, min(resident, blocks / machine.sms))
    in_l1 = touched * TOKEN_THREADS * per_sm <= 192 * 1024
    local = machine.l1_latency if in_l1 else machine.l2_latency
    search = dependent_latency(machine, c.n * 4)
    pair_chain = 2 * machine.l2_latency + (c.dv / 4 + c.d / 4) * (local + 10) + machine.l2_latency + c.dv * 4
    chain = c.m * (machine.l2_latency + 2 * c.search * search + b.hit * 2 * c.search * search
                   + c.lane_max * pair_chain)
    spill = 0 if in_l1 else c.dv * 4 + c.d * 8 + (c.dv * 8 if key else 0)
    collisions = c.pairs * c.n * b.per_query
    loaded_per_hash = 1 + 2 * c.search + b.hit * 2 * c.search + b.per_query * ((1 if key else 2) + c.dv + c.d)
    return Kernel(f"{side}_gradients", blocks=blocks, threads=TOKEN_THREADS, launches=launches, registers=registers,
                  instructions=warps * (c.m * per_hash + 8 * own),
                  dram_bytes=c.B * c.n * 4 * (c.d + c.dv + 2 * own) + c.pairs * c.n * 12,
                  l2_bytes=collisions * (spill + 4 * (c.dv + c.d) + 2 * SECTOR), chain=chain,
                  loaded=c.pairs * c.n * 4 * loaded_per_hash + c.B * c.n * 4 * (c.dv + own + (1 if key else 0)),
                  stored=c.B * c.n * 4 * own)


def forward(c: Call, machine: Machine = H100) -> List[Kernel]:
    return [fast_hash(c, machine), *torch_sort(c, 1, machine), bucket_rows(c, machine), gather_rows(c, machine)]


def backward(c: Call, machine: Machine = H100) -> List[Kernel]:
    """The default backward (exact pair weights), its own sorts of both sides' codes."""
    return [*torch_sort(c, 2, machine), heavy_tables(c, machine), token_gradients(c, "query", machine),
            token_gradients(c, "key", machine)]
