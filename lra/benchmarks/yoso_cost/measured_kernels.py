"""The kernels the committed H100 measurements ran (csrc/yoso at a94d93d), where today's differ
(:attr:`lra.benchmarks.yoso_cost.call.Call.measured_kernels`): bucket_rows' warp per sorted position.
Kept so that ``python -m lra.benchmarks.yoso_cost --measured`` compares each measurement with the kernels
that made it; :mod:`.kernels` models today's."""

from __future__ import annotations

import math

from lra.benchmarks.yoso_cost.call import Call, max_of_poisson
from lra.benchmarks.yoso_cost.gpu import SECTOR, WARP, Kernel, Machine
from lra.benchmarks.yoso_cost.kernels import ROWS_PER_BLOCK, _row_miss, cumulation_plan


def bucket_rows(c: Call, machine: Machine) -> Kernel:
    """The measured kernels' bucket_rows: a warp per sorted key position of a chunk's pairs (every lane
    reads the code and its predecessor); a bucket's first position sums w_j v_j into its row: per value
    coordinate the run's codes (and the one after), order, weight and value. Its rows go through DRAM
    where the chunk's tables outgrow L2."""
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
