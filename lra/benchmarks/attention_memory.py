"""Peak memory of one attention forward + backward vs. sequence length (a benchmark, not a test).

    python -m lra.benchmarks.attention_memory [--n 8192] [--backends ...]

Each measurement runs in a fresh subprocess: its peak resident set size above the baseline taken
after the inputs are built (CPU), or the allocator's peak (CUDA). The reference is *eager* softmax,
which materialises the n × n scores (torch's fused SDPA kernels would not). Shapes: batch 1,
2 heads of 32 (the reference LRA model); backends at their preset options unless given.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import pandas as pd

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
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = attend(q, k, v, mask)
    loss = out.square().sum()
    if getattr(attend, "aux_loss", None) is not None:
        loss = loss + attend.aux_loss
    loss.backward()
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    return {"backend": name, "n": n, "peak_mb": peak / 2**20}


def measure_in_subprocess(name: str, n: int, device: str, heads: int, head_dim: int) -> dict:
    command = [sys.executable, "-m", "lra.benchmarks.attention_memory", "--one", name, "--n", str(n),
               "--device", device, "--heads", str(heads), "--head-dim", str(head_dim)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        reason = "out of memory" if "out of memory" in result.stderr.lower() else result.stderr.strip().splitlines()[-1]
        return {"backend": name, "n": n, "peak_mb": None, "error": reason}
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_forked(names, n: int, heads: int, head_dim: int) -> list:
    """CPU: one process imports torch once and forks a child per backend, each measuring from its own
    baseline (a forked child starts with its parent's pages; the measure is its growth above them)."""
    import torch  # noqa: F401  (imported before the forks, so that each child does not pay for it)

    import attention_zoo  # noqa: F401

    rows = []
    for name in names:
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read_end)
            try:
                row = measure_one(name, n, "cpu", heads, head_dim)
            except BaseException as error:  # noqa: BLE001 - reported to the parent as this backend's row
                reason = "out of memory" if "memory" in str(error).lower() else f"{type(error).__name__}: {error}"
                row = {"backend": name, "n": n, "peak_mb": None, "error": reason}
            os.write(write_end, json.dumps(row).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            answer = pipe.read()
        _, status = os.waitpid(child, 0)
        rows.append(json.loads(answer) if answer else
                    {"backend": name, "n": n, "peak_mb": None, "error": f"killed (wait status {status})"})
    return rows


def table(backends, n: int, device: str = "cpu", heads: int = 2, head_dim: int = 32) -> pd.DataFrame:
    names = [EAGER, *backends]
    if device == "cpu":  # one helper process (fresh, so its own peak is small) forks a child per backend
        command = [sys.executable, "-m", "lra.benchmarks.attention_memory", "--forked", ",".join(names),
                   "--n", str(n), "--heads", str(heads), "--head-dim", str(head_dim)]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        rows = json.loads(result.stdout.strip().splitlines()[-1])
    else:
        rows = [measure_in_subprocess(name, n, device, heads, head_dim) for name in names]
    frame = pd.DataFrame(rows).set_index("backend")
    frame["vs_eager_softmax"] = frame["peak_mb"] / frame.loc[EAGER, "peak_mb"]
    return frame


def main(argv=None) -> None:
    import attention_zoo

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--backends", nargs="+", default=[b for b in attention_zoo.names()])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--forked", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.forked:
        print(json.dumps(measure_forked(args.forked.split(","), args.n, args.heads, args.head_dim)))
        return
    if args.one:
        print(json.dumps(measure_one(args.one, args.n, args.device, args.heads, args.head_dim)))
        return
    frame = table(args.backends, args.n, args.device, args.heads, args.head_dim)
    print(f"peak memory of forward + backward, n = {args.n}, batch 1, {args.heads} heads of {args.head_dim}, {args.device}")
    print(frame.round(3).to_markdown())


if __name__ == "__main__":
    main()
