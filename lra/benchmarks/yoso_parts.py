"""Where YOSO's time goes: one call of each compiled CPU/CUDA kernel, against n.

    python -m lra.benchmarks.yoso_parts [--lengths 2048 4096 8192] [--device cpu|cuda]

Columns: hashing one side (q or k) into m codes of τ = log2 n bits; the forward cumulation (one
weight channel); a cumulation with the lower-bound backward's 4 channels (∇Q or ∇K takes one each).
batch·heads 16, m = 32, head_dim 32 by default; best of ``--repeats`` after a warm-up.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd
import torch

from attention_zoo import _yoso_ops as ops
from attention_zoo.yoso import draw
from lra.commands.config_errors import at_the_edge
from lra.profiling.measure import best_of


def best_ms(step, device: str, repeats: int) -> float:
    return 1000 * best_of(step, device, repeats)


def measure(n: int, device: str, batch_heads: int, hashes: int, head_dim: int, repeats: int) -> dict:
    generator = torch.Generator().manual_seed(n)
    tau = math.ceil(math.log2(n))
    q, k = (torch.nn.functional.normalize(torch.randn(batch_heads, n, head_dim, generator=generator), dim=-1).to(device)
            for _ in range(2))
    v = torch.randn(batch_heads, n, head_dim, generator=generator).to(device)
    draws = draw(batch_heads, head_dim, head_dim, hashes, tau, "hadamard", 4, generator, device)
    codes_q, codes_k = (ops.fast_hash(x, draws.diagonals, hashes, tau, "kernel") for x in (q, k))
    ones = torch.ones(batch_heads, 1, 1, n, device=device)
    channels = torch.randn(batch_heads, hashes, 4, n, generator=generator).to(device)
    return {
        "n": n, "tau": tau,
        "hash one side (ms)": best_ms(lambda: ops.fast_hash(q, draws.diagonals, hashes, tau, "kernel"), device, repeats),
        "forward cumulation (ms)": best_ms(lambda: ops.cumulation(codes_q, codes_k, ones, ones, v, tau, "kernel"),
                                           device, repeats),
        "4-channel cumulation (ms)": best_ms(lambda: ops.cumulation(codes_q, codes_k, channels, channels, k, tau,
                                                                    "kernel"), device, repeats),
    }


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch-heads", type=int, default=16)
    parser.add_argument("--hashes", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if min(args.lengths) < 2:
        parser.error(f"--lengths {min(args.lengths)}: it must be >= 2 (τ = log2 n bits a code)")
    for value, name in ((args.batch_heads, "--batch-heads"), (args.hashes, "--hashes"), (args.head_dim, "--head-dim"),
                        (args.repeats, "--repeats")):
        if value < 1:
            parser.error(f"{name} {value}: it must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    ops.resolve_engine(args.device, torch.device(args.device))  # builds the kernels, or says why it cannot
    rows = [measure(n, args.device, args.batch_heads, args.hashes, args.head_dim, args.repeats) for n in args.lengths]
    print(pd.DataFrame(rows).round(1).to_markdown(index=False))


if __name__ == "__main__":
    main()
