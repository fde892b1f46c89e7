"""The CUDA kernels of csrc/yoso on paper, as :mod:`lra.benchmarks.yoso_cost.gpu` counts them: the
deterministic sorted path (when torch's deterministic algorithms are on, the trainer's default) and the
atomic path (the YOSO authors' design, atomicAdd into shared rows). Read from the code (yoso_cuda_hash.cu,
yoso_cuda_kernels.cu, yoso_cuda_heavy.cu, yoso_cuda_gradients.cu, yoso_cuda_sort.cu, yoso_cuda_host.cpp);
registers from ptxas (nvcc 13.0, sm_90, no stack frame; csrc/yoso at a63867c, the counting sort since):

- sorting: each pair's codes by a counting sort in one block, the run starts with it, where its 2^τ
  counters fit 48 KB of shared memory (τ ≤ 13), or, with no more codes than twice the pair's tokens, a
  block's largest opt-in (τ ≤ 15 on an H100); else, and in the kernels the committed H100 measurements
  ran, torch's sort (:mod:`.ops`) and a run-starts kernel;
- hashing (:mod:`.hashing`): a token's padded vector held by P/S lanes, the transform's stages in
  registers and warp shuffles, positions by shifts and masks;
- chunks of a fixed budget (attention.workspace_mb, not the L2's): the same on every GPU; a chunk's
  tables may outgrow L2, and then their rows go through DRAM;
- the sorted cumulation: a team of dv/8 lanes (a warp for other value dims, and in the measured kernels)
  per sorted key position, a bucket's first position summing its weighted values into its row; a team of
  dv/4 lanes per query gathering its rows one hash after another;
- the atomic cumulation: rows indexed by code (2^τ ≤ 2n: no sort), cleared per chunk, a warp per
  (key, hash) adds its value row with atomicAdd, the gather reads a query's rows without searching;
  where a pair's table fits shared memory in at most 128 slices of the codes (τ ≤ 15 with one channel;
  16 slices, τ ≤ 12, in the measured kernels), two kernels instead: the tokens listed by slice, then the
  tables in shared memory, the output by atomics;
- the backward in one pass (a token finds its bucket by one load from each pair's run starts by code
  where 2^τ ≤ 2n, else by a binary search): heavy runs flagged by a thread per sorted key position,
  numbered by a prefix sum (torch's cumsum), tables only for them; then, deterministic, one launch per
  gradient over every pair, a team of d/8 lanes per token (its rows in registers, two float4 loads a row)
  visiting its m hashes, a run's further tokens read a chunk of positions at a time; or, atomic, a team
  per (hash, query) adding each colliding pair's share into ∇K, ∇V and its sum into ∇Q with atomicAdd:
  from sm_90 on one float4 atomic per lane (a 128-byte row, 4 sector updates), before sm_90 four 4-byte
  ones (the same row, 16 sector updates).

``loaded``, ``stored`` and ``added`` count the bytes the threads load, store and add atomically, as the
CPU emulation counts them (every lane of a team loads the code and walks the binary search itself).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

from lra.benchmarks.yoso_cost.call import Call, dependent_latency, max_of_poisson, most_on_one
from lra.benchmarks.yoso_cost.gpu import H100, SECTOR, WARP, Kernel, Machine, l2_resident, streaming

WORKSPACE_BYTES = 256 * 2**20  # attention.workspace_mb: tables per chunk of (sequence, hash) pairs
ROWS_PER_BLOCK = 8
GRADIENT_THREADS = 128


def heavy_minimum(c: Call) -> int:
    """The fewest tokens one side of a heavy bucket can have (yoso_math.h's heavy_side_minimum): a bucket
    is heavy where a table costs less than visiting its pairs, which takes keys·(dv + 2d) > 2·dv·d."""
    return 2 * c.dv * c.d // (c.dv + 2 * c.d) + 1


def chunk_batches(c: Call, chunk: int) -> float:
    """Sequences per chunk of pairs (a chunk may start and end inside a sequence's hashes)."""
    return min(c.B, chunk / c.m + 1) if chunk < c.pairs else c.B


def instance_lanes(d: int, dv: int, coords: int = 4) -> int:
    """Lanes of a team of ``coords`` coordinates a lane (yoso_cuda_common.h's Team<D, C> of the instance, rows
    aligned): D/C where d = dv = D, one of the templated dims 16 … 128, else a warp (the generic team)."""
    return d // coords if d == dv and d in (16, 32, 64, 128) else WARP


def team_lanes(c: Call) -> int:
    """Lanes per token in the atomic gradient kernel: d/4 for the templated head dims, else a warp."""
    return instance_lanes(c.d, c.dv)


CHAINED_COORDS = 8  # yoso_cuda_common.h's kChainedCoords: coordinates a lane in the chain-bound kernels' teams


def token_lanes(d: int, dv: int) -> int:
    """Lanes per token in the kernels bound by chains of dependent loads (bucket_rows, query_gradients,
    key_gradients): d/8 for the templated head dims (two float4 loads a row), else a warp."""
    return instance_lanes(d, dv, CHAINED_COORDS)


def token_gradient_registers(key: bool) -> int:
    """ptxas's registers (nvcc 13.0, sm_90, no spill) of query_gradients (capped for 8 blocks of 128 threads an
    SM: kQueryGradientBlocks) and key_gradients (unbounded) with 8 coordinates a lane."""
    return 72 if key else 64


def cumulation_plan(c: Call, atomic: bool) -> Tuple[bool, int, int]:
    """(direct rows, rows per pair, pairs per chunk) as yoso_cuda_host.cpp chooses them."""
    direct = atomic and indexed_by_code(c)
    rows = 2**c.bits if direct else c.n
    chunk = max(1, min(WORKSPACE_BYTES // 4 // (rows * c.dv), c.pairs, 65535))
    return direct, rows, chunk


def _row_miss(c: Call, rows: int, chunk: int, machine: Machine) -> float:
    """The share of a chunk's table rows that are not in L2 when read again (tables past ~80 % of L2)."""
    table = chunk * rows * c.dv * 4
    return max(0.0, 1.0 - 0.8 * machine.l2_bytes / table)


TABLE_BYTES = 48 * 1024  # yoso_cuda_kernels.h's kTableBytes: a block's shared memory without opting in
TABLE_WARPS = 8
TABLE_BATCH = 8  # listed tokens a warp loads for at once
LIST_THREADS = 256
MOST_SLICES = 128  # yoso_cuda_kernels.cu's kMostSlices (16 in the kernels the committed H100 traces ran)


def table_rows(tau: int, p: int = 1, most_slices: Optional[int] = None) -> int:
    """Codes a slice of the shared-memory table holds, as yoso_cuda_kernels.cu's table_rows: the largest
    power of two within TABLE_BYTES, or 0 when a pair would need more than ``most_slices`` slices (the
    kernels' :data:`MOST_SLICES`, or a call's own: :attr:`Call.most_slices`)."""
    rows = 2**tau
    while rows > 1 and rows * p * WARP * 4 > TABLE_BYTES:
        rows //= 2
    return rows if rows * p * WARP * 4 <= TABLE_BYTES and 2**tau // rows <= (most_slices or MOST_SLICES) else 0


def slice_lists(c: Call, machine: Machine = H100) -> Kernel:
    """Atomic, before the shared-memory tables: a block per (pair, side) counts its tokens per slice of
    the codes (shared atomics), one thread scans the counts, then every token is listed with its row:
    each code read twice, a token and a row stored per token, the starts per pair. A warp's atomic on
    the counters (each pass) takes as many rounds as the most of its 32 tokens in one slice."""
    slices = 2**c.bits // table_rows(c.bits, most_slices=c.most_slices)
    tokens = 2 * c.pairs * c.n
    return Kernel("atomic: tokens listed by slice", blocks=2 * c.pairs, threads=LIST_THREADS, registers=32,
                  shared_bytes=2 * slices * 4, instructions=tokens / WARP * 2 * 12 + 2 * c.pairs * slices * 6,
                  shared_rounds=2 * math.ceil(tokens / WARP) * most_on_one(WARP, slices),
                  dram_bytes=tokens * 4 + tokens * 8, l2_bytes=tokens * 8 + tokens * 8,
                  chain=2 * machine.l2_latency + slices * machine.shared_latency + machine.l2_latency,
                  loaded=tokens * 8, stored=tokens * 8 + 2 * c.pairs * (slices + 1) * 4)


def table_cumulation(c: Call, machine: Machine = H100) -> Kernel:
    """Atomic, the table in shared memory (one channel): a block per (pair, slice of the codes, 32 value
    columns) clears its rows, its listed keys add their values with shared atomics (a CAS loop on sm_90),
    then each listed query adds its row into the output with one global atomic a coordinate: every lane
    loads a listed token, its row and weight; a key's value row is loaded by the lanes of its columns."""
    rows = table_rows(c.bits, most_slices=c.most_slices)
    slices, tiles = 2**c.bits // rows, math.ceil(c.dv / WARP)
    blocks = c.pairs * slices * tiles
    listed = c.pairs * c.n * tiles  # per side
    out_sectors = c.pairs * c.n * math.ceil(c.dv * 4 / SECTOR)
    rounds = math.ceil(c.n / slices / (TABLE_WARPS * TABLE_BATCH))
    threads = WARP * TABLE_WARPS
    return Kernel("atomic: tables in shared memory", blocks=blocks, threads=threads, registers=56,
                  shared_bytes=rows * WARP * 4, shared_rounds=listed,  # a key's row: 32 lanes, 32 addresses
                  instructions=listed * 2 * 12 + blocks * (rows * WARP / threads + 20) * TABLE_WARPS,
                  dram_bytes=c.B * c.n * (c.dv * c.row_bytes + 8) + c.B * c.n * c.dv * 4 * 2,
                  l2_bytes=listed * 2 * 3 * SECTOR / TABLE_BATCH + c.pairs * c.n * c.dv * c.row_bytes
                  + out_sectors * SECTOR * 2,
                  atomic_sectors=out_sectors,
                  chain=2 * rounds * (2 * machine.l2_latency + 4 * machine.shared_latency),
                  loaded=blocks * threads * 2 * 2 * 4 + listed * 2 * WARP * 12 + c.pairs * c.n * c.dv * c.row_bytes,
                  stored=0,
                  added=c.pairs * c.n * c.dv * 4)


def row_lanes(c: Call) -> int:
    """Lanes of gather_rows' team per query (yoso_cuda_kernels.cu): dv/4 for the templated value dims, else a
    warp; a warp in the measured kernels."""
    return WARP if c.measured_kernels else instance_lanes(c.dv, c.dv)


def bucket_rows(c: Call, machine: Machine = H100) -> Kernel:
    """Deterministic: a team of :func:`token_lanes` per sorted key position of a chunk's pairs (every lane reads
    the code and its predecessor); a bucket's first position sums w_j v_j into its row in registers: per key of
    the run its code (and the one after), order and weight (every lane) and value row (two float4 a lane). Its rows go
    through DRAM where the chunk's tables outgrow L2; the longest run of a block's 128/L teams sets its chain."""
    if c.measured_kernels:
        from lra.benchmarks.yoso_cost import measured_kernels  # they import this module's helpers

        return measured_kernels.bucket_rows(c, machine)
    b, lanes = c.stats, token_lanes(c.dv, c.dv)
    _, rows, chunk = cumulation_plan(c, False)
    longest = max_of_poisson(b.per_query, GRADIENT_THREADS // lanes)
    written = c.pairs * b.distinct * c.dv * 4
    return Kernel("bucket_rows", blocks=math.ceil(c.n * lanes / GRADIENT_THREADS) * chunk, threads=GRADIENT_THREADS,
                  launches=math.ceil(c.pairs / chunk), registers=32,
                  instructions=c.pairs * lanes / WARP * (c.n * 20 + b.distinct * (c.run * 16 + 8)),
                  dram_bytes=c.pairs * c.n * 8 + c.B * c.n * (c.row_bytes * c.dv + 4)
                  + written * _row_miss(c, rows, chunk, machine),
                  l2_bytes=c.pairs * (c.n * lanes / WARP * 2 * SECTOR
                                      + b.distinct * (c.run * (3 * SECTOR + c.dv * c.row_bytes) + c.dv * 4)),
                  chain=machine.l2_latency + (longest + 1) * (machine.l2_latency + 2 * machine.l1_latency),
                  loaded=c.pairs * (4 * (lanes * (2 * c.n - 1) + lanes * (3 * c.n + b.distinct - 1))
                                    + c.row_bytes * c.dv * c.n),
                  stored=written)


def rows_cleared(c: Call, machine: Machine = H100) -> Kernel:
    """Atomic: each chunk's rows zeroed (the caller's fill) before the keys add into them."""
    _, rows, chunk = cumulation_plan(c, True)
    launches = math.ceil(c.pairs / chunk)
    table = c.pairs * rows * c.dv * 4
    clear = streaming("atomic: rows cleared", table, machine, loads=0)
    return Kernel(clear.name, blocks=clear.blocks / launches, threads=256, launches=launches,
                  instructions=clear.instructions, dram_bytes=table * _row_miss(c, rows, chunk, machine),
                  l2_bytes=table, chain=clear.chain)


def scatter_rows(c: Call, machine: Machine = H100) -> Kernel:
    """Atomic: a warp per (key, hash): its code (every lane), its row (by code, or a binary search in
    the sorted codes), its weight (every lane), its value row added with atomicAdd (4 sectors per 32
    coordinates)."""
    direct, rows, chunk = cumulation_plan(c, True)
    warps = c.pairs * c.n
    search = 0 if direct else c.search
    slices = math.ceil(c.dv / WARP)
    miss = _row_miss(c, rows, chunk, machine)
    sectors = warps * slices * 4
    return Kernel("atomic: values added into rows", blocks=math.ceil(c.n / ROWS_PER_BLOCK) * chunk,
                  threads=WARP * ROWS_PER_BLOCK, launches=math.ceil(c.pairs / chunk), registers=40,
                  instructions=warps * (20 + search * 7 + slices * 6),
                  dram_bytes=c.pairs * c.n * 4 + c.B * c.n * (c.row_bytes * c.dv + 4) + sectors * SECTOR * 2 * miss,
                  l2_bytes=warps * (3 * SECTOR + c.dv * c.row_bytes), atomic_sectors=sectors,
                  chain=machine.l2_latency * 3 + search * dependent_latency(machine, c.n * 4),
                  loaded=warps * (4 * WARP * (2 + search) + c.row_bytes * c.dv), stored=0, added=warps * c.dv * 4)


def gather_rows(c: Call, atomic: bool = False, machine: Machine = H100) -> Kernel:
    """A team per query and sequence of a chunk (48 registers): its lanes find the query's rows for as many
    hashes at once (direct: the code; else from the run starts, or a binary search where 2^τ > 2n), shuffled
    to the team one after another; the team reads each found row (a float4 a lane) after its weight (every
    lane); the output row is read and written once per chunk. More teams in flight than a warp per query,
    a longer chain: a group's codes found per L hashes instead of 32. The measured kernels took a warp per
    query (56 registers), its rows found 32 hashes at a time through shared memory and a barrier."""
    b, lanes, warp = c.stats, row_lanes(c), c.measured_kernels
    direct, rows, chunk = cumulation_plan(c, atomic)
    launches = math.ceil(c.pairs / chunk)
    batches = chunk_batches(c, chunk)
    visits = c.n * launches * batches
    hit = 1.0 if direct else b.hit
    search = 0.0 if direct else run_loads(c) - 1  # a binary search's loads, or none from the run starts
    finds = 1 if direct else 1 + run_loads(c)
    per_group = 20 + search * 6 + min(c.m, lanes) * (5 + hit * (45 if warp else 20))
    latency = dependent_latency(machine, c.n * 4)
    miss = _row_miss(c, rows, chunk, machine)
    row_latency = machine.l2_latency + miss * (machine.dram_latency - machine.l2_latency)
    per_row = machine.shared_latency + machine.l1_latency + 10 + row_latency + 10
    groups = math.ceil(min(chunk, c.m) / lanes)
    chain = groups * (machine.dram_latency + search * (latency + machine.l2_latency) / 2 + machine.l2_latency
                      + 2 * machine.shared_latency * warp + min(c.m, lanes) * (hit * per_row + (1 - hit) * 35))
    row_bytes = c.pairs * c.n * hit * c.dv * 4
    threads = WARP * ROWS_PER_BLOCK if warp else GRADIENT_THREADS
    return Kernel("gather_rows", blocks=math.ceil(c.n * lanes / threads) * batches, threads=threads,
                  launches=launches, registers=56 if warp else 48, shared_bytes=threads * 4 if warp else 0,
                  instructions=visits * lanes / WARP * (per_group * math.ceil(c.m / lanes) + 40),
                  dram_bytes=c.pairs * c.n * 4 + visits * 8 * c.dv + row_bytes * miss,
                  l2_bytes=c.pairs * c.n * (SECTOR * (1 + search / 2) + hit * SECTOR) + row_bytes, chain=chain,
                  loaded=c.pairs * c.n * 4 * (finds + hit * (lanes + c.dv)) + visits * 4 * c.dv,
                  stored=visits * 4 * c.dv)


def find_heavy(c: Call, machine: Machine = H100) -> Kernel:
    """A thread per (pair, position): table_of_q cleared, and a run's first key position with room for
    heavy_side_minimum keys loads the run's last such key (a longer run, none with uniform codes,
    searches its length and its queries)."""
    positions = c.pairs * c.n
    minimum = heavy_minimum(c)
    starts = c.pairs * c.stats.distinct * max(0, c.n - minimum + 1) / c.n
    return Kernel("heavy runs flagged", blocks=positions / 256, threads=256, registers=22,
                  instructions=positions / WARP * 20,
                  dram_bytes=positions * 12 * (1 - l2_resident(positions * 12, machine)),
                  l2_bytes=positions * 12,
                  chain=2 * machine.l2_latency + machine.dram_latency,
                  loaded=positions * 8 - c.pairs * 4 + starts * 4, stored=positions * 8)


def number_heavy(c: Call, machine: Machine = H100) -> Kernel:
    """A thread per (pair, key position): the scan where it steps numbers a heavy bucket (none here)."""
    positions = c.pairs * c.n
    return Kernel("heavy runs numbered", blocks=positions / 256, threads=256, registers=30,
                  instructions=positions / WARP * 12,
                  dram_bytes=positions * 8 * (1 - l2_resident(positions * 12, machine)),
                  l2_bytes=positions * 12,
                  chain=machine.dram_latency + machine.l2_latency, loaded=positions * 8 - 4, stored=positions * 4)


def heavy_capacity(c: Call) -> int:
    """Heavy buckets with tables: at most a pair's tokens over the heavy minimum, and the workspace's."""
    return min(c.pairs * (c.n // heavy_minimum(c)), WORKSPACE_BYTES // 4 // (c.dv * (2 * c.d + 1)))


def heavy_grid(c: Call, name: str, machine: Machine, registers: int = 40) -> Kernel:
    """heavy_tables (40 registers) or heavy_apply (42 at d = 32): up to 2,048 blocks of 128 threads,
    each reading the count (0)."""
    blocks = min(heavy_capacity(c), 2048)
    return Kernel(name, blocks=blocks, threads=128, registers=registers, instructions=blocks * 4 * 10,
                  l2_bytes=blocks * SECTOR, chain=machine.l2_latency, loaded=blocks * 128 * 4, stored=0)


def indexed_by_code(c: Call) -> bool:
    """Whether a pair's 2^τ codes are few enough (2^τ ≤ 2n) to index rows by code: the atomic cumulation's
    direct rows, and the run starts the host makes for lookups (yoso_cuda_host.cpp)."""
    return 2**c.bits <= 2 * c.n


def run_loads(c: Call) -> float:
    """Loads a lane takes to find its bucket's run after its code: one from the pair's run starts where
    the host makes them, else a binary search and the check of what it found."""
    return 1.0 if indexed_by_code(c) else 1.0 + c.search


def run_starts(c: Call, sides: int, machine: Machine = H100) -> List[Kernel]:
    """Per side whose runs are looked up (where indexed_by_code): the starts filled with -1, then a thread per sorted
    position loads its code and its predecessor's, and each run's first position stores itself."""
    if not indexed_by_code(c):
        return []
    positions, table = c.pairs * c.n, c.pairs * 2**c.bits * 4
    fill = streaming("run starts filled (-1)", table, machine, launches=sides, loads=0)
    live = positions * 4 + table  # the sorted codes just written, the starts just filled
    kernel = Kernel("run starts", blocks=math.ceil(positions / GRADIENT_THREADS), threads=GRADIENT_THREADS,
                    launches=sides, registers=16, instructions=sides * positions / WARP * 14,
                    dram_bytes=sides * (positions * 4 + c.pairs * c.stats.distinct * 32)
                    * (1 - l2_resident(live, machine)),
                    l2_bytes=sides * (positions * 8 + c.pairs * c.stats.distinct * 32),
                    chain=2 * machine.l2_latency, loaded=sides * 4 * (2 * positions - c.pairs),
                    stored=sides * c.pairs * c.stats.distinct * 4)
    return [fill, kernel]


def unit_rows(c: Call, through: bool, machine: Machine = H100, output: bool = False) -> Kernel:
    """yoso_cuda_rows.cu, a team per row: q and k in one launch (``output``: the output's rows alone), a row's unit
    row (q's and k's as the gradient kernels read them) and norm; ``through``: its gradient pulled back (q, k: in
    place, from x; the output's from its unit rows), every lane loading the norm. A float4 a lane, a dot product."""
    width, sides, what = (c.dv, 1, "output") if output else (c.d, 2, "q, k")
    lanes, rows = instance_lanes(width, width), sides * c.B * c.n
    slots = max(1, (width + lanes - 1) // lanes)
    loaded = rows * (8 * width + 4 * lanes) if through else rows * 4 * width
    stored = rows * 4 * width if through else rows * ((4 if output else c.row_bytes) * width + 4)
    return Kernel(f"through the unit rows ({what})" if through else f"unit rows ({what})",
                  blocks=sides * math.ceil(c.B * c.n * lanes / GRADIENT_THREADS), threads=GRADIENT_THREADS, registers=38,
                  instructions=rows / (WARP // lanes) * (20 + 4 * slots * (2 if through else 1)
                                                         + 2 * int(math.log2(lanes))),
                  dram_bytes=loaded + stored, l2_bytes=loaded + stored,
                  chain=machine.dram_latency + int(math.log2(lanes)) * (machine.shared_latency + 5) + 60,
                  loaded=loaded, stored=stored)


SORT_THREADS = 128  # yoso_cuda_sort.cu's kSortThreads


def counting_sort_fits(tau: int, n: int, machine: Machine = H100) -> bool:
    """As yoso_cuda_host.cpp's choice of the counting sort for a pair of n codes: its 2^τ counters (and the
    scan's warp totals) within a block's TABLE_BYTES of shared memory (τ ≤ 13), or, where 2^τ ≤ 2n, opted into
    up to the machine's largest block (τ ≤ 15 on an H100). Past 2n codes a pair's counters outweigh its tokens
    and torch's radix sort is the faster (the model: 16 × 2,048 × 32 at τ = 14, 0.62 ms a call against 0.50)."""
    counters = (2**tau + SORT_THREADS // WARP) * 4
    return counters <= TABLE_BYTES or (2**tau <= 2 * n and counters <= machine.shared_bytes_per_block)


def counted(c: Call, machine: Machine = H100) -> bool:
    """Whether the call's codes are sorted by the counting sort (else by torch's sort, then run_starts)."""
    return not c.measured_kernels and counting_sort_fits(c.bits, c.n, machine)


def counting_sort(c: Call, sides: int, starts_sides: int, machine: Machine = H100) -> Kernel:
    """Per side, a block of 128 threads per pair: its 2^τ counters cleared, its codes counted (shared atomics),
    the counts scanned by each warp over a quarter of the codes (two passes, a lane a code, 5 shuffles a step)
    into each code's first position (and its run start, stored, for ``starts_sides`` of the sides), then its
    tokens placed in rounds of 128: a warp's lanes of one code ranked by match_any, the 4 warps taking turns
    on the counters (a barrier a turn). A warp's stores of its tokens' sorted codes and order scatter over a
    sector per distinct code among its 32. The chain: the scan's steps, then per round the rank and 4 turns
    of a counter's read, a store and a barrier (the next round's codes loaded meanwhile)."""
    codes, pairs = 2**c.bits, sides * c.pairs
    tokens, rounds = pairs * c.n, math.ceil(c.n / SORT_THREADS)
    warps = SORT_THREADS // WARP
    scan_steps = math.ceil(codes / warps / WARP)
    starts = starts_sides * c.pairs * codes * 4 if indexed_by_code(c) else 0
    sectors = codes * (1 - (1 - 1 / codes) ** WARP)  # of a warp's two scattered stores, each
    return Kernel("codes sorted (counting sort)", blocks=c.pairs, threads=SORT_THREADS, launches=sides, registers=32,
                  shared_bytes=(codes + warps) * 4,
                  instructions=pairs * codes / WARP * 36 + tokens / WARP * (14 + 6 * warps),
                  shared_rounds=math.ceil(tokens / WARP) * most_on_one(WARP, codes),
                  shared_wavefronts=pairs * codes / WARP * 4 + tokens / WARP * 3.5 * 2,
                  dram_bytes=tokens * 4 * 3 + starts,
                  l2_bytes=tokens * 4 * 2 + tokens / WARP * 2 * sectors * SECTOR + starts,
                  chain=(2 * scan_steps * 6 + rounds * (2 + 3 * warps)) * machine.shared_latency
                  + 3 * machine.l2_latency,
                  loaded=tokens * 8, stored=tokens * 8 + starts)


def _team_costs(c: Call, machine: Machine, lanes: int) -> Tuple[float, float, float]:
    """(instructions a warp issues per colliding pair, per hash before its pairs, the chain of a pair walked
    alone, as the atomic backward and the measured kernels walk a run: its next code checked, the other token's
    position in the order, its key weight and its row, one dependent load after another from L2, then the
    team's dot product, log2(lanes) shuffles; the current deterministic kernels take parts of it)."""
    slots = max(1, (c.d + lanes - 1) // lanes)
    per_pair = 12 + 2 * slots + 2 * int(math.log2(lanes)) + 2 + 2 * slots
    per_hash = 8 + 7 * run_loads(c) + 4
    pair_chain = 4 * machine.l2_latency + int(math.log2(lanes)) * (machine.shared_latency + 5) + 20
    return per_pair, per_hash, pair_chain


def _lookup_chain(c: Call, machine: Machine) -> float:
    """Cycles from a token's code to its bucket's run and the run's heavy-table entry: one load from the
    pair's run starts (a random entry of 2^τ: L2) where the host made them, else a binary search over the
    pair's sorted codes and its check; then the table entry (L2) where heavy tables exist."""
    lookup = machine.l2_latency if indexed_by_code(c) else run_loads(c) * dependent_latency(machine, c.n * 4)
    return lookup + (machine.l2_latency if heavy_capacity(c) > 0 else 0.0)


def token_gradients(c: Call, side: str, machine: Machine = H100) -> Kernel:
    """Deterministic query_gradients or key_gradients: a team of :func:`token_lanes` per token over its m
    hashes, one launch. Its buckets are found L hashes at a time, a lane each: code, run start, then the run's
    heavy table, first token and next code, then (queries' kernel) that token's key weight, one chain of
    dependent loads per group of L hashes, then four shuffles a hash; a light run's first pair then costs the
    team its rows alone; its further
    tokens are read L positions at a time, a lane each (code and token, then the weight: one chain a chunk),
    each then handed over by two shuffles and costing its rows. In the measured kernels every lane found each
    hash's bucket in turn (a chain per hash) and walked the run a pair at a time (order, weight, next code)."""
    b = c.stats
    key = side == "key"
    lanes = team_lanes(c) if c.measured_kernels else token_lanes(c.d, c.dv)
    teams_per_warp = WARP // lanes
    per_pair, per_hash, pair_chain = _team_costs(c, machine, lanes)
    longest = max_of_poisson(b.per_query, teams_per_warp)
    busy = 1 - (1 - b.hit) ** teams_per_warp  # a warp with at least one team in a non-empty bucket
    warps = c.B * c.n / teams_per_warp
    lookup = machine.l2_latency + _lookup_chain(c, machine)  # the code, its run, the run's table
    collisions = c.pairs * c.n * b.per_query
    own = c.d + c.dv if key else c.d
    if c.measured_kernels:
        lookups, shuffles = c.m, 0
        chain = machine.dram_latency + lookups * lookup + c.m * (longest * pair_chain + busy * machine.l2_latency)
        per_token_hash = lanes * 4 * (1 + run_loads(c)) + b.hit * 4 * 2 * lanes + b.per_query * (
            lanes * 4 * (2 if key else 3) + c.row_bytes * (c.dv + c.d))
    else:  # a run's further tokens a chunk of `lanes` positions at a time; runs past 1 + lanes uncounted (at
        # λ = 1 under 0.1 % of runs with 4 lanes or more, 3 % with d = 16's 2 lanes)
        lookups, shuffles = math.ceil(c.m / lanes), 4
        lookup += machine.l2_latency * (1 if key else 2)  # the first token (and next code), then its weight
        first_pair = pair_chain - 3 * machine.l2_latency  # its rows only: the team's dot product on them
        goes_on = 1 - (1 - b.two_or_more) ** teams_per_warp  # a warp with a run to walk on
        chunk = machine.l2_latency * (1 if key else 2)  # the chunk's codes and tokens, then (queries') weights
        further = first_pair + 2 * machine.shared_latency  # a token handed over, its rows, the dot product
        chain = machine.dram_latency + lookups * lookup + c.m * (
            shuffles * machine.shared_latency + busy * first_pair + goes_on * chunk + (longest - busy) * further)
        per_token_hash = 4 * (1 + run_loads(c)) + b.hit * 4 * (3 if key else 4) + b.two_or_more * lanes * 8 + (
            0 if key else (b.per_query - b.hit) * 4) + b.per_query * c.row_bytes * (c.dv + c.d)
    return Kernel(f"{side}_gradients", blocks=math.ceil(c.B * c.n * lanes / GRADIENT_THREADS),
                  threads=GRADIENT_THREADS,
                  registers=(54 if key else 56) if c.measured_kernels else token_gradient_registers(key),
                  instructions=warps * (lookups * per_hash + c.m * (shuffles * 2 + busy * 4 + longest * per_pair)
                                        + 30),
                  dram_bytes=c.B * c.n * (c.row_bytes * (c.d + c.dv) + 4 * own) + c.pairs * c.n * 16,
                  l2_bytes=collisions * (c.row_bytes * (c.dv + c.d) + 2 * SECTOR)
                  + c.pairs * c.n / teams_per_warp * 2 * SECTOR,
                  chain=chain,
                  loaded=c.pairs * c.n * per_token_hash + c.B * c.n * (c.row_bytes * c.dv + (4 * lanes if key else 0)),
                  stored=c.B * c.n * 4 * own)


def scatter_pairs(c: Call, machine: Machine = H100, vector_atomics: Optional[bool] = None) -> Kernel:
    """Atomic: a team per (hash, query), in parallel over hashes: its bucket's pairs each add their
    share into ∇K and ∇V, and their sum into ∇Q, with atomicAdd; heavy buckets left to the tables
    (none with uniform codes). A templated team (d = 16 … 128) adds a lane's 4 coordinates with one
    float4 atomic where the machine has them (sm_90 on: a row's sectors updated once each), else
    with four 4-byte atomics 16 bytes apart (every sector of the row once per slot);
    ``vector_atomics`` overrides the machine (the what-if of the other build)."""
    b = c.stats
    lanes = team_lanes(c)
    teams_per_warp = WARP // lanes
    slots = max(1, (c.d + lanes - 1) // lanes)
    per_pair, per_hash, pair_chain = _team_costs(c, machine, lanes)
    longest = max_of_poisson(b.per_query, teams_per_warp)
    busy = 1 - (1 - b.hit) ** teams_per_warp
    warps = c.pairs * c.n / teams_per_warp
    collisions = c.pairs * c.n * b.per_query
    vector = (machine.vector_atomics if vector_atomics is None else vector_atomics) and lanes * 4 == c.d
    atomics_per_row = 1 if vector else slots  # atomic instructions a lane issues per row
    sectors_per_row = math.ceil(c.d * 4 / SECTOR)
    if lanes * 4 <= c.d and not vector:  # slot s of every lane: 4-byte atomics 16 bytes apart
        sectors_per_row = slots * math.ceil(lanes * 16 / SECTOR)
    atomic_sectors = collisions * 2 * sectors_per_row + c.pairs * c.n * b.hit * sectors_per_row
    chain = machine.dram_latency + _lookup_chain(c, machine) + machine.l2_latency \
        + busy * machine.l2_latency + longest * (pair_chain + 2 * atomics_per_row * 4)
    rows = c.row_bytes * (c.dv + c.d)  # a pair's two rows (g and q, or v and k)
    loaded = c.pairs * c.n * (lanes * 4 * (1 + run_loads(c)) + b.hit * (lanes * 4 * 2 + rows)) \
        + collisions * (lanes * 4 * 3 + rows)
    kernel = Kernel("atomic: pairs added into ∇Q, ∇K, ∇V", threads=GRADIENT_THREADS, registers=48,
                    blocks=math.ceil(c.pairs * c.n * lanes / GRADIENT_THREADS),
                    instructions=warps * (per_hash + busy * (8 + 3 * slots + atomics_per_row)
                                          + longest * (per_pair + 4 * slots + 2 * atomics_per_row)),
                    dram_bytes=c.B * c.n * 2 * rows + c.B * c.n * 4 * (2 * c.d + c.dv) * 2 + c.pairs * c.n * 16,
                    l2_bytes=collisions * (rows + 2 * SECTOR), atomic_sectors=atomic_sectors, chain=chain,
                    loaded=loaded, stored=0, added=collisions * 4 * (c.d + c.dv) + c.pairs * c.n * b.hit * 4 * c.d)
    return kernel
