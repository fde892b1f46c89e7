"""The fixed sparse patterns' speed: FlexAttention against their eager paths and dense SDPA.

    python -m lra.benchmarks.sparse_speed [--device cpu|cuda] [--lengths 4096 8192 16384] [--patterns ...]

For each pattern (the LRA presets' options: Local strided and contiguous, b = 50; Longformer, window 128,
one global token; BigBird, blocks of 64, 3 random; Sparse Transformer, l = 50, c = 10, CLS) and length, at
batch·heads 16 × head_dim 32 in fp32 (one sequence of 16 heads):

- density: the fraction of the n² (query, key) pairs the pattern attends (strided Local: counted on its
  padded sequence), and "blocks computed": the pairs of the 128 × 128 blocks FlexAttention computes, as a
  fraction of n² too (Sparse Transformer's strip of gathered summaries included);
- the block mask's cost, reported apart from the attention: building the pattern's tables (once per
  shape, cached) and folding a batch's padding into them (every call);
- the time of the Flex path (its first call, Inductor's compile included, apart), of the eager path and
  of dense SDPA at the same precision: forward + backward on CUDA; forward only on a CPU, where
  FlexAttention has no backward and runs an unfused reference (a check of the plumbing, not a speed);
- Flex ÷ (density × SDPA): 1.0 is dense SDPA's speed per attended pair (the target is ≤ 1.3 at n ≥ 4,096),
  and the TFLOP/s the Flex path achieves on the attended pairs (4·d flops a pair forward, at least twice
  that backward: lra.benchmarks.peaks), a row above the GPU's datasheet peak failing (its timing is wrong).

Times are :mod:`lra.profiling.measure`'s: the best of ``--repeats`` synchronized calls after a warm-up.
Rows print as JSON lines as they are measured, the table at the end (``--out`` writes it too).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from lra.benchmarks import peaks
from lra.commands.config_errors import at_the_edge
from lra.io import atomic_write_text
from lra.profiling.measure import best_of, timed

PATTERNS = {  # name: (backend, options as the presets set them)
    "local (strided, LRA)": ("local", {"block_size": 50, "grouping": "strided"}),
    "local (contiguous)": ("local", {"block_size": 50}),
    "longformer": ("longformer", {"window_size": 128, "num_global_tokens": 1}),
    "bigbird": ("bigbird", {"block_size": 64, "num_random_blocks": 3, "seed": 0}),
    "sparse_transformer": ("sparse_transformer", {"block_size": 50, "summary_size": 10, "cls_token": True}),
}


def measure(pattern: str, n: int, device: str, heads: int, head_dim: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    import attention_zoo
    from attention_zoo import _flex

    backend, options = PATTERNS[pattern]
    torch.manual_seed(0)
    dev = torch.device(device)
    flex, eager = (attention_zoo.build(backend, num_heads=heads, head_dim=head_dim, max_seq_len=n, impl=impl,
                                       **options).to(dev) for impl in ("flex", "eager"))
    flex.load_state_dict(eager.state_dict())
    backward = dev.type == "cuda"
    q, k, v = (torch.randn(1, heads, n, head_dim, device=dev, requires_grad=backward) for _ in range(3))
    mask = torch.ones(1, n, dtype=torch.bool, device=dev)

    shape = flex.flex_pattern(n)
    pairs = _flex.allowed_pairs(shape, dev) * (heads // shape.heads)
    density = pairs / (heads * n * n)
    _flex.clear_cache()
    tables, build_s = timed(lambda: _flex.block_tables(shape, dev), dev)
    blocks = int(tables.needed.sum()) * (heads // shape.heads) * _flex.BLOCK**2 / (heads * n * n)
    real = torch.ones(1, shape.key_length, dtype=torch.bool, device=dev) if shape.folds_padding else None
    fold_s = best_of(lambda: _flex.block_mask(tables, real), dev, repeats)

    def call(module):
        def step():
            out = module(q, k, v, mask)
            if backward:
                out.sum().backward()
            return out
        return step

    def sdpa():
        out = F.scaled_dot_product_attention(q, k, v)
        if backward:
            out.sum().backward()

    with torch.set_grad_enabled(backward):
        _, first_s = timed(call(flex), dev)
        flex_s = best_of(call(flex), dev, repeats)
        eager_s = best_of(call(eager), dev, repeats)
        sdpa_s = best_of(sdpa, dev, repeats)
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    achieved = peaks.rates(device_name, flex_s, flops=peaks.attention_flops(pairs, head_dim, backward))
    return {"pattern": pattern, "n": n, "device": device, "pass": "forward + backward" if backward else "forward",
            "density": density, "blocks_computed": blocks, "mask_build_ms": build_s * 1e3,
            "mask_per_call_ms": fold_s * 1e3, "flex_first_call_s": first_s, "flex_ms": flex_s * 1e3,
            "eager_ms": eager_s * 1e3, "sdpa_ms": sdpa_s * 1e3, "flex_vs_ideal": flex_s / (density * sdpa_s),
            "flex_tflops": achieved["tflops"]}


def report(rows) -> str:
    frame = pd.DataFrame([row for row in rows if "error" not in row])
    failed = [row for row in rows if "error" in row]
    columns = {"pattern": "pattern", "n": "n", "density": "density", "blocks_computed": "blocks computed",
               "mask_build_ms": "mask build (ms, once)", "mask_per_call_ms": "mask per call (ms)",
               "flex_first_call_s": "Flex first call (s)", "flex_ms": "Flex (ms)", "eager_ms": "eager (ms)",
               "sdpa_ms": "SDPA dense (ms)", "flex_vs_ideal": "Flex ÷ (density × SDPA)", "flex_tflops": "Flex TFLOP/s"}
    parts = []
    if len(frame):
        passes = ", ".join(sorted(set(frame["pass"])))
        parts.append(f"{passes} on {', '.join(sorted(set(frame['device'])))}, fp32\n\n"
                     + frame[list(columns)].rename(columns=columns).to_markdown(index=False, floatfmt=".3g"))
    parts += [f"- {row['pattern']} at n = {row['n']}: {row['error']}" for row in failed]
    return "\n\n".join(parts)


@at_the_edge
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="default 4096 8192 16384 on cuda, 1024 2048 on cpu (its Flex is dense)")
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    lengths = args.lengths or ([4096, 8192, 16384] if args.device == "cuda" else [1024, 2048])
    for value, name in ((min(lengths), "--lengths"), (args.heads, "--heads"), (args.head_dim, "--head-dim"),
                        (args.repeats, "--repeats")):
        if value < 1:
            parser.error(f"{name} {value}: it must be >= 1")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    measure(args.patterns[0], 256, args.device, args.heads, args.head_dim, 1)  # the process's first-time costs, not a row
    rows = []
    for pattern in args.patterns:
        for n in lengths:
            try:
                row = measure(pattern, n, args.device, args.heads, args.head_dim, args.repeats)
            except Exception as exc:  # noqa: BLE001 - a failed cell is a row; the command then exits 1
                row = {"pattern": pattern, "n": n, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = report(rows)
    print(table)
    if args.out:
        atomic_write_text(args.out, table + "\n")
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
