"""The GPU cost of YOSO on paper: a cost model checked on the paper's GPU, fitted on one H100 trace.

    python -m lra.benchmarks.yoso_cost [--lengths 512 1024 ...] [--out FILE.md]
    python -m lra.benchmarks.yoso_cost --measured [--out FILE.md]

Every kernel a YOSO call launches is costed by lra.benchmarks.yoso_cost.gpu: a launch term, plus the
largest of the instruction-issue, DRAM, L2, L2-atomic, shared-memory, FP32 and dependent-latency (with
occupancy) terms; the host's side of a call (PyTorch's ops, eager or as CUDA graphs) by
lra.benchmarks.yoso_cost.host. The model is first applied to the YOSO authors' own CUDA design on the
paper's GPU (RTX 2080 Ti) at the paper's attention-module shapes (lra.benchmarks.yoso_cost.authors_kernels)
and compared with the paper's Table 4 (YOSO-16/32/64/128, forward and backward, n = 512 … 4,096); no
constant was fitted to that table. On an H100 five device constants and the host's time per op are fitted
on one committed trace (docs/gpu/2026-11-27b/trace.md, lra.benchmarks.yoso_cost.fit); ``--measured`` holds
the model against every committed H100 measurement, the others out of sample. The tables below project
this project's kernels (lra.benchmarks.yoso_cost.kernels) on an H100, the GPU's time of a call (its
kernels, as CUDA graphs approach it), on their deterministic sorted path and their atomic path, against
SDPA and eager softmax in bf16 at the throughput the FlashAttention papers measured on an H100
(lra.benchmarks.yoso_cost.softmax_h100). Codes are taken uniform (random q, k); trained models collide
more.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass, replace
from importlib import resources
from typing import Dict, List, Optional

from lra.benchmarks.yoso_cost import authors_kernels as paper
from lra.benchmarks.yoso_cost import kernels as project
from lra.benchmarks.yoso_cost import softmax_h100
from lra.benchmarks.yoso_cost import compare, measured
from lra.benchmarks.yoso_cost import ops as torch_ops
from lra.benchmarks.yoso_cost.call import Call
from lra.benchmarks.yoso_cost.gpu import H100, RTX_2080_TI, Kernel, Machine, bound, seconds

TABLE4 = resources.files("lra.results") / "paper_numbers" / "yoso_iclr_table4_attention_efficiency.csv"
DESIGNS = ("sorted", "atomic")  # csrc/yoso's deterministic path and its atomic one
LISTOPS = Call(32 * 2, 2048, 32, 32)  # the ListOps reference model's attention call: batch 32 × 2 heads


@dataclass(frozen=True)
class Cell:
    method: str
    n: int
    batch: int
    forward_ms: float
    backward_ms: float
    paper_forward_ms: float
    paper_backward_ms: float

    @property
    def ratios(self) -> tuple:
        return self.forward_ms / self.paper_forward_ms, self.backward_ms / self.paper_backward_ms


def calibration(methods: Optional[List[str]] = None, path=TABLE4,
                machine: Machine = RTX_2080_TI) -> List[Cell]:
    """The authors' design on the 2080 Ti, per instance, at every Table 4 cell of YOSO-m (and softmax)."""
    rows = [row for row in csv.reader(path.read_text().splitlines()) if row and not row[0].startswith("#")]
    header, cells = rows[0], []
    for row in rows[1:]:
        entry = dict(zip(header, row))
        method = entry["method"]
        if methods is not None and method not in methods or not (method.startswith("YOSO-") or method == "Softmax"):
            continue
        m = int(method.split("-")[1]) if method.startswith("YOSO-") else 0
        module = paper.Module(int(entry["seq_len"]), m, paper.batch_for(float(entry["training_peak_mb"])))
        forward = paper.yoso_forward(module, machine) if m else paper.softmax_forward(module, machine)
        backward = paper.yoso_backward(module, machine) if m else paper.softmax_backward(module, machine)
        cells.append(Cell(method, module.n, module.batch, total(forward, machine) / module.batch * 1e3,
                          total(backward, machine) / module.batch * 1e3, float(entry["forward_ms"]),
                          float(entry["backward_ms"])))
    return cells


def total(kernels: List[Kernel], machine: Machine = H100) -> float:
    return sum(seconds(k, machine) for k in kernels)


def kernels(c: Call, design: str, machine: Machine = H100) -> Dict[str, List[Kernel]]:
    """The forward's and the backward's kernels of ``design`` (one of DESIGNS), with PyTorch's work
    around the operator."""
    step = torch_ops.step(c, design == "atomic", machine)
    return {"forward": step.kernels("forward"), "backward": step.kernels("loss", "backward")}


def yoso_seconds(c: Call, design: str, machine: Machine = H100) -> Dict[str, float]:
    parts = kernels(c, design, machine)
    return {phase: total(ks, machine) for phase, ks in parts.items()}


def softmax_seconds(c: Call, kernel: str, machine: Machine = H100) -> Dict[str, float]:
    return {direction: softmax_h100.attention_seconds(kernel, c.B, c.n, c.d, direction, machine)
            for direction in ("forward", "backward")}


def calibration_table(cells: List[Cell]) -> str:
    lines = ["| method | n | batch | forward: model / paper ms | ratio | backward: model / paper ms | ratio |",
             "|:--|--:|--:|--:|--:|--:|--:|"]
    for cell in cells:
        f, b = cell.ratios
        lines.append(f"| {cell.method} | {cell.n:,} | {cell.batch} | {cell.forward_ms:.2f} / "
                     f"{cell.paper_forward_ms:.2f} | {f:.2f} | {cell.backward_ms:.2f} / "
                     f"{cell.paper_backward_ms:.2f} | {b:.2f} |")
    yoso = [r for cell in cells if cell.method.startswith("YOSO") for r in cell.ratios]
    if yoso:
        lines += ["", f"YOSO cells: model ÷ paper {min(yoso):.2f} … {max(yoso):.2f} over {len(yoso)} cells "
                      f"({'all' if all(0.5 <= r <= 1.5 for r in yoso) else 'NOT all'} within ±50 %)."]
    return "\n".join(lines)


TORCH_KERNELS = "PyTorch's kernels (elementwise, reductions, fills, copies)"


def _groups(c: Call, design: str, phases: tuple, machine: Machine) -> Dict[str, List[Kernel]]:
    """A phase's kernels by name: each YOSO kernel and torch's sort apart, PyTorch's other kernels together."""
    groups: Dict[str, List[Kernel]] = {}
    for op in torch_ops.step(c, design == "atomic", machine).ops:
        if op.phase in phases:
            for k in op.raw:
                groups.setdefault(k.name, []).append(k)
            for k in op.kernels:
                sort = k.name.startswith("sort codes (") and ":" not in k.name
                groups.setdefault(k.name if sort else TORCH_KERNELS, []).append(k)
    return groups


def transfer_line() -> str:
    """Table 4 again with the H100's fitted issue, latency and L2-atomic factors on the 2080 Ti (which
    otherwise keeps the neutral 1): how far the H100's fit carries to another GPU, not a fit."""
    turing = replace(RTX_2080_TI, **{name: getattr(H100, name)
                                     for name in ("issue_factor", "latency_factor", "atomic_sector_cost")})
    ratios = [r for cell in calibration(machine=turing) if cell.method.startswith("YOSO") for r in cell.ratios]
    return (f"With the H100's fitted issue, latency and L2-atomic factors (issue × {H100.issue_factor:.2f}, "
            f"latency × {H100.latency_factor:.2f}, an atomic sector {H100.atomic_sector_cost:.2f} sector-times) "
            f"instead of 1, the YOSO cells would be {min(ratios):.2f} … {max(ratios):.2f} × the paper.")


def listops_table(c: Call = LISTOPS, machine: Machine = H100) -> str:
    """Per kernel, on both paths, µs and the term that bounds it (PyTorch's own kernels together)."""
    lines = ["| phase | kernel | sorted µs | atomic µs |", "|:--|:--|--:|--:|"]
    for phase, phases in (("forward", ("forward",)), ("backward", ("loss", "backward"))):
        designs = {design: _groups(c, design, phases, machine) for design in DESIGNS}
        names = list(dict.fromkeys(name for design in DESIGNS for name in designs[design]))
        names.sort(key=lambda name: name == TORCH_KERNELS)
        for name in names:
            cells = []
            for design in DESIGNS:
                found = designs[design].get(name, [])
                launches = sum(k.launches for k in found)
                term = f"{bound(found[0], machine)}, " if found and name != TORCH_KERNELS else ""
                cells.append(f"{sum(seconds(k, machine) for k in found) * 1e6:,.0f} ({term}{launches} "
                             f"launch{'es' if launches > 1 else ''})" if found else "–")
            lines.append(f"| {phase} | {name} | " + " | ".join(cells) + " |")
        sums = [sum(seconds(k, machine) for ks in designs[design].values() for k in ks) * 1e6 for design in DESIGNS]
        lines.append(f"| {phase} | **total** | " + " | ".join(f"**{s:,.0f}**" for s in sums) + " |")
    both = [yoso_seconds(c, design, machine) for design in DESIGNS]
    lines.append("| both | **forward + backward** | " + " | ".join(f"**{sum(t.values()) * 1e3:.2f} ms**" for t in both)
                 + " |")
    return "\n".join(lines)


def sweep(batch_heads: int, d: int, lengths: List[int], m: int = 32, machine: Machine = H100) -> List[Dict[str, float]]:
    rows = []
    for n in lengths:
        c = Call(batch_heads, n, d, d, m)
        row = {"n": n, **{design: sum(yoso_seconds(c, design, machine).values()) for design in DESIGNS}}
        row["SDPA"] = sum(softmax_seconds(c, "flash2", machine).values())
        row["eager"] = sum(softmax_seconds(c, "standard", machine).values())
        row["eager_fits"] = softmax_h100.eager_bytes(batch_heads, n) < 80e9
        rows.append(row)
    return rows


def crossover(rows: List[Dict[str, float]], design: str) -> Optional[int]:
    """The first n from which ``design``'s forward + backward stays below SDPA's."""
    below = [row[design] < row["SDPA"] for row in rows]
    for i, row in enumerate(rows):
        if all(below[i:]):
            return row["n"]
    return None


def targets_table(machine: Machine = H100) -> str:
    """The kernels' H100 targets (measured there, in the GPU campaign) against the model: each call's GPU time on
    its faster path, what CUDA graphs approach; SDPA-bf16 at the published throughput the sweeps take."""
    rows = {row["n"]: row for row in sweep(16, 32, [4096, 8192, 16384], machine=machine)}
    best = {n: min(row[design] for design in DESIGNS) for n, row in rows.items()}
    listops = min(sum(yoso_seconds(LISTOPS, design, machine).values()) for design in DESIGNS)
    checks = [("YOSO-32 forward + backward at 16 × 4,096 × 32, captured, ≤ 0.8 ms", best[4096], 0.8e-3),
              ("… at 16 × 8,192 × 32 ≤ SDPA-bf16", best[8192], rows[8192]["SDPA"]),
              ("… at 16 × 16,384 × 32 ≤ 0.5 × SDPA-bf16", best[16384], 0.5 * rows[16384]["SDPA"]),
              ("the ListOps call (64 × 2,048 × 32) ≤ 1.5 ms", listops, 1.5e-3)]
    lines = ["| target (H100) | projected ms | bound ms | projected |", "|:--|--:|--:|:--|"]
    lines += [f"| {what} | {value * 1e3:.2f} | {bound * 1e3:.2f} | {'met' if value <= bound else 'missed'} |"
              for what, value, bound in checks]
    return "\n".join(lines)


def sweep_table(name: str, batch_heads: int, d: int, lengths: List[int]) -> str:
    rows = sweep(batch_heads, d, lengths)
    lines = [f"**{name}** (batch·heads {batch_heads}, head dim {d}, YOSO-32, τ = ⌈log2 n⌉), forward + backward "
             "in ms (a projection):", "",
             "| n | YOSO sorted | YOSO atomic | SDPA bf16 | eager bf16 | YOSO (best) ÷ SDPA | sorted ÷ atomic |",
             "|--:|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        best = min(row["sorted"], row["atomic"])
        eager = f"{row['eager'] * 1e3:,.3f}" if row["eager_fits"] else f"({row['eager'] * 1e3:,.0f}: > 80 GB)"
        lines.append(f"| {row['n']:,} | {row['sorted'] * 1e3:,.3f} | {row['atomic'] * 1e3:,.3f} | "
                     f"{row['SDPA'] * 1e3:,.3f} | {eager} | {best / row['SDPA']:.2f} | "
                     f"{row['sorted'] / row['atomic']:.2f} |")
    lines.append("")
    for design in DESIGNS:
        n = crossover(rows, design)
        text = f"n = {n:,}" if n else f"none up to n = {lengths[-1]:,}"
        if n and n != lengths[0]:
            previous = lengths[lengths.index(n) - 1]
            step = max(1, (n - previous) // 16)
            finer = crossover(sweep(batch_heads, d, list(range(previous, n + 1, step))), design)
            text += f" (between {previous:,} and {n:,}, steps of {step:,}: from n = {finer:,})"
        lines.append(f"- crossover with SDPA-bf16, YOSO {design}: {text}")
    return "\n".join(lines)


def paths_table(c: Call = LISTOPS, machine: Machine = H100) -> str:
    """The two paths against the code length τ at the ListOps call (n = 2,048): the atomic forward
    indexes rows by code while 2^τ ≤ 2n, and buckets shrink as τ grows."""
    lines = ["| τ | keys per bucket | sorted: forward / backward ms | atomic: forward / backward ms "
             "| sorted ÷ atomic |", "|--:|--:|--:|--:|--:|"]
    for tau in (8, 10, 11, 12, 14, 16, 20):
        call = Call(c.B, c.n, c.d, c.dv, c.m, tau)
        sorted_, atomic = (yoso_seconds(call, design, machine) for design in DESIGNS)
        lines.append(f"| {tau} | {call.stats.per_query:.3g} | {sorted_['forward'] * 1e3:.2f} / "
                     f"{sorted_['backward'] * 1e3:.2f} | {atomic['forward'] * 1e3:.2f} / "
                     f"{atomic['backward'] * 1e3:.2f} | {sum(sorted_.values()) / sum(atomic.values()):.2f} |")
    vector, scalar = (seconds(project.scatter_pairs(c, machine, vector_atomics=v), machine) for v in (True, False))
    sorted_total = sum(yoso_seconds(c, "sorted", machine).values())
    atomic_total = sum(yoso_seconds(c, "atomic", machine).values())
    scalar_total = atomic_total - vector + scalar
    lines += ["", f"What float4 atomics buy: the atomic backward's kernel adds a row with one float4 atomicAdd per "
                  f"lane on sm_90 (a 128-byte row, 4 sector updates): {vector * 1e6:,.0f} µs at τ = {c.bits}. With "
                  f"4-byte atomics, as before a63867c and as built for GPUs before sm_90 (16 sector updates), it "
                  f"would take {scalar * 1e6:,.0f} µs, and the atomic call {scalar_total * 1e3:.2f} ms instead of "
                  f"{atomic_total * 1e3:.2f} (sorted: {sorted_total * 1e3:.2f})."]
    return "\n".join(lines)


def bf16_table(lengths: List[int], machine: Machine = H100) -> str:
    """What bf16 rows (attention.bf16_rows) would buy: the ListOps call and yoso_speed's default shape, forward +
    backward, with float32 and with bfloat16 rows (half the row bytes, the rounding's casts added)."""
    lines = ["| call | float32 rows: sorted / atomic ms | bf16 rows: sorted / atomic ms | bf16 ÷ float32 (best) |",
             "|:--|--:|--:|--:|"]
    calls = [("ListOps (64 × 2,048 × 32, τ = 11)", LISTOPS)]
    calls += [(f"16 × {n:,} × 32", Call(16, n, 32, 32, 32)) for n in lengths if n >= 4096]
    for name, call in calls:
        times = [[sum(yoso_seconds(replace(call, bf16_rows=bf16), design, machine).values()) * 1e3
                  for design in DESIGNS] for bf16 in (False, True)]
        lines.append(f"| {name} | {times[0][0]:.2f} / {times[0][1]:.2f} | {times[1][0]:.2f} / {times[1][1]:.2f} | "
                     f"{min(times[1]) / min(times[0]):.2f} |")
    return "\n".join(lines)


SENSITIVE = ("dram_latency", "l2_latency", "l1_latency", "shared_latency", "l2_bytes_per_s", "atomic_sector_cost",
             "dram_efficiency", "gemm_efficiency", "launch_s", "issue_factor", "latency_factor", "shared_atomic_cycles")


def sensitivity_rows(lengths: List[int]) -> List[Dict]:
    """Each memory-system, efficiency, launch and fitted constant of both machines × 0.7 and × 1.3 (an
    efficiency at most 1; the latencies and L2 bandwidths are measured on sibling GPUs): the
    calibration's ratios, the ListOps call's GPU time (ms) per design and the BERT-base crossovers."""
    rows = []
    for field in SENSITIVE:
        for factor in (0.7, 1.3):
            ceiling = 1.0 if field.endswith("efficiency") else float("inf")
            turing, hopper = (replace(m, **{field: min(ceiling, getattr(m, field) * factor)})
                              for m in (RTX_2080_TI, H100))
            ratios = [r for cell in calibration(machine=turing) if cell.method.startswith("YOSO") for r in cell.ratios]
            listops = {design: sum(yoso_seconds(LISTOPS, design, hopper).values()) * 1e3 for design in DESIGNS}
            bert = sweep(12, 64, lengths, machine=hopper)
            rows.append({"constant": field, "factor": factor, "ratios": (min(ratios), max(ratios)), "listops": listops,
                         "crossovers": [crossover(bert, design) for design in DESIGNS]})
    return rows


def sensitivity(lengths: List[int]) -> str:
    lines = ["| constant | × | Table 4: model ÷ paper | ListOps call sorted / atomic (ms) "
             "| BERT-base crossover (sorted / atomic) |", "|:--|--:|--:|--:|--:|"]
    for row in sensitivity_rows(lengths):
        listops = " / ".join(f"{row['listops'][design]:.2f}" for design in DESIGNS)
        crossings = " / ".join(f"{n:,}" if n else "none" for n in row["crossovers"])
        lines.append(f"| {row['constant']} | {row['factor']} | {row['ratios'][0]:.2f} … {row['ratios'][1]:.2f} | "
                     f"{listops} | {crossings} |")
    return "\n".join(lines)


def report(lengths: List[int]) -> str:
    cells = calibration()
    parts = [
        "# YOSO's GPU cost: calibrated on the paper's GPU, projected on an H100", "",
        __doc__.split("\n\n", 2)[2].strip(), "",
        "## Calibration: the YOSO authors' kernels on an RTX 2080 Ti against the paper's Table 4", "",
        "Per-instance attention-module time (BERT-base: 12 heads of 64, dim 768), the model at the batch "
        "that fits 10 GiB at Table 4's training peak; softmax rows are a check of the GEMM and elementwise "
        "terms, not part of the calibration.", "", calibration_table(cells), "", transfer_line(), "",
        "## Projection: one ListOps reference attention call on an H100 (batch 32 × 2 heads, n = 2,048, "
        "head dim 32, m = 32), forward + backward, per kernel", "", listops_table(), "",
        "## The kernels' H100 targets against the model (a projection; the GPU campaign measures them)", "",
        targets_table(), "",
        "## Projection against n on an H100", "",
        sweep_table("BERT-base attention module", 12, 64, lengths), "",
        sweep_table("yoso_speed's default shape", 16, 32, lengths), "",
        "## Which path, where: the ListOps call against the code length τ (a projection)", "", paths_table(), "",
        "## bf16 rows (attention.bf16_rows): what half the row bytes buy (a projection)", "", bf16_table(lengths), "",
        "## Sensitivity: each latency, bandwidth, efficiency, launch and fitted constant 30 % off, on both machines",
        "",
        sensitivity(lengths), "",
    ]
    return "\n".join(parts) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lra.benchmarks.yoso_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=_length, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--out", default=None, help="also write the report here")
    parser.add_argument("--measured", action="store_true",
                        help="instead: the model against every committed H100 measurement (docs/gpu), per row "
                             "its file, projection, ratio and whether it was fitted or validated")
    args = parser.parse_args(argv)
    if args.out is not None:
        from lra.errors import UserError
        from lra.io import check_output_file

        if not args.out.strip():
            parser.error("--out is empty (an unset shell variable?); give --out a file, or leave it out")
        try:
            args.out = check_output_file(args.out, "--out")
        except UserError as exc:
            parser.exit(exc.exit_code, f"error: {exc}\n")
    if args.measured:
        try:
            text = compare.report(compare.rows())
        except measured.MissingMeasurements as exc:
            parser.exit(2, f"error: {exc}\n")
    else:
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
