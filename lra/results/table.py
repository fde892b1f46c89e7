"""Comparison tables from run records: backends (rows) × tasks (columns), mean ± std over seeds.

A cell with no completed run is shown as missing (or ``failed``), never as 0, and a row's average
is given only when every task column of that row is complete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List

import pandas as pd

from lra.records import METRICS

TASK_ORDER = ["listops", "text", "retrieval", "image", "pathfinder"]
# Rows in the order of the YOSO paper's Table 3; unknown labels follow alphabetically.
LABEL_ORDER = ["None", "Softmax", "YOSO-E", "Nystromformer", "Longformer", "Linformer", "Reformer",
               "Performer", "LSH", "LHA"]
MISSING, FAILED = "—", "failed"


def collect(directories: Iterable[Path]) -> pd.DataFrame:
    """One row per ``metrics.json`` found under the given run or sweep directories."""
    rows = []
    for directory in directories:
        for path in sorted(Path(directory).rglob(METRICS)):
            record = json.loads(path.read_text())
            record["run_dir"] = str(path.parent)
            rows.append(record)
    return pd.DataFrame(rows)


def _row_key(label: str):
    if label in LABEL_ORDER:
        return (0, LABEL_ORDER.index(label), label)
    return (1, 0, label)


def comparison(runs: pd.DataFrame, metric: str = "test_accuracy") -> pd.DataFrame:
    """Formatted cells: ``mean ± std (n)`` over completed seeds; ``failed`` or ``—`` otherwise."""
    if runs.empty:
        return pd.DataFrame()
    tasks = [t for t in TASK_ORDER if t in set(runs["task"])] + sorted(set(runs["task"]) - set(TASK_ORDER))
    labels = sorted(set(runs["label"].dropna()), key=_row_key)
    table, means = {}, {}
    for label in labels:
        cells, row_means = {}, []
        for task in tasks:
            group = runs[(runs["label"] == label) & (runs["task"] == task)]
            done = group[group["status"] == "completed"][metric].dropna()
            if len(done):
                std = done.std(ddof=1) if len(done) > 1 else float("nan")
                cells[task] = f"{done.mean():.2f} ± {std:.2f} ({len(done)})" if len(done) > 1 else f"{done.mean():.2f} (1)"
                row_means.append(done.mean())
            else:
                cells[task] = FAILED if (group["status"] == "failed").any() else MISSING
        complete = len(row_means) == len(tasks)
        cells["average"] = f"{sum(row_means) / len(row_means):.2f}" if complete else MISSING
        table[label], means[label] = cells, row_means
    return pd.DataFrame.from_dict(table, orient="index", columns=tasks + ["average"]).rename_axis("backend")


def to_markdown(table: pd.DataFrame) -> str:
    return table.to_markdown(disable_numparse=True) if not table.empty else "(no runs found)"


def status_counts(runs: pd.DataFrame) -> str:
    if runs.empty:
        return "no runs"
    counts = runs["status"].value_counts()
    return ", ".join(f"{count} {status}" for status, count in counts.items())


def render(directories: List[Path]) -> str:
    runs = collect(directories)
    return f"{to_markdown(comparison(runs))}\n\nruns: {status_counts(runs)}"
