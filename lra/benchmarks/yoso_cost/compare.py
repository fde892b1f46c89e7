"""Every committed H100 measurement the cost model is held against, beside the model's number for it.

A :class:`Row` names its file (under docs/gpu), what it measures and its role: ``fitted`` (the calibration
trace's rows that :mod:`.fit` fits the H100's constants on), ``validated`` (out of sample: no fitted
constant sees it) or ``not compared`` with the reason (a kernel main no longer has). Per trace (one
training step of YOSO-32 at 16 × 4,096 × 32, seconds a step): each YOSO kernel the profiler lists, the
YOSO operators' other kernels, PyTorch's own kernels (the rest of the GPU time), every kernel together,
and the step's wall time queued and synchronized. Per kernel benchmark (seconds a call): YOSO-32 eager
and as CUDA graphs, forward (without autograd) and forward + backward, at every n it measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Sequence

from lra.benchmarks.yoso_cost import host, measured
from lra.benchmarks.yoso_cost import ops as torch_ops
from lra.benchmarks.yoso_cost.gpu import H100, Kernel, Machine, seconds

# The model's kernel per profiler kernel (measured.KERNELS' names).
MODEL_NAMES = {"fast_hash": ("fast_hash (q, k)",), "slice_lists": ("atomic: tokens listed by slice",),
               "table_cumulation": ("atomic: tables in shared memory",),
               "scatter_pairs": ("atomic: pairs added into ∇Q, ∇K, ∇V",), "bucket_rows": ("bucket_rows",),
               "gather_rows": ("gather_rows",), "query_gradients": ("query_gradients",),
               "key_gradients": ("key_gradients",), "torch sort": ("sort codes (k)", "sort codes (q, k)")}
# Kernels of a trace that main does not have: (file, kernel) -> why they are not compared.
OTHER_CODE = {("2026-11-27c/trace.md", "slice_lists"): "449b886's per-warp counters (a94d93d), not main's kernel"}
NOTES = {"2026-11-27b/kernels_bert.md": "12 heads × n × 64, at b899f77: its atomic forward listed each block's "
         "tokens by scanning the pair's codes (before d2dbcc1's slice lists); the model costs main's kernels.",
         "2026-11-27c/trace.md": "a94d93d: main's kernels but slice_lists (449b886's, undone in 8d945a2)."}
Model = Callable[[Machine, float], float]  # (machine, seconds per host op) -> seconds


@dataclass(frozen=True)
class Row:
    source: str
    what: str
    measured_s: float
    model: Model
    role: str  # fitted | validated | not compared: <why>

    def projected(self, machine: Machine = H100, host_op_s: float = host.HOST_OP_S) -> float:
        return self.model(machine, host_op_s)

    def ratio(self, machine: Machine = H100, host_op_s: float = host.HOST_OP_S) -> float:
        return self.projected(machine, host_op_s) / self.measured_s


def _named(kernels: Sequence[Kernel], names: Sequence[str], machine: Machine) -> float:
    return sum(seconds(k, machine) for k in kernels if k.name in names)


def trace_rows(source: str) -> List[Row]:
    t = measured.trace(source)
    call = measured.call_as_measured(source, t.batch_heads, t.n, t.head_dim, t.head_dim, t.m)
    atomic = t.atomic
    fitted = source == measured.CALIBRATION
    role = "fitted" if fitted else "validated"
    rows, known = [], {}
    for prefix, name in measured.KERNELS.items():
        found = t.row(prefix)
        if found is None:
            continue
        known[name] = found[0] / t.profiled_steps
        why = OTHER_CODE.get((source, name))
        rows.append(Row(source, f"{name} ({found[3] // t.profiled_steps} a step)", known[name],
                        lambda m, h, names=MODEL_NAMES[name]: _named(
                            torch_ops.step(call, atomic, m).kernels(), names, m),
                        f"not compared: {why}" if why else role))
    operators = {part: t.cuda_per_step(prefix) for prefix, part in measured.OPERATORS.items()}
    inside = {"forward": ("slice_lists", "table_cumulation", "bucket_rows", "gather_rows"),
              "backward": ("scatter_pairs", "query_gradients", "key_gradients")}
    for part, op_name in (("forward", "yoso_cumulation (custom op)"), ("backward", "exact-weight kernels")):
        rest = operators[part] - sum(known.get(k, 0.0) for k in inside[part])
        excluded = tuple(n for k in inside[part] for n in MODEL_NAMES[k])
        if rest > 1e-6:
            rows.append(Row(source, f"the {part} operator's other kernels (run starts, heavy runs, memsets)", rest,
                            lambda m, h, op_name=op_name, excluded=excluded: sum(
                                seconds(k, m) for op in torch_ops.step(call, atomic, m).ops if op.name == op_name
                                for k in op.raw if k.name not in excluded), role))
    yoso_gpu = sum(operators.values()) + known.get("torch sort", 0.0)
    sorts = MODEL_NAMES["torch sort"]
    rows.append(Row(source, "PyTorch's kernels (elementwise, reductions, fills, the sorts' copies, cumsum)",
                    t.total_cuda_s / t.profiled_steps - yoso_gpu,
                    lambda m, h: sum(seconds(k, m) for op in torch_ops.step(call, atomic, m).ops for k in op.kernels
                                     if k.name not in sorts), role))
    rows.append(Row(source, "every kernel of a step", t.total_cuda_s / t.profiled_steps,
                    lambda m, h: host.device_seconds(torch_ops.step(call, atomic, m).ops, m),
                    "fitted (the sum of the rows above)" if fitted else role))
    rows.append(Row(source, "a step queued (wall)", t.queued_s, lambda m, h: host.queued_step(call, atomic, m, h),
                    role))
    rows.append(Row(source, "a step synchronized (wall)", t.synchronized_s,
                    lambda m, h: host.call_seconds(call, atomic, True, False, m, h), "validated"))
    return rows


CELLS = {"YOSO-32": (True, False), "YOSO-32 (CUDA graphs)": (True, True), "YOSO-32 (deterministic)": (False, False)}


def benchmark_rows(source: str) -> List[Row]:
    cells = measured.kernel_benchmark(source)
    batch_heads, d = measured.benchmark_shape(source)
    rows = []
    for (cell, n), (forward, both) in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0])):
        if cell not in CELLS:
            continue
        atomic, graphs = CELLS[cell]
        call = measured.call_as_measured(source, batch_heads, n, d, d, 32)
        for training, value, label in ((False, forward, "forward"), (True, both, "forward + backward")):
            rows.append(Row(source, f"{cell}, n = {n:,}, {label}", value,
                            lambda m, h, call=call, atomic=atomic, training=training, graphs=graphs: host.call_seconds(
                                call, atomic, training, graphs, m, h), "validated"))
    return rows


def rows() -> List[Row]:
    """Every row, the calibration trace's first."""
    return [row for source in measured.TRACES for row in trace_rows(source)] + [
        row for source in measured.BENCHMARKS for row in benchmark_rows(source)]


def compared(all_rows: Sequence[Row]) -> List[Row]:
    return [row for row in all_rows if not row.role.startswith("not compared")]


TARGET = (0.7, 1.4)  # the band every compared ratio (projected ÷ measured) is meant to fall in


def worst(all_rows: Sequence[Row]) -> tuple:
    ratios = [row.ratio() for row in compared(all_rows)]
    return min(ratios), max(ratios)


def report(all_rows: Sequence[Row]) -> str:
    """Per file, each measurement, the projection, their ratio and the row's role; then the misses and,
    last, ``worst ratio: <lowest>–<highest>`` over every compared row."""
    lines = ["# The cost model against the committed H100 measurements (projected ÷ measured)", "",
             f"H100 constants fitted on docs/gpu/{measured.CALIBRATION} (lra.benchmarks.yoso_cost.fit): "
             + ", ".join(f"{name} {getattr(H100, name):.3g}" for name in ("issue_factor", "latency_factor",
                                                                          "atomic_sector_cost", "shared_atomic_cycles"))
             + f", launch_s {H100.launch_s * 1e6:.2f} µs, a host op {host.HOST_OP_S * 1e6:.1f} µs. Trace rows are "
             "per training step (16 × 4,096 × 32, YOSO-32), kernel-benchmark rows per call."]
    for source in dict.fromkeys(row.source for row in all_rows):
        lines += ["", f"## docs/gpu/{source}", ""] + ([NOTES[source], ""] if source in NOTES else []) + [
            "| what | measured ms | projected ms | ratio | role |", "|:--|--:|--:|--:|:--|"]
        for row in (r for r in all_rows if r.source == source):
            lines.append(f"| {row.what} | {row.measured_s * 1e3:,.3f} | {row.projected() * 1e3:,.3f} | "
                         f"{row.ratio():.2f} | {row.role} |")
    rows_in = compared(all_rows)
    outside = [row for row in rows_in if not TARGET[0] <= row.ratio() <= TARGET[1]]
    fitted = [row for row in rows_in if row.role.startswith("fitted")]
    validated = [row for row in rows_in if row.role == "validated"]
    lines += ["", f"{len(rows_in)} rows compared ({len(fitted)} fitted, {len(validated)} validated; "
                  f"{len(all_rows) - len(rows_in)} not compared); {len(rows_in) - len(outside)} within "
                  f"{TARGET[0]}–{TARGET[1]}×."]
    for name, group in (("fitted", fitted), ("validated", validated)):
        low, high = worst(group)
        lines.append(f"- {name}: {low:.2f}–{high:.2f}")
    for row in outside:
        lines.append(f"- outside {TARGET[0]}–{TARGET[1]}×: docs/gpu/{row.source}, {row.what}: {row.ratio():.2f}")
    low, high = worst(all_rows)
    lines += ["", f"worst ratio: {low:.2f}–{high:.2f}"]
    return "\n".join(lines) + "\n"
