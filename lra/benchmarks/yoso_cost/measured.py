"""The committed H100 measurements the cost model is held against, read from docs/gpu at run time.

Two kinds of file, as the GPU sessions wrote them:

- ``trace.md`` (``python -m lra.benchmarks.yoso_trace``): a step's wall time queued and synchronized, and
  torch.profiler's table of 5 steps: per kernel its Self CUDA time and calls;
- ``kernels.md`` (``python -m lra.benchmarks.yoso_speed``): per cell and n, the forward and the forward +
  backward in ms (the best of 3 synchronized calls).

:func:`trace` and :func:`kernel_benchmark` parse them; :func:`rows` names every number the model is held
against (its file, what it measures, per call or per step, in seconds). Nothing here is fitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from lra.benchmarks.yoso_cost.call import Call

REPO = Path(__file__).resolve().parents[3]
GPU_DOCS = REPO / "docs" / "gpu"
CALIBRATION = "2026-11-27b/trace.md"  # the one trace the H100 constants are fitted on
TRACES = (CALIBRATION, "2026-11-27c/trace.md", "2026-11-27b/trace_deterministic.md")
BENCHMARKS = ("2026-11-27b/kernels.md", "2026-11-27c/kernels.md", "2026-11-27b/kernels_bert.md")
FILES = TRACES + BENCHMARKS



# The files that ran the kernels of a94d93d and before (:attr:`Call.measured_kernels`). A file added to TRACES or
# BENCHMARKS later is modelled with today's kernels: it must measure them (csrc/yoso at its commit as on main).
EARLIER_KERNELS = frozenset({"2026-11-27b/trace.md", "2026-11-27c/trace.md", "2026-11-27b/trace_deterministic.md",
                             "2026-11-27b/kernels.md", "2026-11-27c/kernels.md", "2026-11-27b/kernels_bert.md"})


def call_as_measured(source: str, B: int, n: int, d: int, dv: int, m: int) -> Call:
    """A call of the committed measurement ``source``, modelled with the kernels it ran: those of a94d93d and
    before for :data:`EARLIER_KERNELS` (:attr:`Call.measured_kernels`: where today's differ, e.g. n >= 8,192
    keeps the global-memory rows they measured), else today's."""
    return Call(B, n, d, dv, m, measured_kernels=source in EARLIER_KERNELS)


# A kernel of the profiler's table, by the start of its name, and the model's name for it.
KERNELS = {
    "void yoso::(anonymous namespace)::fast_hash_kernel": "fast_hash",
    "yoso::(anonymous namespace)::slice_lists_kernel": "slice_lists",
    "yoso::(anonymous namespace)::table_cumulation_kernel": "table_cumulation",
    "void yoso::(anonymous namespace)::scatter_pairs_kernel": "scatter_pairs",
    "yoso::(anonymous namespace)::bucket_rows_kernel": "bucket_rows",
    "yoso::(anonymous namespace)::gather_rows_kernel": "gather_rows",
    "void yoso::(anonymous namespace)::query_gradients_kernel": "query_gradients",
    "void yoso::(anonymous namespace)::key_gradients_kernel": "key_gradients",
    "void at::native::radixSortKVInPlace": "torch sort",
}
# The YOSO operators whose Self CUDA time holds their own kernels (sorts, cumsums and fills are child ops).
OPERATORS = {"attention_zoo::yoso_fast_hash": "hash", "attention_zoo::yoso_cumulation": "forward",
             "attention_zoo::yoso_exact_weight_backward": "backward"}
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_HEADER = re.compile(r"## n = (\d+): ([\d.]+) ms a step queued, ([\d.]+) ms synchronized \(YOSO-(\d+), (\d+) x "
                     r"(\d+) x (\d+), (atomic|deterministic \(sorted\)) paths, (\d+) steps\)")


class MissingMeasurements(FileNotFoundError):
    """A committed measurement file is not where the repository keeps it."""


@dataclass(frozen=True)
class Trace:
    """One yoso_trace section: the shape, the step's wall times, and per profiler row (Self CUDA s, calls)."""

    source: str
    n: int
    m: int
    batch_heads: int
    head_dim: int
    atomic: bool
    queued_s: float
    synchronized_s: float
    profiled_steps: int
    total_cuda_s: float
    table: Tuple[Tuple[str, float, float, float, int], ...]  # (name, Self CUDA, CPU total, Self CPU s, calls)

    def row(self, prefix: str) -> Optional[Tuple[float, float, float, int]]:
        """(Self CUDA s, CPU total s, Self CPU s over the profiled steps, calls) of the row named ``prefix``,
        else of the one row whose name starts with it, or None."""
        exact = [entry[1:] for entry in self.table if entry[0] == prefix]
        found = exact or [entry[1:] for entry in self.table if entry[0].startswith(prefix)]
        return found[0] if len(found) == 1 else None

    def cuda_per_step(self, prefix: str) -> float:
        """Self CUDA seconds a step of the row named ``prefix`` (0 where the table has no such row)."""
        found = self.row(prefix)
        return found[0] / self.profiled_steps if found else 0.0


def _seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip()).groups()
    return float(number) * _UNITS[unit]


def read(relative: str) -> str:
    path = GPU_DOCS / relative
    if not path.is_file():
        raise MissingMeasurements(f"{path}: the committed H100 measurement is missing; run from a checkout of the "
                                  "repository (docs/gpu is not installed with the package)")
    return path.read_text()


def trace(relative: str) -> Trace:
    text = read(relative)
    header = _HEADER.search(text)
    if header is None:
        raise ValueError(f"{relative}: no '## n = …' section of lra.benchmarks.yoso_trace")
    n, queued, synced, m, batch_heads, _, d, path, _ = header.groups()
    profiled = int(re.search(r"(\d+) steps profiled", text).group(1))
    total = _seconds(re.search(r"Self CUDA time total: (\S+)", text).group(1))
    lines = text[header.end():].split("```")[1].splitlines()
    columns = next(line for line in lines if line.strip().startswith("Name"))
    names = [column.strip() for column in re.findall(r"\S+(?: \S+)*", columns)]
    rules = [i for i, line in enumerate(lines) if line.startswith("---")]
    table = []
    for line in lines[rules[1] + 1:rules[2]]:  # the rows, between the header's rule and the closing one
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(names):
            raise ValueError(f"{relative}: a profiler row of {len(cells)} columns, not {len(names)}: {line!r}")
        entry = dict(zip(names, cells))
        table.append((entry["Name"], _seconds(entry["Self CUDA"]), _seconds(entry["CPU total"]),
                      _seconds(entry["Self CPU"]), int(entry["# of Calls"])))
    return Trace(relative, int(n), int(m), int(batch_heads), int(d), path == "atomic", float(queued) * 1e-3,
                 float(synced) * 1e-3, profiled, total, tuple(table))


def kernel_benchmark(relative: str) -> Dict[Tuple[str, int], Tuple[float, float]]:
    """(cell, n) -> (forward s, forward + backward s) from the first table of a yoso_speed kernels.md."""
    lines = read(relative).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| cell | precision | n |")), None)
    if start is None:
        raise ValueError(f"{relative}: no '| cell | precision | n |' table of lra.benchmarks.yoso_speed")
    cells = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break  # the rows end at the first line outside the table (the pivots below repeat them rounded)
        parts = [part.strip() for part in line.strip().strip("|").split("|")]
        if re.fullmatch(r"[\d.]+", parts[3]) and parts[4]:  # else out of memory or failed
            cells[parts[0], int(parts[2])] = (float(parts[3]) * 1e-3, float(parts[4]) * 1e-3)
    return cells


def benchmark_shape(relative: str) -> Tuple[int, int]:
    """(batch·heads, head dim) of a kernels.md: yoso_speed's default, or the BERT-base attention shape."""
    return (12, 64) if relative.endswith("_bert.md") else (16, 32)
