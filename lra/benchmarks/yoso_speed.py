"""YOSO kernel benchmark: forward and forward+backward time and peak memory against softmax.

    python -m lra.benchmarks.yoso_speed [--device cpu|cuda] [--lengths 512 1024 ...]

Cells (batch·heads 16, head_dim 32 by default): eager softmax (materialises n × n) and PyTorch's
SDPA, each in fp32 and under bf16 autocast (fp32 inputs, the matmuls and SDPA in bf16, as a training
step under ``trainer.precision=bf16`` with ``model.attention_fp32=false`` runs them: on an H100 only
the bf16 SDPA cell is FlashAttention), YOSO-m on the compiled kernels for m = 16, 32, 64 (asked for by
``impl=cpu|cuda``: where they cannot be built the cell fails rather than time the PyTorch fallback; the
backward with the paper's exact per-pair weights), YOSO-32 with the cheaper 4-projection backward,
YOSO-32 on the vectorized pure-PyTorch implementation (``impl=torch``), YOSO-32 under torch's
deterministic algorithms (the trainer's default: the kernels' sorted, bitwise repeatable paths; the other
YOSO cells take the atomic ones), and on CUDA YOSO-32 with its
forward and backward each replayed as a CUDA graph (``torch.cuda.make_graphed_callables``: what
``trainer.compile_mode=reduce-overhead`` buys, the host's Python, dispatch and launches taken out; its
peak memory counts the graphs' pools, from before their capture); the YOSO cells run in
fp32 (its kernels are fp32), YOSO-32 (bf16 rows) with the rows its kernels read in bf16 (``bf16_rows``: half
their bytes, every sum in fp32). Every table says each cell's precision. The bf16 cells are in the
default set on CUDA only (bf16 autocast on a CPU is slow and not how the CPU runs train); ask for
them with ``--cells``. Times and peak memory (of one forward + backward) are measured as
:mod:`lra.profiling.measure` defines them (the best of ``--repeats`` runs after one warm-up; the
highest point of torch's tensors above the start). On CPU each cell runs in a fresh subprocess; on
CUDA all cells run in one process (no process start-up per cell). An out-of-memory cell is recorded,
not fatal; any other error of a cell is a recorded row too, and the command then exits 1. Rows are
printed as they are measured (a cut run keeps them), the tables by n at the end. Each row also gives the
rate it implies from a lower bound of its work (softmax: its pairs' products; every cell: the 8 tensors
of n × d it reads or writes), checked against the GPU's datasheet peaks (lra.benchmarks.peaks): a rate
above them fails the cell, loudly (its timing is wrong)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import pandas as pd

from lra.commands.config_errors import at_the_edge
from lra.benchmarks import peaks
from lra.determinism import deterministic_algorithms
from lra.io import atomic_write_text, check_output_file
from lra.profiling.measure import MB, best_of, run_cell, step_peak_bytes

BF16 = "bf16 autocast"
CELLS = {  # name: (kind, backend options, precision)
    "softmax (eager)": ("eager", {}, "fp32"),
    "softmax (eager, bf16)": ("eager", {}, BF16),
    "softmax (SDPA)": ("sdpa", {}, "fp32"),
    "softmax (SDPA, bf16)": ("sdpa", {}, BF16),
    "YOSO-16": ("yoso", {"num_hashes": 16}, "fp32"),
    "YOSO-32": ("yoso", {"num_hashes": 32}, "fp32"),
    "YOSO-32 (p = 4)": ("yoso", {"num_hashes": 32, "backward_projections": 4}, "fp32"),
    "YOSO-64": ("yoso", {"num_hashes": 64}, "fp32"),
    "YOSO-32 (PyTorch)": ("yoso", {"num_hashes": 32, "impl": "torch"}, "fp32"),
    "YOSO-32 (CUDA graphs)": ("yoso", {"num_hashes": 32}, "fp32"),
    "YOSO-32 (deterministic)": ("yoso", {"num_hashes": 32}, "fp32"),
    "YOSO-32 (bf16 rows)": ("yoso", {"num_hashes": 32, "bf16_rows": True}, "fp32, bf16 rows"),
}
GRAPHED = {"YOSO-32 (CUDA graphs)"}  # CUDA only
# Under torch.use_deterministic_algorithms, as the trainer runs (trainer.deterministic, default true): the
# kernels' sorted single-writer paths, and torch's own deterministic choices around them.
DETERMINISTIC = {"YOSO-32 (deterministic)"}


def default_cells(device: str) -> list:
    """Every cell on CUDA; on a CPU every fp32 cell but the CUDA-graph one (bf16 autocast there is slow and
    not how CPU runs train; the CPU kernels read float32 rows, so bf16 rows only add the rounding there)."""
    return [name for name, (_, _, precision) in CELLS.items()
            if device == "cuda" or (precision == "fp32" and name not in GRAPHED)]


def measure(cell: str, n: int, device: str, batch_heads: int, head_dim: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    import attention_zoo

    kind, options, precision = CELLS[cell]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, batch_heads, n, head_dim, device=device, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, n, dtype=torch.bool, device=device)
    if kind == "eager":
        def attend(q, k, v, mask):
            return torch.softmax(q @ k.transpose(-1, -2) / head_dim**0.5, dim=-1) @ v
    elif kind == "sdpa":
        def attend(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v)
    else:  # a kernel cell asks for its device's kernels: impl=auto would time the PyTorch fallback under its name
        options = {"impl": torch.device(device).type, **options}
        attend = attention_zoo.build(kind, num_heads=batch_heads, head_dim=head_dim, max_seq_len=n, **options)
        attend = attend.to(device).train()
    graph_start = None
    if cell in GRAPHED:
        if device != "cuda":
            raise ValueError(f"{cell} needs a CUDA device")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        graph_start = torch.cuda.memory_allocated()
        attend = torch.cuda.make_graphed_callables(attend, (q, k, v, mask))

    def autocast():
        if precision == BF16:
            return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward():
        with autocast():
            return attend(q, k, v, mask)

    def forward_backward():
        with autocast():  # the loss inside autocast, the backward outside it, as a training step
            loss = attend(q, k, v, mask).float().square().sum()
        loss.backward()

    with deterministic_algorithms(cell in DETERMINISTIC):
        with torch.no_grad():  # the warm-up builds the kernels before anything is measured
            forward_s = best_of(forward, device, repeats)
        both = best_of(forward_backward, device, repeats)
        peak = (step_peak_bytes(forward_backward, device) if graph_start is None
                else torch.cuda.max_memory_allocated() - graph_start)
    device_name = torch.cuda.get_device_name(device) if device == "cuda" else None
    elements = batch_heads * n * head_dim  # q, k, v, out read or written; backward: the gradient and dq, dk, dv
    softmax = kind in ("eager", "sdpa")  # exact attention: every pair's products are a lower bound of its work
    achieved = peaks.rates(device_name, both, flops=peaks.attention_flops(batch_heads * n * n, head_dim, True) if softmax
                           else 0.0, bytes_moved=peaks.io_bytes(8, elements))
    return {"cell": cell, "n": n, "precision": precision, "forward_ms": forward_s * 1e3,
            "forward_backward_ms": both * 1e3, "peak_mb": peak / MB,
            "forward_backward_tflops": achieved["tflops"] if softmax else None,
            "forward_backward_gbps": achieved["gbps"]}


def error_row(cell: str, n: int, error, device: str = "cpu") -> dict:
    """A cell that did not measure: out of memory (``error`` a string) or failed (``error`` the exception)."""
    from attention_zoo._yoso_build import KernelUnavailable

    if isinstance(error, KernelUnavailable):
        text = (f"failed: the compiled YOSO kernels are unavailable: {error} (build them: lra-build-kernels {device}; "
                f"the PyTorch path is the cell 'YOSO-32 (PyTorch)')")
    else:
        text = error if isinstance(error, str) else f"failed: {type(error).__name__}: {error}"[:300]
    return {"cell": cell, "n": n, "precision": CELLS[cell][2], "error": text}


def measure_in_subprocess(cell: str, n: int, device: str, batch_heads: int, head_dim: int, repeats: int) -> dict:
    rows = run_cell("lra.benchmarks.yoso_speed", ["--one", cell, "--lengths", str(n), "--device", device,
                                                  "--batch-heads", str(batch_heads), "--head-dim", str(head_dim),
                                                  "--repeats", str(repeats)])
    return rows[-1] if "error" not in rows[-1] else error_row(cell, n, rows[-1]["error"])


def measure_here(cell: str, n: int, device: str, batch_heads: int, head_dim: int, repeats: int) -> dict:
    """A CUDA cell in this process; out of memory is a recorded row."""
    import gc

    import torch

    try:
        return measure(cell, n, device, batch_heads, head_dim, repeats)
    except torch.cuda.OutOfMemoryError:
        return error_row(cell, n, "out of memory")
    except Exception as exc:  # noqa: BLE001 - recorded, and main exits 1: the other cells' rows are kept
        return error_row(cell, n, exc, device)
    finally:
        gc.collect()
        torch.cuda.empty_cache()


ROW_HEADER = ("| cell | precision | n | forward (ms) | forward + backward (ms) | peak memory (MB) |\n"
              "|:--|:--|--:|--:|--:|--:|")


def row_line(row: dict) -> str:
    if "error" in row:
        return f"| {row['cell']} | {row['precision']} | {row['n']} | {row['error']} | | |"
    return (f"| {row['cell']} | {row['precision']} | {row['n']} | {row['forward_ms']:.2f} | "
            f"{row['forward_backward_ms']:.2f} | {row['peak_mb']:.0f} |")


def report(rows) -> str:
    frame = pd.DataFrame(rows)
    parts = []
    for column, title, digits in (
            ("forward_ms", "forward (ms)", ".0f"), ("forward_backward_ms", "forward + backward (ms)", ".0f"),
            ("peak_mb", "peak memory, forward + backward (MB)", ".0f"),
            ("forward_backward_tflops", "achieved TFLOP/s, forward + backward (softmax: 12·d a pair at least)", ".3g"),
            ("forward_backward_gbps", "achieved GB/s, forward + backward (8 tensors of n × d read or written at least)",
             ".3g")):
        if column not in frame or frame[column].isna().all():
            continue
        pivot = frame.pivot(index="cell", columns="n", values=column).reindex(list(dict.fromkeys(frame["cell"])))
        pivot = pivot.astype(object).where(pivot.notna(), None)  # printed as "–"
        pivot.insert(0, "precision", [CELLS[cell][2] for cell in pivot.index])
        parts.append(f"**{title}**\n\n" + pivot.to_markdown(floatfmt=digits, missingval="–"))  # out of memory or failed: the rows above say which
    return "\n\n".join(parts)


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--cells", nargs="+", default=None, choices=list(CELLS),
                        help="default: every cell on cuda, every fp32 cell on cpu")
    parser.add_argument("--batch-heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the raw rows here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for value, name in ((min(args.lengths), "--lengths"), (args.batch_heads, "--batch-heads"),
                        (args.head_dim, "--head-dim"), (args.repeats, "--repeats")):
        if value < 1:
            parser.error(f"{name} {value}: it must be >= 1")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.json is not None:
        if not args.json.strip():
            parser.error("--json is empty (an unset shell variable?); give --json a file, or leave it out")
        args.json = check_output_file(args.json, "--json")
    if args.one:  # a CPU cell in its own process: its failure is its row, as measure_here makes it on CUDA
        try:
            row = measure(args.one, args.lengths[0], args.device, args.batch_heads, args.head_dim, args.repeats)
        except Exception as exc:  # noqa: BLE001
            row = error_row(args.one, args.lengths[0], exc, args.device)
        print(json.dumps(row))
        return
    cells = args.cells or default_cells(args.device)
    rows = []
    cell_runner = measure_here if args.device == "cuda" else measure_in_subprocess
    print(ROW_HEADER, flush=True)
    for n in args.lengths:
        for cell in cells:
            rows.append(cell_runner(cell, n, args.device, args.batch_heads, args.head_dim, args.repeats))
            print(row_line(rows[-1]), flush=True)
            print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(rows, indent=1))
    print("\n" + report(rows))
    print("\n" + peaks.gate_note(torch.cuda.get_device_name() if args.device == "cuda" else None))
    failed = [row for row in rows if row.get("error", "out of memory") != "out of memory"]
    if failed:
        print(f"error: {len(failed)} cells failed: " + "; ".join(f"{r['cell']} at n = {r['n']}: {r['error']}"
                                                                  for r in failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
