"""Cost columns of a table, like with like: each row's parameters against the Softmax row of its own setup
(LRA's ±10 % budget), and throughput and memory labelled with what they are on the device that measured
them.

- **The Softmax row of a row's setup** (:func:`softmax_rows`): a row whose runs' setup is the row's own but
  for the attention (``attention.*``, and whatever the paper presets' row files set for that row and task:
  LRA Table 1's per-row Image and Pathfinder model sizes). Rows without a recorded config fall back on the
  Softmax row of the same label block (from scratch or self-pretrained), as before configs were compared.
- **Devices** (:func:`device_kind`): a record's ``device`` says ``cuda (…)`` or ``cpu (…)``. On a CPU,
  tokens/s is wall-clock throughput on a machine shared with whatever else ran, and ``peak_memory_mb`` is
  the process's peak resident memory (Python, torch, the data), not what the attention holds; such cells
  say ``CPU`` and ``CPU process``. A cell whose seeds ran on both kinds of device has no mean.
- **YOSO's engine** (:func:`engines_of`, a record's ``attention_engine``): a cell of runs that computed YOSO
  on its PyTorch path (``impl=auto`` takes it where the compiled kernels cannot be built) says ``PyTorch
  path``; one whose seeds ran on the kernels and on the PyTorch path (or did not record which) has no mean.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Optional

import pandas as pd

from lra.pretraining import SPT_SUFFIX
from lra.results.setups import row_keys, same_but_attention

BASELINE = "Softmax"
BUDGET = 0.10  # LRA's protocol: every model within ±10 % of the Softmax baseline's parameters
MISSING = "—"
CPU, GPU, MIXED = "CPU", "GPU", "CPU and GPU"


def device_kind(device) -> Optional[str]:
    """:data:`CPU` or :data:`GPU` from a record's ``device`` ("cuda (NVIDIA H100 …)", "cpu (x86_64, 2
    threads)"); None when it says neither (a W&B run, an old record)."""
    text = str(device or "").strip().lower()
    return GPU if text.startswith("cuda") else CPU if text.startswith("cpu") else None


def devices_of(devices: Iterable) -> Optional[str]:
    """The device kind of a cell's runs: one kind, :data:`MIXED`, or None when none says."""
    kinds = {kind for kind in map(device_kind, devices) if kind}
    return kinds.pop() if len(kinds) == 1 else MIXED if kinds else None


def softmax_rows(summary: pd.DataFrame, configs: Dict[str, dict]) -> pd.Series:
    """For each (row, task) of ``summary``, the Softmax row of its setup on that task (module docstring), or
    None. ``configs``: each setup fingerprint's flat config."""
    out = pd.Series(None, index=summary.index, dtype=object)
    for task, group in summary.groupby("task", sort=False):
        candidates = group[group["label"].map(lambda label: label.removesuffix(SPT_SUFFIX) == BASELINE)]
        for index, row in group.iterrows():
            config = configs.get(row["setup"]) if isinstance(row["setup"], str) else None
            if config is None:  # no config: the label block's own Softmax row, by name
                name = BASELINE + (SPT_SUFFIX if row["label"].endswith(SPT_SUFFIX) else "")
                out[index] = name if (candidates["backend"] == name).any() else None
                continue
            for _, candidate in candidates.iterrows():
                other = configs.get(candidate["setup"]) if isinstance(candidate["setup"], str) else None
                ignored = row_keys(row["preset_row"], task) | row_keys(candidate["preset_row"], task)
                if other is not None and same_but_attention(config, other, ignored):
                    out[index] = candidate["backend"]
                    break
    return out


def budget(parameters: float, baseline: float) -> str:
    """``+3.1 %`` against the Softmax row's parameters; marked when outside LRA's ±10 % budget."""
    if math.isnan(parameters) or math.isnan(baseline) or not baseline:
        return MISSING
    change = parameters / baseline - 1
    return f"{100 * change:+.1f} %" + (" (outside ±10 %)" if abs(change) > BUDGET + 1e-12 else "")


def parameter_cells(rows: pd.DataFrame) -> list:
    """The ``params vs Softmax`` column of ``rows`` (one task's summary, indexed by row name)."""
    cells = []
    for name, row in rows.iterrows():
        baseline = row.get("softmax_row")
        if not isinstance(baseline, str) or baseline not in rows.index:
            cells.append(MISSING if math.isnan(row["num_parameters"]) else f"{MISSING} (no Softmax run of this setup)")
        else:
            cells.append(budget(row["num_parameters"], rows.loc[baseline, "num_parameters"]))
    return cells


def engines_of(engines: Iterable) -> Optional[str]:
    """The engines of a cell's runs (their records' ``attention_engine``: ``kernel``, ``torch``), comma-separated,
    with ``unrecorded`` for runs that name none beside runs that do (records from before the field); None when
    no record names one (a backend with one implementation)."""
    engines = list(engines)
    found = {part for engine in engines if isinstance(engine, str) for part in engine.split(",") if part}
    if found and not all(isinstance(engine, str) and engine for engine in engines):
        found.add("unrecorded")
    return ",".join(sorted(found)) or None


def on_pytorch_path(engine) -> bool:
    """Whether a cell's :func:`engines_of` says YOSO computed on its PyTorch path alone: its cells and chart
    label say so."""
    return engine == "torch"


def engines_mixed(engine) -> bool:
    """Whether a cell's :func:`engines_of` names more than one: its tokens/s and peak MB have no mean."""
    return isinstance(engine, str) and "," in engine


def measured_cell(value: float, kind: Optional[str], on_cpu: str, engine: Optional[str] = None) -> str:
    """A tokens/s or peak-memory cell: the number, labelled ``on_cpu`` when a CPU measured it and ``PyTorch path``
    when YOSO ran on it; no mean of CPU and GPU runs together, nor of YOSO's kernels and its PyTorch path."""
    if kind == MIXED:
        return f"{MISSING} (CPU and GPU runs)"
    if engines_mixed(engine):
        return f"{MISSING} (runs on different YOSO engines: {engine.replace(',', ', ')})"
    if math.isnan(value):
        return MISSING
    labels = [on_cpu] * (kind == CPU) + ["PyTorch path"] * on_pytorch_path(engine)
    return f"{value:,.0f}" + (f" ({', '.join(labels)})" if labels else "")


def throughput_cell(value: float, kind: Optional[str], engine: Optional[str] = None) -> str:
    return measured_cell(value, kind, "CPU", engine)


def memory_cell(value: float, kind: Optional[str], engine: Optional[str] = None) -> str:
    return measured_cell(value, kind, "CPU process", engine)


def legend(kinds: Iterable[Optional[str]], engines: Iterable[Optional[str]] = ()) -> list:
    """What the cost columns hold, a line each, for under a table with them."""
    kinds = set(kinds)
    lines = ["tokens/s: training throughput (wall clock, the mean over seeds); peak MB: on a GPU, the peak "
             "memory of torch's tensors"]
    if kinds & {CPU, MIXED}:
        lines.append("(CPU): measured on a CPU, in wall-clock time on a machine shared with whatever else ran, so "
                     "not a kernel's speed; (CPU process): the process's peak resident memory (Python, torch, the "
                     "data), the same for every attention that fits, not what the attention holds")
    if any(on_pytorch_path(engine) for engine in engines):
        lines.append("(PyTorch path): YOSO computed on its PyTorch path, not its compiled kernels (attention_engine="
                     "torch: attention.impl=torch, or impl=auto where the kernels could not be built)")
    lines.append("params vs Softmax: against the Softmax row of the same setup but for the attention; marked "
                 "outside LRA's ±10 % budget")
    return lines
