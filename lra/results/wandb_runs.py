"""Run records from a W&B project (``lra-table --wandb ENTITY/PROJECT``), shaped and screened as the
records of run folders are, so that one table takes both.

A W&B run is the record of the run ``lra-train`` logged: its name the label, its config the resolved
config (task, seed, setup), its summary the final numbers (``test/accuracy``, ``best_val_accuracy`` …)
and the run's own folder (``run_dir``). A run whose folder is among the folders given to the same table
is that run once: its folder's record counts, the W&B copy is named in a note and left out. Values a
table cannot use are left out as a file's are (:mod:`lra.results.validity`), and a W&B run that cannot
take a place at all (no name, no task, a seed that is no seed) is skipped with a note naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from lra.records import METRICS
from lra.results import validity
from lra.results.reading import missing_required

# W&B summary keys lra-train logs under another name than the record's (lra.training).
SUMMARY_NAMES = {"test/accuracy": "test_accuracy", "test/loss": "test_loss"}
FAILED_STATES = ("failed", "crashed")  # W&B's states of a run that ended without finishing
SOURCE = "W&B"  # a record's "source" when it comes from W&B (a folder's record has none)


@dataclass(frozen=True)
class WandbRun:
    """What the W&B client returned for one run, as plain values."""

    name: object
    state: object
    url: str
    summary: Dict[str, object]
    config: Dict[str, object]


def fetch(project: str, api=None) -> List[WandbRun]:
    """Every run of ``project`` (``entity/project``) through W&B's public API. Everything that talks to
    W&B is here, so that the caller's one error line (no key, no network, no such project) is about W&B."""
    if api is None:
        import wandb

        api = wandb.Api()
    return [WandbRun(run.name, run.state, str(run.url), dict(run.summary), dict(run.config))
            for run in api.runs(project)]


def records(runs: List[WandbRun], folder_records: List[dict], warn: Callable[[str], None] = lambda message: None,
            metric: str = "test_accuracy") -> List[dict]:
    """The run records of ``runs`` that a table may take beside ``folder_records`` (read from run folders)."""
    known = {_real(record["run_dir"]) for record in folder_records}
    kept = []
    for run in runs:
        record = _record(run, metric)
        why = _unplaceable(record)
        if why is not None:
            warn(f"skipped the W&B run {run.url}: {why}")
            continue
        folder = run.summary.get("run_dir")
        if isinstance(folder, str) and _real(folder) in known:
            warn(f"left out the W&B run {run.url}: it is the run in {folder}, whose own record is in the table")
            continue
        validity.screen(record, validity.TABLE_FIELDS, warn, where(record))  # --metric: lra-table, over all runs
        validity.require(record, metric, warn, where(record))
        kept.append(record)
    return kept


def _record(run: WandbRun, metric: str) -> dict:
    """A record like a run folder's ``metrics.json`` from what W&B holds of the run."""
    summary = {SUMMARY_NAMES.get(key, key): value for key, value in run.summary.items()}
    task = run.config.get("task")
    finished = summary.get("test_accuracy") is not None
    return {
        **{field: summary.get(field) for field in dict.fromkeys((*validity.TABLE_FIELDS, metric))},
        "device": summary.get("device"), "attention_engine": summary.get("attention_engine"),
        "label": run.name, "task": task.get("name") if isinstance(task, dict) else task,
        "seed": run.config.get("seed"),
        "status": "completed" if finished else "failed" if run.state in FAILED_STATES else "running",
        "run_dir": run.url, "source": SOURCE, "config": run.config if isinstance(task, dict) else None,
    }  # the run's own keys last: --metric label takes nothing from the summary


def where(record: dict) -> str:
    """The name a note gives a record's run: its W&B run, or its file."""
    return f"the W&B run {record['run_dir']}" if record.get("source") == SOURCE \
        else str(Path(record["run_dir"]) / METRICS)


def _unplaceable(record: dict) -> Optional[str]:
    missing = missing_required(record)
    if missing:
        return f"it has no {' and no '.join(missing)} (a run lra-train logged names each); the run is not in the table"
    why = validity.unplaceable(record)
    return None if why is None else f"{why}; the run is not in the table"


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))
