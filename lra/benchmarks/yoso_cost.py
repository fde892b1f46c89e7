"""The GPU cost of YOSO on paper: a projection until measured.

    python -m lra.benchmarks.yoso_cost [--lengths 512 1024 ...] [--out FILE.md]

For each kernel of csrc/yoso as implemented (yoso_cuda_kernels.cu, yoso_cuda_gradients.cu) and the
sorts its wrappers run, for one YOSO call: the global loads and stores its threads issue (4 bytes
per thread per load, as the CPU emulation counts them: tests/test_cuda_emulation.py checks these
counts against it), the DRAM bytes it must move at least (inputs and outputs once; tables live in
L2-sized chunks) and its FLOPs. Its lower-bound time on an H100 SXM is the largest of: issued bytes
over the load/store units' throughput, DRAM bytes over HBM bandwidth, FLOPs over the FP32 rate.
SDPA (FlashAttention on bf16 tensor cores) and eager softmax (bf16, n × n scores through DRAM) are
bounded the same way. Codes are taken uniform over 2^τ (random unit q and k: each bit a fair coin),
so a query meets n / 2^τ keys per hash; trained models collide more (lra-fidelity measures it).
The load/store bound counts 4 bytes per thread load, the cost of a coalesced access; a warp whose
lanes read 32 different 32-byte sectors (a thread-per-token kernel reading its own rows, the
gather's per-lane searches) costs up to 8× that in L1 throughput, so those kernels' bounds are loose.
Rates assumed (H100 SXM5: NVIDIA's datasheet; LSU: 132 SMs × 128 bytes per clock at 1.755 GHz):
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional

HBM_BYTES_PER_S = 3.35e12
LSU_BYTES_PER_S = 132 * 128 * 1.755e9  # one 32-lane × 4-byte wavefront per SM per clock
FP32_FLOPS = 67e12  # the YOSO kernels: float32 on the CUDA cores
BF16_TENSOR_FLOPS = 989e12  # dense; SDPA, eager softmax's matmuls and the model's linear layers (autocast)
L2_BYTES = 50 * 2**20
WARP = 32
SORT_BYTES_PER_ELEMENT = 64  # a 32-bit radix sort of (code, position): 4 passes reading and writing 16 bytes
__doc__ += (f"HBM {HBM_BYTES_PER_S / 1e12:.2f} TB/s, load/store units {LSU_BYTES_PER_S / 1e12:.1f} TB/s, "
            f"FP32 {FP32_FLOPS / 1e12:.0f} TFLOP/s, bf16 tensor {BF16_TENSOR_FLOPS / 1e12:.0f} TFLOP/s (dense), "
            f"L2 {L2_BYTES >> 20} MB.\n")


@dataclass(frozen=True)
class Cost:
    kernel: str
    loaded: float  # bytes the threads load (issued)
    stored: float
    dram_bytes: float
    flops: float
    tensor: bool = False

    @property
    def seconds(self) -> float:
        rate = BF16_TENSOR_FLOPS if self.tensor else FP32_FLOPS
        return max((self.loaded + self.stored) / LSU_BYTES_PER_S, self.dram_bytes / HBM_BYTES_PER_S,
                   self.flops / rate)


@dataclass(frozen=True)
class Buckets:
    """Per (sequence, hash) pair: distinct key codes, the share of queries whose bucket holds a key,
    keys per query (= queries per key), the share of keys whose bucket holds a query."""

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


def fast_hash(c: Call) -> Cost:
    """One block per token: x (d floats), for each of R products 3 diagonals of P floats; m codes
    written once. For q and k."""
    tokens = 2 * c.B * c.n
    dram = tokens * 4 * (c.d + c.m) + c.B * c.products * 3 * c.padded * 4
    return Cost("fast_hash (q, k)", tokens * 4 * (c.d + 3 * c.padded * c.products), tokens * 4 * c.m, dram,
                tokens * c.products * 3 * c.padded * (1 + math.log2(c.padded)))


def sort(c: Call, sides: int) -> Cost:
    elements = sides * c.pairs * c.n
    bytes_ = elements * SORT_BYTES_PER_ELEMENT
    return Cost(f"sort codes ({'q, k' if sides == 2 else 'k'})", bytes_ / 2, bytes_ / 2, bytes_, 0)


def bucket_rows(c: Call) -> Cost:
    """A warp per sorted key position (every lane reads the code and its predecessor); a bucket's first
    position sums w_j v_j into its row: per value coordinate the run's codes (and the one after),
    order, weight and value."""
    b = c.stats
    loaded = c.pairs * 4 * (WARP * (2 * c.n - 1) + c.dv * (4 * c.n + b.distinct - 1))
    stored = c.pairs * 4 * b.distinct * c.dv
    dram = c.pairs * c.n * 8 + c.B * c.n * 4 * (c.dv + 1)
    return Cost("bucket_rows", loaded, stored, dram, c.pairs * c.n * 2 * c.dv)


def _chunks_per_sequence(c: Call, floats_per_pair: float, workspace_bytes: int) -> int:
    pairs = max(1, min(c.pairs, 65535, int(min(workspace_bytes, L2_BYTES) / 4 // max(floats_per_pair, 1))))
    return math.ceil(c.m / pairs) if pairs < c.m else 1


def gather_rows(c: Call, workspace_bytes: int = 256 * 2**20) -> Cost:
    """A warp per query: its lanes search 32 hashes at once (a lane per hash: the code, a binary search,
    the check of the position), then, for each hash whose bucket holds a key, every lane reads the
    weight and its value coordinates of the row; the output row is read and written once per chunk."""
    b = c.stats
    chunks = _chunks_per_sequence(c, c.n * c.dv, workspace_bytes)
    loaded = c.pairs * c.n * 4 * (2 + c.search + b.hit * (WARP + c.dv)) + c.B * c.n * 4 * c.dv * chunks
    stored = c.B * c.n * 4 * c.dv * chunks
    dram = c.pairs * c.n * 8 + c.B * c.n * 8 * c.dv * chunks
    return Cost("gather_rows", loaded, stored, dram, c.pairs * c.n * b.hit * 2 * c.dv)


def heavy_tables(c: Call) -> Cost:
    """The d_v × d table blocks: one thread per slot looks for a heavy run in its window (a code and its
    predecessor per position, two runs found per bucket); with uniform codes no bucket is heavy."""
    b = c.stats
    loaded = 2 * c.pairs * 4 * (2 * c.n + 4 * b.distinct * c.search)
    return Cost("key/query tables", loaded, 0, 2 * c.pairs * c.n * 4, 0)


def token_gradients(c: Call, side: str) -> Cost:
    """A thread per token: per hash its code and its run on the other side (a second run on its own
    side where that is not empty), then per colliding token its order, (weight,) and its rows (dv, d);
    ∇Q (side 'query') or ∇K and ∇V ('key') read and written once."""
    b = c.stats
    own = c.d if side == "query" else c.d + c.dv
    per_hash = 1 + 2 * c.search + b.hit * 2 * c.search + b.per_query * ((2 if side == "query" else 1) + c.dv + c.d)
    loaded = c.pairs * c.n * 4 * per_hash + c.B * c.n * 4 * (c.dv + own + (1 if side == "key" else 0))
    stored = c.B * c.n * 4 * own
    dram = c.B * c.n * 4 * (c.d + c.dv + 2 * own) + c.pairs * c.n * 12
    flops = c.pairs * c.n * b.per_query * (2 * c.dv + 2 * c.d + (c.dv if side == "key" else 0))
    return Cost(f"{side}_gradients", loaded, stored, dram, flops)


def yoso_forward(c: Call) -> List[Cost]:
    return [fast_hash(c), sort(c, 1), bucket_rows(c), gather_rows(c)]


def yoso_backward(c: Call) -> List[Cost]:
    """The default backward (exact pair weights), its own sorts of both sides' codes."""
    return [sort(c, 2), heavy_tables(c), token_gradients(c, "query"), token_gradients(c, "key")]


def sdpa(c: Call, backward: bool) -> Cost:
    """FlashAttention: 4 n² d FLOPs forward, 2.5× that backward, on bf16 tensor cores; Q, K, V, O
    (and dO, dQ, dK, dV) through DRAM once."""
    flops = 4 * c.B * c.n**2 * c.d * (3.5 if backward else 1)
    dram = c.B * c.n * 2 * (4 * c.d) * (2.5 if backward else 1)
    return Cost("SDPA", 0, 0, dram, flops, tensor=True)


def eager(c: Call, backward: bool) -> Cost:
    """Eager softmax: scores and probabilities n × n in bf16 through DRAM (written, read by softmax,
    written, read by the second matmul: 8 n² bytes forward; ~3× that with the backward)."""
    flops = 4 * c.B * c.n**2 * c.d * (3 if backward else 1)
    dram = c.B * c.n**2 * 8 * (3 if backward else 1)
    return Cost("eager softmax", 0, 0, dram, flops, tensor=True)


def total(costs: List[Cost]) -> float:
    return sum(cost.seconds for cost in costs)


@dataclass(frozen=True)
class Model:
    name: str
    batch: int
    n: int
    layers: int
    heads: int
    head_dim: int
    dim: int
    ff: int
    towers: int = 1  # retrieval encodes two documents per example


REFERENCE_MODEL = dict(layers=2, heads=2, head_dim=32, dim=64, ff=128)  # conf/model/reference.yaml
MODELS = [
    Model("ListOps", 32, 2048, **REFERENCE_MODEL),
    Model("Text", 32, 4096, **REFERENCE_MODEL),
    Model("Retrieval", 32, 4096, towers=2, **REFERENCE_MODEL),
    Model("Image", 256, 1024, **REFERENCE_MODEL),
    Model("Pathfinder", 256, 1024, **REFERENCE_MODEL),
    Model("efficiency model (4,096)", 1, 4096, layers=6, heads=4, head_dim=64, dim=256, ff=1024),
]


def dense_step(model: Model) -> float:
    """The rest of a training step, per layer: the linear layers (bf16 tensor cores, forward and
    backward 3× the forward's 2·tokens·(4 dim² + 2 dim·ff) FLOPs) and about 40 passes of bf16
    activations (tokens × max(dim, ff)) through DRAM for norms, activations, residuals and the optimizer."""
    tokens = model.batch * model.towers * model.n
    flops = 3 * 2 * tokens * (4 * model.dim**2 + 2 * model.dim * model.ff)
    return model.layers * max(flops / BF16_TENSOR_FLOPS, 40 * tokens * 2 * max(model.dim, model.ff) / HBM_BYTES_PER_S)


def step_projection(model: Model) -> Dict[str, float]:
    call = Call(model.batch * model.towers * model.heads, model.n, model.head_dim, model.head_dim)
    rest = dense_step(model)
    return {"yoso": model.layers * total(yoso_forward(call) + yoso_backward(call)) + rest,
            "sdpa": model.layers * sdpa(call, True).seconds + rest,
            "eager": model.layers * eager(call, True).seconds + rest}


def kernel_table(call: Call) -> str:
    lines = ["| kernel | issued MB (loads + stores) | DRAM MB | GFLOP | bound µs | bound by |",
             "|:--|--:|--:|--:|--:|:--|"]
    for phase, costs in (("forward", yoso_forward(call)), ("backward", yoso_backward(call))):
        for cost in costs:
            limits = {"load/store units": (cost.loaded + cost.stored) / LSU_BYTES_PER_S,
                      "DRAM": cost.dram_bytes / HBM_BYTES_PER_S, "FP32": cost.flops / FP32_FLOPS}
            lines.append(f"| {phase}: {cost.kernel} | {(cost.loaded + cost.stored) / 1e6:,.1f} | "
                         f"{cost.dram_bytes / 1e6:,.1f} | {cost.flops / 1e9:,.2f} | {cost.seconds * 1e6:,.1f} | "
                         f"{max(limits, key=limits.get)} |")
    return "\n".join(lines)


def sweep_table(name: str, batch_heads: int, d: int, lengths: List[int]) -> str:
    lines = [f"**{name}** (batch·heads {batch_heads}, head dim {d}, YOSO-32, τ = ⌈log2 n⌉), lower bounds in ms:", "",
             "| n | YOSO fwd | YOSO fwd+bwd | SDPA fwd | SDPA fwd+bwd | eager fwd+bwd | YOSO ÷ SDPA (fwd+bwd) |",
             "|--:|--:|--:|--:|--:|--:|--:|"]
    crossover = None
    for n in lengths:
        call = Call(batch_heads, n, d, d)
        forward, both = total(yoso_forward(call)), total(yoso_forward(call) + yoso_backward(call))
        flash = sdpa(call, True).seconds
        if crossover is None and both < flash:
            crossover = n
        lines.append(f"| {n:,} | {forward * 1e3:.3f} | {both * 1e3:.3f} | {sdpa(call, False).seconds * 1e3:.3f} | "
                     f"{flash * 1e3:.3f} | {eager(call, True).seconds * 1e3:.3f} | {both / flash:.2f} |")
    lines += ["", f"Projected crossover (YOSO fwd+bwd below SDPA's): n = {crossover:,}" if crossover else
              "Projected crossover: none in this range"]
    return "\n".join(lines)


def step_table() -> str:
    lines = ["| run | batch × n | layers | YOSO-32 step ms | SDPA step ms | eager step ms |", "|:--|--:|--:|--:|--:|--:|"]
    for model in MODELS:
        projected = step_projection(model)
        lines.append(f"| {model.name} | {model.batch * model.towers} × {model.n:,} | {model.layers} | "
                     f"{projected['yoso'] * 1e3:.2f} | {projected['sdpa'] * 1e3:.2f} | {projected['eager'] * 1e3:.2f} |")
    return "\n".join(lines)


def report(lengths: List[int]) -> str:
    listops = Call(32 * 2, 2048, 32, 32)
    parts = [
        "# YOSO on an H100, on paper (a projection until measured)", "", __doc__.split("\n\n", 1)[1].strip(), "",
        "## Per kernel, one attention call of the ListOps reference model (batch 32 × 2 heads, n = 2,048, head dim 32)",
        "", kernel_table(listops), "",
        "## Against n", "", sweep_table("efficiency model attention", 4, 64, lengths), "",
        sweep_table("BERT-base attention module", 12, 64, lengths), "",
        sweep_table("batch·heads 16, head dim 32 (yoso_speed's default)", 16, 32, lengths), "",
        "## Projected training step (attention of every layer + linear layers and activations)", "", step_table(),
    ]
    return "\n".join(parts) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lra.benchmarks.yoso_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=_length, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    text = report(args.lengths)
    print(text, end="")
    if args.out:
        from lra.io import atomic_write_text

        try:
            atomic_write_text(args.out, text)
        except OSError as exc:
            parser.exit(1, f"error: cannot write {args.out} ({exc.strerror}); give --out a path in a folder that "
                           "exists and that you may write to\n")


def _length(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value}: a sequence length must be at least 2")
    return value


if __name__ == "__main__":
    main()
