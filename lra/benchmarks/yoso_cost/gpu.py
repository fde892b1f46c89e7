"""A GPU kernel's time on paper: the machines, one kernel's work, and the terms that bound its time.

A kernel is described by what it asks of the machine (:class:`Kernel`): its launches and grid, the
registers and shared memory of a block (ptxas), the warp instructions it issues, the bytes it moves
between DRAM and L2 and between L2 and the SMs (32-byte sectors), the sectors its atomics update in L2 (a
warp's atomic instruction updates each sector its lanes touch once), the rounds its shared-memory atomics
take (a warp's atomic instruction takes as many rounds as the most lanes that hit one address), its FP32
work, and the longest chain of dependent latencies one block walks (cycles). :func:`terms` turns that into
seconds on a :class:`Machine`:

- **launch**: a fixed cost per launch on the device (block dispatch and drain of a grid), the only term
  that adds to the others; the host's side of a launch is :mod:`.host`'s;
- **issue**: warp instructions × ``issue_factor`` (the compiled code's instructions per counted one:
  64-bit index arithmetic, predicates and loop control) over the SMs that have a block (4 schedulers,
  1 warp instruction a clock each);
- **DRAM** and **L2**: bytes over the achievable bandwidth of each;
- **L2 atomics**: sector updates × ``atomic_sector_cost`` sector-times of L2 bandwidth (the L2's atomic
  units read, add and write a sector: more than a load's one sector-time);
- **shared memory**: wavefronts (one a clock per SM: a warp's conflict-free access, one more per extra
  lane on a bank) plus atomic rounds × ``shared_atomic_cycles`` (lanes on one address are served one a
  round, and a round holds the SM's shared-memory atomic unit);
- **FP32**: FMA work over the FP32 pipes;
- **latency** (with occupancy): the chain of one block × ``latency_factor`` (the microbenchmarks'
  latencies are of one load alone; under a kernel's load, with the dependent arithmetic between loads, a
  chain takes longer), times the waves of blocks the SMs hold at once (``blocks / (SMs × resident blocks
  per SM)``, at least one). Resident blocks per SM are the fewest that threads, registers, shared memory
  and the block limit allow, so a kernel with few blocks, or a long chain of dependent loads per block, is
  latency-bound however few bytes it moves.

The time is the launch term plus the largest of the others (the work overlaps; only launches
serialise). Latencies are in cycles of the SM clock, as microbenchmarks measured them: on Turing
(Jia et al. 2019, "Dissecting the NVidia Turing T4 GPU via Microbenchmarking", arXiv:1903.07486,
Table 3.1: L1 32, L2 188, shared memory 19; DRAM 500, an estimate: the report gives none) and on
Hopper (Luo et al. 2024, "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture",
arXiv:2402.13499, Table IV, H800 PCIe: L1 41, L2 263, shared memory 29, global memory 479); a
shuffle or a barrier is taken at the shared-memory latency. The five H100 constants that no datasheet
or microbenchmark gives (``issue_factor``, ``latency_factor``, ``atomic_sector_cost``,
``shared_atomic_cycles``, ``launch_s``) are fitted on one committed H100 trace (:mod:`.fit`); the RTX
2080 Ti keeps the neutral values (1, 1, 1, its shared latency, 5 µs), nothing fitted to it.
``python -m lra.benchmarks.yoso_cost`` shows what each constant, 30 % off, does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict

SECTOR = 32  # bytes: the unit of L1/L2/DRAM transfers
WARP = 32


@dataclass(frozen=True)
class Machine:
    name: str
    sms: int
    clock_hz: float  # the boost clock of the datasheet FP32 rate
    dram_bytes_per_s: float
    l2_bytes: int
    l2_bytes_per_s: float
    fp32_flops: float  # the datasheet's peak (FMA = 2 FLOPs)
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    shared_bytes_per_sm: int
    shared_bytes_per_block: int  # the most dynamic shared memory a block may opt into
    l1_latency: int  # cycles
    l2_latency: int
    dram_latency: int  # cycles
    shared_latency: int  # cycles: a shared-memory access, a shuffle or a barrier
    launch_s: float  # per kernel launch on the device (H100: fitted)
    compute_capability: int  # 75: Turing, 90: Hopper
    dram_efficiency: float = 0.85  # the fraction of the datasheet bandwidth a streaming kernel sustains
    atomic_sector_cost: float = 1.0  # sector-times of L2 bandwidth one atomic sector update takes (H100: fitted)
    gemm_efficiency: float = 0.8  # of fp32_flops, cuBLAS SGEMM at large sizes
    issue_factor: float = 1.0  # issued warp instructions per counted one (H100: fitted)
    latency_factor: float = 1.0  # a chain's cycles under load per cycle of unloaded latency (H100: fitted)
    shared_atomic_cycles: float = 0.0  # SM cycles per round of a shared atomic (0: the shared latency; H100: fitted)

    @property
    def vector_atomics(self) -> bool:
        """Whether atomicAdd takes a float4 (one update of its sector instead of four): sm_90 and later."""
        return self.compute_capability >= 90

    @property
    def shared_round_cycles(self) -> float:
        return self.shared_atomic_cycles or float(self.shared_latency)

    @property
    def issue_per_s(self) -> float:
        """Warp instructions per second: 4 schedulers per SM, one warp instruction a clock each."""
        return self.sms * 4 * self.clock_hz


# RTX 2080 Ti (TU102), the YOSO paper's GPU: NVIDIA's datasheet (68 SMs, 1,545 MHz boost, 616 GB/s, 5.5 MB L2,
# 13.4 TFLOP/s FP32) and the Turing tuning guide (1,024 threads, 16 blocks, 64 K registers and 64 KB shared
# memory per SM, all of it a block's to opt into). Latencies: Jia et al. 2019, Table 3.1, measured on the T4
# (TU104, the same Turing SM): L1 hit 32 cycles, L2 hit ~188, shared memory 19 (no conflict). L2 bandwidth: the
# T4's measured 1,270 GB/s (their Table 3.4; 4 MB of L2 behind 8 memory controllers, 1,590 MHz) scaled to the
# TU102's 5.5 MB behind 11 at 1,545 MHz: ≈ 1.7 TB/s. DRAM latency (not published for Turing) and the 85 % a
# streaming kernel sustains are estimates (the T4 copy benchmark reached 68.8 % of its GDDR6 bandwidth, the V100
# 83.3 %). Launches: PyTorch 1.x eager, ~5 µs each.
RTX_2080_TI = Machine("RTX 2080 Ti", sms=68, clock_hz=1.545e9, dram_bytes_per_s=616e9, l2_bytes=5632 * 1024,
                      l2_bytes_per_s=1270e9 * 11 / 8 * 1545 / 1590, fp32_flops=13.4e12, max_threads_per_sm=1024,
                      max_blocks_per_sm=16, registers_per_sm=65536, shared_bytes_per_sm=64 * 1024,
                      shared_bytes_per_block=64 * 1024, l1_latency=32, l2_latency=188, dram_latency=500,
                      shared_latency=19, launch_s=5e-6, compute_capability=75)

# H100 SXM5 (GH100): NVIDIA's datasheet and Hopper tuning guide (132 SMs, 1,980 MHz at the 67 TFLOP/s FP32 rate,
# 3.35 TB/s HBM3, 50 MB L2, 2,048 threads, 32 blocks, 64 K registers and 228 KB shared memory per SM, 227 KB of
# it a block's to opt into). Latencies and bandwidths: Luo et al. 2024 (arXiv:2402.13499), Tables IV and V,
# measured on the H800 PCIe (the same GH100 SM and 50 MB L2): L1 40.7, shared memory 29.0, L2 263.0, global
# memory 478.8 cycles; L2 3,942.4 bytes a clock (here at 1,980 MHz: 7.8 TB/s); global memory 1,861.5 of 2,039
# GB/s (91 %). Fitted on the calibration trace (.fit): a launch's 3.64 µs on the device (a grid's dispatch and
# drain: the profiler's time of a kernel that does nearly nothing), the issue, latency and L2-atomic factors and
# a shared atomic round's cycles (the host's side: .host).
H100 = Machine("H100 SXM5", sms=132, clock_hz=1.98e9, dram_bytes_per_s=3.35e12, l2_bytes=50 * 2**20,
               l2_bytes_per_s=3942.4 * 1.98e9, fp32_flops=67e12, max_threads_per_sm=2048, max_blocks_per_sm=32,
               registers_per_sm=65536, shared_bytes_per_sm=228 * 1024, shared_bytes_per_block=227 * 1024,
               l1_latency=41, l2_latency=263, dram_latency=479, shared_latency=29, launch_s=3.64e-6,
               compute_capability=90,
               dram_efficiency=0.91, issue_factor=1.56, latency_factor=2.32, atomic_sector_cost=7.39,
               shared_atomic_cycles=17.6)


FITTED = ("issue_factor", "latency_factor", "atomic_sector_cost", "shared_atomic_cycles", "launch_s")


def structural(machine: Machine) -> Machine:
    """``machine`` without its fitted constants (:data:`FITTED`), which only :func:`terms` reads: what a
    kernel's description is built from (kernels built once serve every fitted value)."""
    return replace(machine, issue_factor=1.0, latency_factor=1.0, atomic_sector_cost=1.0, shared_atomic_cycles=0.0,
                   launch_s=0.0)


@dataclass(frozen=True)
class Kernel:
    """What one kernel (all its launches together) asks of the machine; see the module docstring."""

    name: str
    blocks: float  # per launch
    threads: int  # per block
    launches: int = 1
    registers: int = 32  # per thread
    shared_bytes: int = 0  # per block
    instructions: float = 0.0  # warp instructions, all launches
    dram_bytes: float = 0.0
    l2_bytes: float = 0.0  # sectors between L2 and the SMs × 32 (atomic updates apart)
    flops: float = 0.0  # FP32
    atomic_sectors: float = 0.0  # sector updates by atomic instructions, all launches
    shared_rounds: float = 0.0  # rounds of shared-memory atomic instructions, all launches
    shared_wavefronts: float = 0.0  # shared-memory wavefronts of plain loads and stores, all launches
    chain: float = 0.0  # cycles: the longest dependent path one block walks
    gemm: bool = False  # cuBLAS: flops at the machine's GEMM efficiency instead of the other terms
    loaded: float = 0.0  # bytes the threads load (the CPU emulation counts these)
    stored: float = 0.0
    added: float = 0.0  # bytes the threads add atomically

    def scaled(self, factor: float) -> "Kernel":
        """The same kernel ``factor`` times (its launches and all its work)."""
        return replace(self, launches=max(1, round(self.launches * factor)), instructions=self.instructions * factor,
                       dram_bytes=self.dram_bytes * factor, l2_bytes=self.l2_bytes * factor, flops=self.flops * factor,
                       atomic_sectors=self.atomic_sectors * factor, shared_rounds=self.shared_rounds * factor,
                       shared_wavefronts=self.shared_wavefronts * factor,
                       loaded=self.loaded * factor, stored=self.stored * factor, added=self.added * factor)


def resident_blocks(kernel: Kernel, machine: Machine) -> int:
    """Blocks one SM holds at once: the tightest of threads, registers, shared memory and the block limit."""
    limits = [machine.max_blocks_per_sm, machine.max_threads_per_sm // max(kernel.threads, 1)]
    warps = math.ceil(kernel.threads / WARP)
    registers = warps * WARP * max(kernel.registers, 16)
    limits.append(machine.registers_per_sm // registers)
    if kernel.shared_bytes:
        limits.append(machine.shared_bytes_per_sm // kernel.shared_bytes)
    return max(1, min(limits))


def terms(kernel: Kernel, machine: Machine) -> Dict[str, float]:
    """Seconds per term (module docstring); ``launch`` adds to the largest of the others."""
    if kernel.gemm:
        return {"launch": kernel.launches * machine.launch_s,
                "FP32": kernel.flops / (machine.fp32_flops * machine.gemm_efficiency),
                "DRAM": kernel.dram_bytes / (machine.dram_bytes_per_s * machine.dram_efficiency)}
    blocks = kernel.blocks * kernel.launches
    active_sms = min(machine.sms, max(kernel.blocks, 1))
    waves = kernel.blocks / (machine.sms * resident_blocks(kernel, machine))
    return {
        "launch": kernel.launches * machine.launch_s,
        "issue": kernel.instructions * machine.issue_factor / (active_sms * 4 * machine.clock_hz),
        "DRAM": kernel.dram_bytes / (machine.dram_bytes_per_s * machine.dram_efficiency),
        "L2": kernel.l2_bytes / machine.l2_bytes_per_s,
        "L2 atomics": kernel.atomic_sectors * SECTOR * machine.atomic_sector_cost / machine.l2_bytes_per_s,
        "shared memory": (kernel.shared_wavefronts + kernel.shared_rounds * machine.shared_round_cycles)
        / (active_sms * machine.clock_hz),
        "FP32": kernel.flops / machine.fp32_flops,
        "latency": kernel.launches * max(1.0, waves) * kernel.chain * machine.latency_factor / machine.clock_hz
        if blocks else 0.0,
    }


def seconds(kernel: Kernel, machine: Machine) -> float:
    parts = terms(kernel, machine)
    return parts["launch"] + max(v for k, v in parts.items() if k != "launch")


def bound(kernel: Kernel, machine: Machine) -> str:
    """The name of the term that sets the kernel's time (besides its launches)."""
    parts = terms(kernel, machine)
    return max((k for k in parts if k != "launch"), key=parts.get)


def l2_resident(bytes_live: float, machine: Machine) -> float:
    """The share of a working set of ``bytes_live`` that L2 holds between kernels (up to 80 % of L2)."""
    return min(1.0, 0.8 * machine.l2_bytes / max(bytes_live, 1.0))


def streaming(name: str, bytes_moved: float, machine: Machine, launches: int = 1, loads: int = 1) -> Kernel:
    """An elementwise PyTorch kernel (a fill, a copy, a normalization pass) of 4-byte elements, each read from
    ``loads`` tensors and written once: bytes through L2 once, through DRAM for the share L2 does not hold
    (a tensor the last kernels wrote is still in L2 when it fits), 4 elements per thread (vectorized, loads
    in flight together), a few instructions each; a block waits for its loads once (a fill not at all)."""
    elements = bytes_moved / (4 * (loads + 1))
    resident = l2_resident(bytes_moved, machine)
    return Kernel(name, blocks=max(1.0, elements / (4 * 256 * launches)), threads=256, launches=launches,
                  instructions=elements / WARP * (2 + loads), dram_bytes=bytes_moved * (1 - resident),
                  l2_bytes=bytes_moved, chain=memory_latency(resident, machine) if loads else machine.l1_latency)


def memory_latency(resident: float, machine: Machine) -> float:
    """Cycles of a load whose line L2 holds with probability ``resident`` (else DRAM's)."""
    return resident * machine.l2_latency + (1 - resident) * machine.dram_latency


def gemm(name: str, m: float, n: float, k: float, launches: int = 1, operands_bytes: float = 4.0) -> Kernel:
    """A cuBLAS GEMM [m × k] · [k × n] (fp32 on the CUDA cores): 2 m n k FLOPs at the machine's
    SGEMM efficiency; its operands and result through DRAM once."""
    return Kernel(name, blocks=1, threads=256, launches=launches, flops=launches * 2 * m * n * k,
                  dram_bytes=launches * operands_bytes * (m * k + k * n + m * n), gemm=True)
