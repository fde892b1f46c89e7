"""Where one YOSO forward + backward spends its time: per-step wall time and a torch.profiler table.

    python -m lra.benchmarks.yoso_trace --device cuda [--lengths 512 4096] [--num-hashes 32] [--deterministic]

For each n (batch·heads 16, head dim 32 by default, yoso_speed's shape): the wall time of a training
step of the attention module, queued (no synchronization between steps: the host's cost hides behind
the device's) and synchronized after each step, then the profiler's table of a few steps sorted by
device time (by CPU time on a CPU). A step whose queued time is well above the device's total is
host-bound: Python, dispatch and launches (docs/benchmarks.md, "YOSO on a GPU, measured").
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import attention_zoo
from attention_zoo.options import InvalidOption
from lra.commands.config_errors import at_the_edge
from lra.determinism import deterministic_algorithms
from lra.profiling.measure import synchronize, timed


def step_times(step, device: torch.device, steps: int) -> dict:
    """Milliseconds a step: ``steps`` steps queued back to back, and each followed by a synchronization."""
    def queued():
        for _ in range(steps):
            step()

    def synchronized():
        for _ in range(steps):
            step()
            synchronize(device)

    return {label: timed(work, device)[1] / steps * 1e3 for label, work in (("queued", queued),
                                                                           ("synchronized", synchronized))}


def trace(n: int, device: torch.device, batch_heads: int, head_dim: int, num_hashes: int, steps: int,
          rows: int, deterministic: bool = False) -> str:
    torch.manual_seed(0)
    module = attention_zoo.build("yoso", num_heads=batch_heads, head_dim=head_dim, max_seq_len=n,
                                 num_hashes=num_hashes).to(device).train()
    q, k, v = (torch.randn(1, batch_heads, n, head_dim, device=device, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, n, dtype=torch.bool, device=device)

    def step():
        module(q, k, v, mask).square().sum().backward()

    with deterministic_algorithms(deterministic):
        for _ in range(3):  # builds the kernels, warms the allocator
            step()
        times = step_times(step, device, steps)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as profiled:
            for _ in range(5):
                step()
            synchronize(device)
    path = "deterministic (sorted) paths" if deterministic else "atomic paths"
    sort_by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = profiled.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60)
    return (f"## n = {n}: {times['queued']:.3f} ms a step queued, {times['synchronized']:.3f} ms synchronized "
            f"(YOSO-{num_hashes}, {batch_heads} x {n} x {head_dim}, {path}, {steps} steps)\n\n5 steps profiled, by "
            f"{sort_by}:\n\n```\n{table}```\n")


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--batch-heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--num-hashes", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="steps timed each way")
    parser.add_argument("--rows", type=int, default=30, help="rows of each profiler table")
    parser.add_argument("--deterministic", action="store_true",
                        help="under torch's deterministic algorithms, as the trainer runs: the sorted kernels")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; --device cpu traces the CPU kernels")
    for value, name in ((args.steps, "--steps"), (args.rows, "--rows"), (min(args.lengths), "--lengths"),
                        (args.batch_heads, "--batch-heads"), (args.head_dim, "--head-dim"),
                        (args.num_hashes, "--num-hashes")):
        if value < 1:
            parser.error(f"{name} {value}: it must be >= 1")
    device = torch.device(args.device)
    print(f"# YOSO forward + backward, traced on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
          f" (torch {torch.__version__})\n", flush=True)
    for n in args.lengths:
        try:
            print(trace(n, device, args.batch_heads, args.head_dim, args.num_hashes, args.steps, args.rows,
                        args.deterministic), flush=True)
        except InvalidOption as exc:  # e.g. a length whose default hash code length is out of range
            parser.error(f"n = {n}: {exc}")


if __name__ == "__main__":
    main()
