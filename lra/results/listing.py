"""What a Markdown table page says besides its cells: what the cells mean, the status of the runs, notes on
their setups and values, the failed and unfinished runs, and (``--runs``) every run."""

from __future__ import annotations

import math
from typing import Iterable, List, Sequence

import pandas as pd

from lra.results import validity
from lra.results.formats import markdown_cell, to_markdown, visible
from lra.results.recordless import Unplaced, unplaced_note
from lra.results.rows import FINISHED, MISSING, label_key


def status_counts(runs: pd.DataFrame) -> str:
    if runs.empty:
        return "no runs"
    counts = runs["status"].value_counts()
    return ", ".join(f"{count} {status}" for status, count in counts.items())


def validation_notes(runs: pd.DataFrame) -> str:
    """One line per task: what its runs validated on (``validation`` in their records), so that a
    table mixing the reference protocol (Text: its test split) with a held-out split says so."""
    if runs.empty or "validation" not in runs:
        return ""
    lines = []
    for task, group in runs.groupby("task", sort=False):
        kinds = group["validation"].dropna().value_counts()
        if len(kinds):
            listed = "; ".join(f"{kind} ({count} run{'s' if count > 1 else ''})" for kind, count in kinds.items())
            lines.append(visible(f"- {task}: validated on {listed}"))
    return "validation:\n" + "\n".join(lines) if lines else ""


def failures(records: Iterable[dict]) -> str:
    """The failed runs among ``records`` (duplicates the table dropped included), one line each with
    its error, then the unfinished ones (:func:`unfinished`), so that no failed, refused, interrupted or
    killed job goes unseen; empty when every run completed."""
    records = list(records)
    failed = [r for r in records if r.get("status") == "failed"]
    lines = [visible(f"- {r['run_dir']}: {r.get('error') or 'no error recorded'}") for r in failed]
    text = f"failed runs ({len(failed)}):\n" + "\n".join(lines) if failed else ""
    later = unfinished(records)
    return text + ("\n\n" if text and later else "") + later


def unfinished(records: Iterable[dict]) -> str:
    """Runs neither completed nor failed, one line each: interrupted by a signal, running now, or
    ``running`` with its process gone (killed by SIGKILL, the out-of-memory killer, a power cut: no
    handler could record it), each with the command that resumes it; empty when there is none."""
    from lra.run import RunDirectory, process_count, resume_command

    lines = []
    for r in records:
        if r.get("status") in FINISHED:
            continue
        alive = RunDirectory(r["run_dir"]).last_holder_alive() if r.get("status") == "running" else None
        state = {True: "running (its process is alive)", False: "killed while running (its process is gone)",
                 None: "running, or killed (its process cannot be checked from here)"}[alive] \
            if r.get("status") == "running" else (r.get("error") or str(r.get("status")))
        resume = "" if alive else f"; resume with: {resume_command(r['run_dir'], process_count(r.get('processes')))}"
        lines.append(visible(f"- {r['run_dir']}: {state} {_where_it_stopped(r)}{resume}"))
    return f"unfinished runs ({len(lines)}):\n" + "\n".join(lines) if lines else ""


def _where_it_stopped(record: dict) -> str:
    """"at step N", or in self-pretraining's stage 1 (before any fine-tuning step) "at stage-1 step N"."""
    if record.get("pretrain_status") not in (None, "completed") and record.get("steps") is None:
        return f"at stage-1 step {record.get('pretrain_steps') if record.get('pretrain_steps') is not None else 0}"
    return f"at step {record.get('steps') if record.get('steps') is not None else 0}"


RUN_FIELDS = ("seed", "status", "test_accuracy", "steps", "resumed_at_steps", "wall_time_seconds", "device",
              "git_commit")


def run_list(runs: pd.DataFrame) -> str:
    """Every run the table counts, a row each, in the table's row order (its row: the label, and what sets its
    setup apart where the label has several), then by task and seed: its status, test accuracy, steps, the
    steps it was resumed at (after a kill or a cut slice; "none"), wall time, device and commit, as its record
    has them (a results page names these per run); empty without runs."""
    if runs.empty:
        return ""
    runs = runs.reindex(columns=[*runs.columns, *(f for f in RUN_FIELDS if f not in runs)])
    row = runs["row"] if "row" in runs else runs["label"]
    rank = runs["row_rank"] if "row_rank" in runs else pd.Series(0, index=runs.index)
    order = sorted(runs.index, key=lambda i: (label_key(str(runs.at[i, "label"])), int(rank[i]), str(row[i]),
                                              str(runs.at[i, "task"]), _seed_key(runs.at[i, "seed"])))

    def text(value, form="{}") -> str:
        if _absent(value):
            return MISSING
        whole = isinstance(value, float) and value.is_integer() and form == "{}"  # a seed or a step count
        return markdown_cell(form.format(int(value) if whole else value))  # a cell, whatever it holds

    def resumes(steps) -> str:
        if not isinstance(steps, (list, tuple)):
            return MISSING  # a record from before the field, or none at all
        return ", ".join(str(int(step)) for step in steps) if steps else "none"

    lines = ["| backend | task | seed | status | test accuracy | steps | resumed at | wall time (min) | device | "
             "commit |", "|:--|:--|--:|:--|--:|--:|--:|--:|:--|:--|"]
    for i in order:
        r = runs.loc[i]
        wall = r["wall_time_seconds"]
        lines.append(f"| {text(row[i])} | {text(r['task'])} | {text(r['seed'])} | {text(r['status'])} | "
                     f"{text(r['test_accuracy'], '{:.2f}')} | {text(r['steps'])} | "
                     f"{resumes(r['resumed_at_steps'])} | "
                     f"{text(None if wall is None else wall / 60, '{:.1f}')} | {text(r['device'])} | "
                     f"{text(r['git_commit'])} |")
    return f"every run ({len(order)}):\n\n" + "\n".join(lines)


def _absent(value) -> bool:
    """None, or the NaN a DataFrame holds where a record has no value."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _seed_key(seed):
    return (0, seed) if isinstance(seed, (int, float)) and not _absent(seed) else (1, str(seed))


def page(table: pd.DataFrame, runs: pd.DataFrame, records: List[dict], every_run: bool = False,
         unplaced: Sequence[Unplaced] = ()) -> str:
    """The Markdown table of :func:`lra.results.table.comparison` (or its side-by-side view) with what its
    cells mean, the runs' status, the notes on their setups, validation and values, the failed and
    unfinished runs, the runs in no cell (``unplaced``) and, with ``every_run``, every run the table counts."""
    counted = table.attrs.get("runs", runs)
    parts = [to_markdown(table), table.attrs.get("legend", ""),
             f"runs: {status_counts(runs)}", *table.attrs.get("notes", []), validation_notes(runs),
             validity.notes(records), failures(records), unplaced_note(unplaced),
             run_list(counted) if every_run else ""]
    return "\n\n".join(part for part in parts if part)
