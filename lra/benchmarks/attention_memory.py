"""Peak memory of one attention forward + backward vs. sequence length (a benchmark, not a test).

    python -m lra.benchmarks.attention_memory [--n 8192] [--backends ...]

The backends are measured one after another in a fresh subprocess, each after one warm-up: the highest point torch's tensors
reach during one forward + backward above where they started, on either device
(:mod:`lra.profiling.measure`). The reference is *eager* softmax,
which materialises the n × n scores (torch's fused SDPA kernels would not). Shapes: batch 1,
2 heads of 32 (the reference LRA model); backends at their preset options unless given.
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from lra.profiling.measure import MB, run_cell, step_peak_bytes

EAGER = "softmax_eager"


def measure_one(name: str, n: int, device: str, heads: int, head_dim: int) -> dict:
    import torch

    import attention_zoo

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim, device=device, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, n, dtype=torch.bool, device=device)
    if name == EAGER:
        def attend(q, k, v, mask):
            return torch.softmax(q @ k.transpose(-1, -2) / head_dim**0.5, dim=-1) @ v
    else:
        attend = attention_zoo.build(name, num_heads=heads, head_dim=head_dim, max_seq_len=n).to(device).train()

    def forward_backward():
        out = attend(q, k, v, mask)
        loss = out.square().sum()
        if getattr(attend, "aux_loss", None) is not None:
            loss = loss + attend.aux_loss
        loss.backward()

    forward_backward()  # warm-up: kernels built, lazily created state made, before the peak is taken
    q.grad = k.grad = v.grad = None
    return {"backend": name, "n": n, "peak_mb": step_peak_bytes(forward_backward, device) / MB}


def measure_in_subprocess(name: str, n: int, device: str, heads: int, head_dim: int) -> dict:
    return measure_cells([name], n, device, heads, head_dim)[0]


def measure_cells(names, n: int, device: str, heads: int, head_dim: int) -> list:
    """One row per backend, measured one after another in one fresh process (each peak is taken above
    its own start, so they do not disturb each other); a crash or an out-of-memory kill is the row of
    every backend it left unmeasured."""
    rows = run_cell("lra.benchmarks.attention_memory", ["--one", ",".join(names), "--n", str(n), "--device", device,
                                                        "--heads", str(heads), "--head-dim", str(head_dim)])
    measured = {row["backend"]: row for row in rows if "backend" in row}
    reason = next((row["error"] for row in rows if "backend" not in row), "no result")
    return [measured.get(name, {"backend": name, "n": n, "peak_mb": None, "error": reason}) for name in names]


def table(backends, n: int, device: str = "cpu", heads: int = 2, head_dim: int = 32) -> pd.DataFrame:
    frame = pd.DataFrame(measure_cells([EAGER, *backends], n, device, heads, head_dim)).set_index("backend")
    frame["vs_eager_softmax"] = frame["peak_mb"] / frame.loc[EAGER, "peak_mb"]
    return frame


def main(argv=None) -> None:
    import attention_zoo

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--backends", nargs="+", default=[b for b in attention_zoo.names()],
                        choices=attention_zoo.names(), metavar="NAME", help="default: every registered backend")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for value, name in ((args.n, "--n"), (args.heads, "--heads"), (args.head_dim, "--head-dim")):
        if value < 1:
            parser.error(f"{name} {value}: it must be >= 1")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.one:
        for name in args.one.split(","):
            print(json.dumps(measure_one(name, args.n, args.device, args.heads, args.head_dim)), flush=True)
        return
    frame = table(args.backends, args.n, args.device, args.heads, args.head_dim)
    print(f"peak memory of forward + backward, n = {args.n}, batch 1, {args.heads} heads of {args.head_dim}, {args.device}")
    print(frame.round(3).to_markdown())
    failed = frame[frame["peak_mb"].isna()]
    if len(failed):
        reasons = failed["error"] if "error" in failed else ["no result"] * len(failed)
        parser.exit(1, f"error: {len(failed)} backends failed: "
                       + "; ".join(f"{name}: {reason}" for name, reason in zip(failed.index, reasons)) + "\n")


if __name__ == "__main__":
    main()
