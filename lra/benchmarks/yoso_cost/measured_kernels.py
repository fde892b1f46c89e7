"""The kernels the committed H100 measurements ran (csrc/yoso at a94d93d), where today's differ
(:attr:`lra.benchmarks.yoso_cost.call.Call.measured_kernels`): the deterministic cumulation's warp per row.
Kept so that ``python -m lra.benchmarks.yoso_cost --measured`` compares each measurement with the kernels
that made it; :mod:`.kernels` models today's."""

from __future__ import annotations

import math

from lra.benchmarks.yoso_cost.call import Call, dependent_latency, max_of_poisson
from lra.benchmarks.yoso_cost.gpu import SECTOR, WARP, Kernel, Machine
from lra.benchmarks.yoso_cost.kernels import (ROWS_PER_BLOCK, _row_miss, chunk_batches, cumulation_plan,
                                              run_loads)


def bucket_rows(c: Call, machine: Machine) -> Kernel:
    """The measured kernels' bucket_rows: a warp per sorted key position of a chunk's pairs (every lane reads the code and
    its predecessor); a bucket's first position sums w_j v_j into its row: per value coordinate the
    run's codes (and the one after), order, weight and value. Its rows go through DRAM where the
    chunk's tables outgrow L2."""
    b = c.stats
    _, rows, chunk = cumulation_plan(c, False)
    slices = math.ceil(c.dv / WARP)
    longest = max_of_poisson(b.per_query, ROWS_PER_BLOCK)
    element = machine.l2_latency + 2 * machine.l1_latency
    written = c.pairs * b.distinct * c.dv * 4
    return Kernel("bucket_rows", blocks=math.ceil(c.n / ROWS_PER_BLOCK) * chunk, threads=WARP * ROWS_PER_BLOCK,
                  launches=math.ceil(c.pairs / chunk), registers=38,
                  instructions=c.pairs * (c.n * 20 + b.distinct * slices * (c.run * 12 + 8)),
                  dram_bytes=c.pairs * c.n * 8 + c.B * c.n * 4 * (c.dv + 1)
                  + written * _row_miss(c, rows, chunk, machine),
                  l2_bytes=c.pairs * (c.n * 2 * SECTOR + b.distinct * slices * (c.run * (3 * SECTOR + 128) + 128)),
                  chain=machine.l2_latency + (longest + 1) * slices * element,
                  loaded=c.pairs * 4 * (WARP * (2 * c.n - 1) + c.dv * (4 * c.n + b.distinct - 1)),
                  stored=written)


def gather_rows(c: Call, atomic: bool, machine: Machine) -> Kernel:
    """The measured kernels' gather_rows: a warp per query and sequence of a chunk (56 registers): a lane per hash finds the query's row
    (direct: its code; else from the run starts, or a binary search where 2^τ > 2n), then the warp reads
    the rows one hash after another (a branch on the weight between the two loads); direct rows are read
    for every hash; the output row is read and written once per chunk."""
    b = c.stats
    direct, rows, chunk = cumulation_plan(c, atomic)
    launches = math.ceil(c.pairs / chunk)
    batches = chunk_batches(c, chunk)
    visits = c.n * launches * batches
    hit = 1.0 if direct else b.hit
    search = 0.0 if direct else run_loads(c) - 1  # a binary search's loads, or none from the run starts
    finds = 1 if direct else 1 + run_loads(c)
    per_group = 20 + search * 6 + min(c.m, WARP) * (5 + hit * 45)
    latency = dependent_latency(machine, c.n * 4)
    miss = _row_miss(c, rows, chunk, machine)
    row_latency = machine.l2_latency + miss * (machine.dram_latency - machine.l2_latency)
    per_row = machine.shared_latency + machine.l1_latency + 10 + row_latency + 10
    groups = math.ceil(min(chunk, c.m) / WARP)
    chain = groups * (machine.dram_latency + search * (latency + machine.l2_latency) / 2 + machine.l2_latency
                      + 2 * machine.shared_latency + min(c.m, WARP) * (hit * per_row + (1 - hit) * 35))
    row_bytes = c.pairs * c.n * hit * c.dv * 4
    return Kernel("gather_rows", blocks=math.ceil(c.n / ROWS_PER_BLOCK) * batches, threads=WARP * ROWS_PER_BLOCK,
                  launches=launches, registers=56, shared_bytes=ROWS_PER_BLOCK * WARP * 4,
                  instructions=visits * (per_group * math.ceil(c.m / WARP) + 40),
                  dram_bytes=c.pairs * c.n * 4 + visits * 8 * c.dv + row_bytes * miss,
                  l2_bytes=c.pairs * c.n * (SECTOR * (1 + search / 2) + hit * SECTOR) + row_bytes, chain=chain,
                  loaded=c.pairs * c.n * 4 * (finds + hit * (WARP + c.dv)) + visits * 4 * c.dv,
                  stored=visits * 4 * c.dv)
