"""Comparison tables from run records: backends (rows) × tasks (columns), mean ± std over seeds.

A cell with no completed run is shown as missing (``—``) or ``failed``, never as 0; a cell with
some failed seeds says so. A row's average is given only when every task column of that row is
complete. The best mean per column is bold. Optionally each cell carries its delta against a
published table (shipped in ``lra/results/paper_numbers/``) and each row the training throughput
and peak memory of one task's runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, List, Optional

import pandas as pd

from lra.pretraining import SPT_SUFFIX
from lra.results import validity
from lra.results.validity import AVERAGE
from lra.results.formats import markdown_cell, to_markdown, visible
from lra.results.reading import modified, read_records, record_files
from lra.results.reference import REFERENCES  # noqa: F401 (the presets' tests read the table names here)

TASK_ORDER = ["listops", "text", "retrieval", "image", "pathfinder"]
# Rows in the order of the YOSO paper's Table 3, then LRA Table 1's other rows and the learning-to-hash
# table's; unknown labels follow alphabetically.
LABEL_ORDER = ["None", "Softmax", "YOSO-E", "Nystromformer", "Longformer", "Linformer", "Reformer",
               "Performer", "YOSO-16", "YOSO-32", "YOSO-64", "YOSO-128", "YOSO-C-16", "YOSO-C-32", "*YOSO-16",
               "*YOSO-32", "*YOSO-C-16", "Local Attention", "Sparse Transformer", "Sinkhorn Transformer",
               "Synthesizer", "BigBird", "Linear Transformer", "RFA", "LSH", "LHA"]
MISSING, FAILED = "—", "failed"
# Our label → the name a paper's table uses for the same mechanism, when it differs.
PAPER_NAMES = {"Softmax": ["Softmax", "Transformer"]}


# which duplicate of a (backend, task, seed) to keep
STATUS_RANK = {"completed": 0, "running": 1, "interrupted": 1, "failed": 2}
FINISHED = ("completed", "failed")  # any other status (running, interrupted) is an unfinished run


def deduplicate(records: List[dict], warn=lambda message: None) -> List[dict]:
    """One record per (backend, task, seed): completed before running before failed, then the
    latest; each dropped duplicate is named."""
    kept = {}
    for record in records:
        key = (record["label"], record["task"], record.get("seed"))
        previous = kept.get(key)
        if previous is None:
            kept[key] = record
            continue
        rank = lambda r: (STATUS_RANK.get(r["status"], 3), -modified(r))  # noqa: E731
        keep, drop = (record, previous) if rank(record) < rank(previous) else (previous, record)
        kept[key] = keep
        warn(f"dropped {drop['run_dir']}: the same {key[0]} on {key[1]} with seed {key[2]} as {keep['run_dir']}")
    return list(kept.values())


def collect(directories: Iterable[Path], warn=lambda message: None) -> pd.DataFrame:
    """One row per (backend, task, seed) among the ``metrics.json`` under the given run or sweep
    directories; unreadable records and duplicates are left out, each with a ``warn``."""
    return pd.DataFrame(deduplicate(read_records(record_files(directories, warn), warn), warn))


def collect_wandb(project: str, api=None) -> pd.DataFrame:
    """The same rows from a W&B project (``entity/project``) through the public API: the run's
    summary holds the final metrics (``test/accuracy`` …), its config the task and seed, its name
    the label. A run without a test accuracy is failed (W&B state failed/crashed) or unfinished."""
    if api is None:
        import wandb

        api = wandb.Api()
    rows = []
    for run in api.runs(project):
        summary, config = dict(run.summary), dict(run.config)
        task = config.get("task", {})
        test_accuracy = summary.get("test/accuracy")
        rows.append({
            "label": run.name, "task": task.get("name") if isinstance(task, dict) else task,
            "seed": config.get("seed"), "test_accuracy": test_accuracy,
            "status": "completed" if test_accuracy is not None else
            ("failed" if run.state in ("failed", "crashed") else "running"),
            **{k: summary.get(k) for k in ("best_val_accuracy", "train_tokens_per_second", "peak_memory_mb")},
            "run_dir": run.url,
        })
    return pd.DataFrame(rows)


def base_label(label: str) -> tuple:
    """(the attention's label, whether the row is self-pretrained): "YOSO-32 +SPT" → ("YOSO-32", True)."""
    pretrained = label.endswith(SPT_SUFFIX)
    return (label[: -len(SPT_SUFFIX)] if pretrained else label), pretrained


def _row_key(label: str):
    """From-scratch rows first, then the self-pretrained ones, each block in the YOSO paper's order."""
    base, pretrained = base_label(label)
    return (pretrained, 0, LABEL_ORDER.index(base), base) if base in LABEL_ORDER else (pretrained, 1, 0, base)


def _stuck(runs: pd.DataFrame) -> pd.Series:
    """Which runs their record calls stuck at chance (lra/chance.py); records without the field are not."""
    if "stuck_at_chance" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["stuck_at_chance"].map(lambda value: value is True)


def summarize(runs: pd.DataFrame, metric: str = "test_accuracy", exclude_stuck: bool = False) -> pd.DataFrame:
    """Numbers behind the table, one row per (backend, task): the mean, median and std of the
    completed seeds, how many there are, how many of them are stuck at chance (left out of the
    statistic with ``exclude_stuck``, still counted), how many failed; throughput, peak memory and
    parameters of the completed runs."""
    rows = []
    for (label, task), group in runs.groupby(["label", "task"], sort=False):
        completed = group[group["status"] == "completed"]
        stuck = _stuck(completed) & completed[metric].notna()  # among the seeds with a valid value: "k of n"
        counted = completed[~stuck] if exclude_stuck else completed
        done = counted[metric].dropna()
        rows.append({"backend": label, "task": task, "mean": done.mean() if len(done) else math.nan,
                     "std": done.std(ddof=1) if len(done) > 1 else math.nan, "seeds": len(done),
                     "failed": int((group["status"] == "failed").sum()),
                     "unfinished": int((~group["status"].isin(FINISHED)).sum()),
                     "stuck": int(stuck.sum()), "completed": len(completed[metric].dropna()),
                     "invalid": validity.invalid_count(completed, metric),
                     "median": done.median() if len(done) else math.nan,
                     "tokens_per_s": completed.get("train_tokens_per_second", pd.Series()).mean(),
                     "peak_memory_mb": completed.get("peak_memory_mb", pd.Series()).mean(),
                     "num_parameters": completed.get("num_parameters", pd.Series()).mean()})
    return pd.DataFrame(rows)


def reference_value(reference: Optional[pd.DataFrame], label: str, column: str) -> float:
    if reference is None or column not in reference.columns:
        return math.nan
    for name in PAPER_NAMES.get(label, [label]):
        if name in reference.index:
            return float(reference.loc[name, column])
    return math.nan


BUDGET = 0.10  # LRA's protocol: every model within ±10 % of the Softmax baseline's parameters


def comparison(runs: pd.DataFrame, metric: str = "test_accuracy", reference: Optional[pd.DataFrame] = None,
               efficiency_task: Optional[str] = None, efficiency: bool = False, statistic: str = "mean",
               exclude_stuck: bool = False) -> pd.DataFrame:
    """Formatted cells ``mean ± std (seeds)`` (the median with ``statistic="median"``), ``k of n at
    chance`` where seeds are stuck there, ``[Δ ±x]`` against ``reference`` when given;
    ``table.attrs["best"]`` marks the best per column, ``table.attrs["numbers"]`` the summary. The
    efficiency view adds each row's parameters against the Softmax row of the same task (± 10 %)."""
    if runs.empty:
        return pd.DataFrame()
    summary = summarize(runs, metric, exclude_stuck)
    tasks = [t for t in TASK_ORDER if t in set(runs["task"])] + sorted(set(runs["task"]) - set(TASK_ORDER))
    labels = sorted(set(runs["label"].dropna()), key=_row_key)
    means = summary.pivot(index="backend", columns="task", values=statistic).reindex(index=labels, columns=tasks)
    complete = means.notna().all(axis=1)
    means[AVERAGE] = means[tasks].mean(axis=1).where(complete)
    cells = pd.DataFrame(MISSING, index=labels, columns=[*tasks, AVERAGE])
    for _, row in summary.iterrows():
        note = (f", {row['failed']} failed" if row["failed"] else "") + (
            f", {row['unfinished']} unfinished" if row["unfinished"] else "")
        invalid = f"{row['invalid']} invalid" if row["invalid"] else ""
        if row["stuck"]:
            note = (f"; {row['stuck']} of {row['completed']} at chance" + (", excluded" if exclude_stuck else "")
                    + note)
        if row["seeds"]:
            spread = f" ± {row['std']:.2f}" if row["seeds"] > 1 else ""
            text = f"{row[statistic]:.2f}{spread} ({row['seeds']}{', ' + invalid if invalid else ''}{note})"
        elif row["stuck"]:
            text = f"stuck ({row['stuck']} of {row['completed']} at chance, excluded)"
        elif invalid:
            text = f"invalid ({row['invalid']}{note})"
        else:
            text = FAILED if row["failed"] else MISSING
        cells.loc[row["backend"], row["task"]] = text
    for label in labels:
        if complete[label]:
            cells.loc[label, AVERAGE] = f"{means.loc[label, AVERAGE]:.2f}"
    if reference is not None:
        # A paper's average is comparable only when this table has exactly the paper's tasks.
        same_tasks = set(tasks) == set(reference.columns) - {AVERAGE}
        for label in labels:
            for column in (cells.columns if same_tasks else tasks):
                paper = reference_value(reference, label, column)
                if not math.isnan(paper) and not math.isnan(means.loc[label, column]):
                    cells.loc[label, column] += f" [Δ {means.loc[label, column] - paper:+.2f}]"
    best = means.eq(means.max(axis=0), axis=1) & means.notna()
    if efficiency or efficiency_task:
        task = efficiency_task or tasks[0]
        rows = summary[summary["task"] == task].set_index("backend").reindex(labels)
        cells[f"{task} tokens/s"] = [MISSING if math.isnan(v) else f"{v:,.0f}" for v in rows["tokens_per_s"]]
        cells[f"{task} peak MB"] = [MISSING if math.isnan(v) else f"{v:,.0f}" for v in rows["peak_memory_mb"]]
        # each row against the Softmax row of its own setup (from scratch or self-pretrained)
        baselines = [rows["num_parameters"].get("Softmax" + (SPT_SUFFIX if base_label(label)[1] else ""), math.nan)
                     for label in labels]
        cells[f"{task} params vs Softmax"] = [_budget(v, b) for v, b in zip(rows["num_parameters"], baselines)]
        best[f"{task} tokens/s"], best[f"{task} peak MB"], best[f"{task} params vs Softmax"] = False, False, False
    cells = cells.rename_axis("backend")
    cells.attrs = {"best": best.reindex(columns=cells.columns, fill_value=False), "numbers": summary,
                   "statistic": statistic}
    return cells


def side_by_side(table: pd.DataFrame) -> pd.DataFrame:
    """One row per attention, each task's from-scratch cell beside its self-pretrained one and the change
    of the statistic (``+SPT Δ``); a row with only one of the two shows the other as missing."""
    summary = table.attrs["numbers"]
    tasks = [c for c in table.columns if c in set(summary["task"])]
    statistic = table.attrs.get("statistic", "mean")
    bases = sorted({base_label(label)[0] for label in table.index}, key=_row_key)
    out = pd.DataFrame(MISSING, index=pd.Index(bases, name="backend"),
                       columns=[f"{t}{suffix}" for t in tasks for suffix in ("", SPT_SUFFIX, f"{SPT_SUFFIX} Δ")])
    values = summary.set_index(["backend", "task"])[statistic]
    for base in bases:
        for task in tasks:
            for suffix in ("", SPT_SUFFIX):
                if base + suffix in table.index:
                    out.loc[base, f"{task}{suffix}"] = table.loc[base + suffix, task]
            scratch, spt = values.get((base, task), math.nan), values.get((base + SPT_SUFFIX, task), math.nan)
            if not (math.isnan(scratch) or math.isnan(spt)):
                out.loc[base, f"{task}{SPT_SUFFIX} Δ"] = f"{spt - scratch:+.2f}"
    out.attrs = {"best": pd.DataFrame(False, index=out.index, columns=out.columns), "numbers": summary}
    return out


def _budget(parameters: float, baseline: float) -> str:
    """``+3.1 %`` against the Softmax row's parameters; marked when outside LRA's ±10 % budget."""
    if math.isnan(parameters) or math.isnan(baseline) or not baseline:
        return MISSING
    change = parameters / baseline - 1
    return f"{100 * change:+.1f} %" + (" (outside ±10 %)" if abs(change) > BUDGET + 1e-12 else "")


def numbers(table: pd.DataFrame, reference: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """The numbers behind ``table`` (one record per backend × task), with the paper value and delta."""
    out = table.attrs["numbers"].copy()
    if reference is not None:
        out["paper"] = [reference_value(reference, b, t) for b, t in zip(out["backend"], out["task"])]
        out["delta"] = out["mean"] - out["paper"]
    return out


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
    import shlex

    from lra.run import RunDirectory

    lines = []
    for r in records:
        if r.get("status") in FINISHED:
            continue
        alive = RunDirectory(r["run_dir"]).last_holder_alive() if r.get("status") == "running" else None
        state = {True: "running (its process is alive)", False: "killed while running (its process is gone)",
                 None: "running, or killed (its process cannot be checked from here)"}[alive] \
            if r.get("status") == "running" else (r.get("error") or str(r.get("status")))
        resume = "" if alive else f"; resume with: lra-train resume={shlex.quote(r['run_dir'])}"
        lines.append(visible(f"- {r['run_dir']}: {state} at step {r.get('steps')}{resume}"))
    return f"unfinished runs ({len(lines)}):\n" + "\n".join(lines) if lines else ""


def run_list(runs: pd.DataFrame) -> str:
    """Every run the table counts, a row each, in the table's row order, then by task and seed: its
    status, test accuracy, steps, the steps it was resumed at (after a kill or a cut slice; "none"), wall
    time, device and commit, as its record has them (a results page names these per run); empty without
    runs."""
    if runs.empty:
        return ""
    runs = runs.reindex(columns=[*runs.columns, *(f for f in RUN_FIELDS if f not in runs)])
    order = sorted(runs.index, key=lambda i: (_row_key(str(runs.at[i, "label"])), str(runs.at[i, "task"]),
                                              _seed_key(runs.at[i, "seed"])))

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
        lines.append(f"| {text(r['label'])} | {text(r['task'])} | {text(r['seed'])} | {text(r['status'])} | "
                     f"{text(r['test_accuracy'], '{:.2f}')} | {text(r['steps'])} | "
                     f"{resumes(r['resumed_at_steps'])} | "
                     f"{text(None if wall is None else wall / 60, '{:.1f}')} | {text(r['device'])} | "
                     f"{text(r['git_commit'])} |")
    return f"every run ({len(order)}):\n\n" + "\n".join(lines)


RUN_FIELDS = ("seed", "status", "test_accuracy", "steps", "resumed_at_steps", "wall_time_seconds", "device",
              "git_commit")


def _absent(value) -> bool:
    """None, or the NaN a DataFrame holds where a record has no value."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _seed_key(seed):
    return (0, seed) if isinstance(seed, (int, float)) and not _absent(seed) else (1, str(seed))


def render(directories: List[Path], warn=lambda message: None) -> str:
    return render_records(read_records(record_files(directories, warn), warn), warn)


def render_records(records: List[dict], warn=lambda message: None) -> str:
    """:func:`render` of records already read."""
    runs = pd.DataFrame(deduplicate(records, warn))
    failed = failures(records)
    notes = "\n\n".join(n for n in (validation_notes(runs), validity.notes(records)) if n)
    return (f"{to_markdown(comparison(runs))}\n\nruns: {status_counts(runs)}" + (f"\n\n{notes}" if notes else "")
            + (f"\n\n{failed}" if failed else ""))
