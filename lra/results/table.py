"""Comparison tables from run records: setups (rows) × tasks (columns), mean ± std over seeds.

A row is one setup (:mod:`lra.results.setups`): runs of one label trained differently are separate rows,
never merged. A cell with no completed run is shown as missing (``—``; ``— (1 unfinished)`` while a run
is on its way) or ``failed``, never as 0; a cell with some failed seeds says so, and so does one with
seeds stuck at chance. A row's average is given only
when every task column of that row is complete. The best mean per column is bold. Optionally each cell
carries its delta against a published table (shipped in ``lra/results/paper_numbers/``), drawn only where
the runs were trained as the paper's preset trains that row (:mod:`lra.results.paper_setup`), and each
row the training throughput, peak memory and parameters of one task's runs (:mod:`lra.results.efficiency`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, List, Optional

import pandas as pd

from lra.results import efficiency, setups, validity
from lra.results.listing import page
from lra.results.paper_setup import NOT_PAPER, PAPER, PRESETS, UNCHECKED, PaperSetups
from lra.results.reading import modified, read_runs
from lra.results.rows import (FAILED, FINISHED, MISSING, PAPER_NAMES, STATUS_RANK, TASK_ORDER, base_label,
                              label_key)
from lra.results.validity import AVERAGE


def deduplicate(records: List[dict], warn=lambda message: None) -> List[dict]:
    """One record per (backend, setup, task, seed): completed before running before failed, then the
    latest; each dropped duplicate is named. A record without a seed is no repeat of another (a job refused
    before it had one): each is kept. Each record is given its setup first
    (:func:`lra.results.setups.describe`), and one whose config trained another task than it names is
    removed from ``records`` itself, with a note."""
    setups.describe(records, warn)
    records[:] = [record for record in records if _task_agrees(record, warn)]
    setups.place(records)
    kept = {}
    for record in records:
        key = (record["label"], record.get("setup"), record["task"], record.get("seed"))
        previous = kept.get(key) if key[3] is not None else None
        if key[3] is None:
            key = (*key, record["run_dir"])
        if previous is None:
            kept[key] = record
            continue
        rank = lambda r: (STATUS_RANK.get(r["status"], 3), -modified(r))  # noqa: E731
        keep, drop = (record, previous) if rank(record) < rank(previous) else (previous, record)
        kept[key] = keep
        same = f"the same setup ({key[1]})" if key[1] else "no config recorded by either"
        warn(f"dropped {drop['run_dir']}: the same {key[0]} on {key[2]} with seed {key[3]}, {same}, as "
             f"{keep['run_dir']}")
    return list(kept.values())


def _task_agrees(record: dict, warn) -> bool:
    """Whether the task a record names is the one its config trained (an edited record would put the run
    in another task's column); a note names one that is not."""
    trained = (record.get("setup_config") or {}).get("task.name")
    if trained is None or trained == record["task"]:
        return True
    warn(f"skipped {record['run_dir']}: its record says task {record['task']!r}, its config trained {trained!r} "
         "(the record was edited, or the config replaced); the run is in no column")
    return False


def collect(directories: Iterable[Path], warn=lambda message: None) -> pd.DataFrame:
    """One row per (backend, setup, task, seed) among the ``metrics.json`` under the given run or sweep
    directories; unreadable records and duplicates are left out, each with a ``warn``."""
    return pd.DataFrame(deduplicate(read_runs(directories, warn)[0], warn))


def _stuck(runs: pd.DataFrame) -> pd.Series:
    """Which runs their record calls stuck at chance (lra/chance.py); records without the field are not."""
    if "stuck_at_chance" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["stuck_at_chance"].map(lambda value: value is True)


def _first(values: pd.Series):
    present = values.dropna()
    return present.iloc[0] if len(present) else None


def summarize(runs: pd.DataFrame, metric: str = "test_accuracy", exclude_stuck: bool = False) -> pd.DataFrame:
    """Numbers behind the table, one row per (row, task): the mean, median and std of the completed
    seeds, how many there are, how many of them are stuck at chance (left out of the statistic with
    ``exclude_stuck``, still counted), how many failed; throughput, peak memory and parameters of the
    completed runs, the kind of device they ran on, the row's label and setup."""
    rows = []
    for (name, task), group in runs.groupby(["row" if "row" in runs else "label", "task"], sort=False):
        completed = group[group["status"] == "completed"]
        stuck = _stuck(completed) & completed[metric].notna()  # among the seeds with a valid value: "k of n"
        counted = completed[~stuck] if exclude_stuck else completed
        done = counted[metric].dropna()
        device = efficiency.devices_of(completed["device"] if "device" in completed else [])
        engine = efficiency.engines_of(completed.get("attention_engine", []))
        cost = (lambda field: math.nan if device == efficiency.MIXED or efficiency.engines_mixed(engine)
                else completed.get(field, pd.Series(dtype=float)).mean())
        rows.append({"backend": name, "task": task, "mean": done.mean() if len(done) else math.nan,
                     "std": done.std(ddof=1) if len(done) > 1 else math.nan, "seeds": len(done),
                     "failed": int((group["status"] == "failed").sum()),
                     "unfinished": int((~group["status"].isin(FINISHED)).sum()),
                     "stuck": int(stuck.sum()), "completed": len(completed[metric].dropna()),
                     "invalid": validity.invalid_count(completed, metric),
                     "median": done.median() if len(done) else math.nan,
                     "tokens_per_s": cost("train_tokens_per_second"), "peak_memory_mb": cost("peak_memory_mb"),
                     "num_parameters": completed.get("num_parameters", pd.Series(dtype=float)).mean(),
                     "device": device, "engine": engine, "label": group["label"].iloc[0],
                     "setup": _first(group["setup"]) if "setup" in group else None,
                     "preset_row": _first(group["preset_row"]) if "preset_row" in group else None})
    return pd.DataFrame(rows)


def reference_value(reference: Optional[pd.DataFrame], label: str, column: str) -> float:
    if reference is None or column not in reference.columns:
        return math.nan
    for name in PAPER_NAMES.get(label, [label]):
        if name in reference.index:
            return float(reference.loc[name, column])
    return math.nan


def _configs(runs: pd.DataFrame) -> dict:
    """Each setup fingerprint's flat config."""
    if "setup" not in runs:
        return {}
    present = runs[runs["setup"].notna()]
    return dict(zip(present["setup"], present["setup_config"]))


def _check_setups(summary: pd.DataFrame, reference: pd.DataFrame, configs: dict) -> None:
    """``paper_setup`` and ``paper_setup_why`` of each (row, task) with a paper number and a result, in place
    (:mod:`lra.results.paper_setup`; a reference CSV of the user's own is not checked)."""
    name = reference.attrs.get("reference")
    checker = PaperSetups(name, PAPER_NAMES) if name in PRESETS else None
    verdicts, reasons = [], []
    for _, row in summary.iterrows():
        paper = reference_value(reference, row["label"], row["task"])
        if math.isnan(paper) or math.isnan(row["mean"]):
            verdict, why = None, ""
        elif checker is None:
            verdict, why = UNCHECKED, "a reference table of your own: setups not checked"
        else:
            verdict, why = checker.check(row["label"], row["task"], configs.get(row["setup"]), row["preset_row"])
        verdicts.append(verdict)
        reasons.append(why)
    summary["paper_setup"], summary["paper_setup_why"] = verdicts, reasons


def comparison(runs: pd.DataFrame, metric: str = "test_accuracy", reference: Optional[pd.DataFrame] = None,
               efficiency_task: Optional[str] = None, efficiency: bool = False, statistic: str = "mean",
               exclude_stuck: bool = False) -> pd.DataFrame:
    """Formatted cells ``mean ± std (seeds)`` (the median with ``statistic="median"``), ``k of n at
    chance`` where seeds are stuck there, ``[Δ ±x]`` against ``reference`` when given and the runs are the
    paper's setup (else ``[Δ — why not]``); ``table.attrs["best"]`` marks the best per column,
    ``table.attrs["numbers"]`` the summary, ``attrs["legend"]`` and ``attrs["notes"]`` what a page says
    under it. The efficiency view adds each row's throughput and memory (labelled by device) and its
    parameters against the Softmax row of its own setup (± 10 %)."""
    if runs.empty:
        return pd.DataFrame()
    from lra.results import efficiency as cost

    runs = runs.copy()
    runs["row"], runs["row_rank"], setup_lines = setups.name_rows(runs)
    summary = summarize(runs, metric, exclude_stuck)
    configs = _configs(runs)
    summary["softmax_row"] = cost.softmax_rows(summary, configs)
    tasks = [t for t in TASK_ORDER if t in set(runs["task"])] + sorted(set(runs["task"]) - set(TASK_ORDER))
    rank = runs.groupby("row")["row_rank"].min()
    label_of = runs.groupby("row")["label"].first()
    labels = sorted(set(runs["row"].dropna()), key=lambda row: (label_key(label_of[row]), rank[row], row))
    means = summary.pivot(index="backend", columns="task", values=statistic).reindex(index=labels, columns=tasks)
    complete = means.notna().all(axis=1)
    means[AVERAGE] = means[tasks].mean(axis=1).where(complete)
    cells = pd.DataFrame(MISSING, index=labels, columns=[*tasks, AVERAGE])
    for _, row in summary.iterrows():
        cells.loc[row["backend"], row["task"]] = _cell(row, statistic, exclude_stuck)
    for label in labels:
        if complete[label]:
            cells.loc[label, AVERAGE] = f"{means.loc[label, AVERAGE]:.2f}"
    notes = [*setups.setup_notes(setup_lines, runs), *setups.column_notes(summary, configs)]
    if reference is not None:
        _check_setups(summary, reference, configs)
        _deltas(cells, means, summary, reference, tasks, label_of)
        notes.append(_reference_note(summary, reference))
    direction = validity.better(metric)
    best = (means.eq(means.max(axis=0) if direction == validity.HIGHER else means.min(axis=0), axis=1)
            & means.notna() & (direction is not None))
    engines = ()  # of the rows whose cost columns are shown
    if efficiency or efficiency_task:
        task = efficiency_task or tasks[0]
        rows = summary[summary["task"] == task].set_index("backend").reindex(labels)
        cells[f"{task} tokens/s"] = [cost.throughput_cell(v, k, e) for v, k, e in
                                     zip(rows["tokens_per_s"], rows["device"], rows["engine"])]
        cells[f"{task} peak MB"] = [cost.memory_cell(v, k, e) for v, k, e in
                                    zip(rows["peak_memory_mb"], rows["device"], rows["engine"])]
        cells[f"{task} params vs Softmax"] = cost.parameter_cells(rows)
        engines = rows["engine"]
        best[f"{task} tokens/s"], best[f"{task} peak MB"], best[f"{task} params vs Softmax"] = False, False, False
    cells = cells.rename_axis("backend")
    legend = cell_legend(statistic, exclude_stuck, reference, metric,
                         summary["device"] if efficiency or efficiency_task else None, engines)
    cells.attrs = {"best": best.reindex(columns=cells.columns, fill_value=False), "numbers": summary,
                   "statistic": statistic, "metric": metric, "legend": legend, "notes": [n for n in notes if n],
                   "runs": runs}
    return cells


def _cell(row, statistic: str, exclude_stuck: bool) -> str:
    note = (f", {row['failed']} failed" if row["failed"] else "") + (
        f", {row['unfinished']} unfinished" if row["unfinished"] else "")
    invalid = f"{row['invalid']} invalid" if row["invalid"] else ""
    if row["stuck"]:
        note = f"; {row['stuck']} of {row['completed']} at chance" + (", excluded" if exclude_stuck else "") + note
    if row["seeds"]:
        spread = f" ± {row['std']:.2f}" if row["seeds"] > 1 else ""
        return f"{row[statistic]:.2f}{spread} ({row['seeds']}{', ' + invalid if invalid else ''}{note})"
    if row["stuck"]:
        return f"stuck ({row['stuck']} of {row['completed']} at chance, excluded)"
    if invalid:
        return f"invalid ({row['invalid']}{note})"
    if row["unfinished"]:  # no result yet, which is not no run: "— (1 unfinished)", "— (1 failed, 1 unfinished)"
        return f"{MISSING} ({note.removeprefix(', ')})"
    return FAILED if row["failed"] else MISSING


def _deltas(cells, means, summary, reference, tasks, label_of) -> None:
    """``[Δ x]`` in each cell whose runs are the paper's setup (or cannot be checked), ``[Δ — why]`` in each
    that is not; a row's average only when every task's cell has its delta."""
    verdicts = {(b, t): (v, why) for b, t, v, why in
                zip(summary["backend"], summary["task"], summary["paper_setup"], summary["paper_setup_why"])}
    # A paper's average is comparable only when this table has exactly the paper's tasks.
    same_tasks = set(tasks) == set(reference.columns) - {AVERAGE}
    for row in cells.index:
        label = label_of[row]
        for column in (cells.columns if same_tasks else tasks):
            paper = reference_value(reference, label, column)
            if math.isnan(paper) or math.isnan(means.loc[row, column]):
                continue
            if column == AVERAGE:
                refused = [verdicts.get((row, t), (None,))[0] == NOT_PAPER for t in tasks]
                cells.loc[row, column] += (" [Δ — not every task at the paper's setup]" if any(refused)
                                           else f" [Δ {means.loc[row, column] - paper:+.2f}]")
            elif verdicts[(row, column)][0] == NOT_PAPER:
                cells.loc[row, column] += f" [Δ — {verdicts[(row, column)][1]}]"
            else:
                cells.loc[row, column] += f" [Δ {means.loc[row, column] - paper:+.2f}]"


def _reference_note(summary: pd.DataFrame, reference: pd.DataFrame) -> str:
    unchecked = summary[summary["paper_setup"] == UNCHECKED]
    if not len(unchecked):
        return ""
    cells = ", ".join(f"{b} on {t}" for b, t in zip(unchecked["backend"], unchecked["task"]))
    return "Δ not checked against the paper's setup: " + (
        "the reference is a table of your own, with no preset to compare the runs' setups with"
        if reference.attrs.get("reference") not in PRESETS else
        f"the runs of {cells} record no config, so their setup is unknown")


def cell_legend(statistic: str, exclude_stuck: bool, reference: Optional[pd.DataFrame], metric: str, devices,
                engines=()) -> str:
    """What a cell of the table says, for under it."""
    direction = validity.better(metric)
    bold = ("**bold**: the best of a column" if direction == validity.HIGHER and metric.endswith("accuracy") else
            f"**bold**: the {'highest' if direction == validity.HIGHER else 'lowest'} {metric} of a column"
            if direction else f"nothing is bold: a higher or lower {metric} is not better in itself")
    lines = [f"{statistic} ± std over seeds (n): n is the number of seeds in the {statistic}, and a std needs two",
             "k of n at chance: seeds whose record says the run never left chance level, "
             + ("left out of the statistic" if exclude_stuck else "counted in it"),
             "runs that failed, have not finished or hold an invalid value are counted beside n, never in it; "
             f"{bold}; "
             "average: over the tasks, for a row with all of them; a row is one setup (its label, and what sets "
             "it apart where the label has several)"]
    if reference is not None:
        name = reference.attrs.get("reference")
        preset = f"experiment={PRESETS[name]}" if name in PRESETS else "the paper's"
        lines.append(f"Δ (in brackets after a cell): the cell minus the paper's number, where the runs are {preset}'s "
                     "setup for that row and task; elsewhere the brackets say why there is none")
    if devices is not None:
        lines += efficiency.legend(devices, engines)
    return "how to read the cells:\n" + "\n".join(f"- {line}" for line in lines)


def side_by_side(table: pd.DataFrame) -> pd.DataFrame:
    """One row per attention (and setup), each task's from-scratch cell beside its self-pretrained one and
    the change of the statistic (``+SPT Δ``); a row with only one of the two shows the other as missing."""
    summary = table.attrs["numbers"]
    tasks = [c for c in table.columns if c in set(summary["task"])]
    statistic = table.attrs.get("statistic", "mean")
    label_of = summary.drop_duplicates("backend").set_index("backend")["label"]

    def paired(row: str) -> tuple:  # (the row's name without +SPT, whether it is the +SPT one)
        label = label_of[row]
        base, pretrained = base_label(label)
        return base + row[len(label):], pretrained, base

    pairs = {row: paired(row) for row in table.index}
    bases = sorted({(name, base) for name, _, base in pairs.values()}, key=lambda p: (label_key(p[1]), p[0]))
    out = pd.DataFrame(MISSING, index=pd.Index([name for name, _ in bases], name="backend"),
                       columns=[f"{t}{suffix}" for t in tasks for suffix in ("", " +SPT", " +SPT Δ")])
    values = summary.set_index(["backend", "task"])[statistic]
    configs = _configs(table.attrs.get("runs", pd.DataFrame()))
    setup_of = summary.set_index(["backend", "task"])["setup"]
    unpaired = []
    for name, _ in bases:
        scratch = next((row for row, p in pairs.items() if p[:2] == (name, False)), None)
        spt = next((row for row, p in pairs.items() if p[:2] == (name, True)), None)
        for task in tasks:
            for row, suffix in ((scratch, ""), (spt, " +SPT")):
                if row is not None:
                    out.loc[name, f"{task}{suffix}"] = table.loc[row, task]
            before, after = values.get((scratch, task), math.nan), values.get((spt, task), math.nan)
            differ = _beyond_pretraining(*(configs.get(setup_of.get((row, task))) for row in (scratch, spt)))
            if differ:
                unpaired.append(f"- {name} on {task}: {setups.compact(differ, 3)}")
            elif not (math.isnan(before) or math.isnan(after)):
                out.loc[name, f"{task} +SPT Δ"] = f"{after - before:+.2f}"
    out.attrs = {key: value for key, value in table.attrs.items() if key != "best"}
    if unpaired:
        out.attrs["notes"] = [*out.attrs.get("notes", []), "no +SPT Δ where the from-scratch and self-pretrained runs "
                              "differ in more than self-pretraining (scratch ≠ +SPT):\n" + "\n".join(unpaired)]
    out.attrs["best"] = pd.DataFrame(False, index=out.index, columns=out.columns)
    return out


def _beyond_pretraining(scratch: Optional[dict], pretrained: Optional[dict]) -> List[str]:
    """:func:`setups.differences` of two setups' flat configs outside ``pretrain.*`` ("trainer.lr 0.001 ≠ 0.003"), or
    none where either is unknown (a record without its config)."""
    if not isinstance(scratch, dict) or not isinstance(pretrained, dict):
        return []
    outside = lambda config: {k: v for k, v in config.items() if not k.startswith("pretrain.")}  # noqa: E731
    return setups.differences(outside(scratch), outside(pretrained))


def numbers(table: pd.DataFrame, reference: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """The numbers behind ``table`` (one record per row × task), with the paper value and the delta where the
    runs are the paper's setup (``paper_setup``, and why not)."""
    out = table.attrs["numbers"].copy()
    if reference is not None:
        out["paper"] = [reference_value(reference, b, t) for b, t in zip(out["label"], out["task"])]
        drawn = out["paper_setup"].isin([PAPER, UNCHECKED]) if "paper_setup" in out else True
        out["delta"] = (out["mean"] - out["paper"]).where(drawn)
    return out


def render(directories: List[Path], warn=lambda message: None) -> str:
    return render_records(*read_runs(directories, warn), warn=warn)


def render_records(records: List[dict], warn=lambda message: None, unplaced=()) -> str:
    """:func:`render` of runs already read (:func:`lra.results.reading.read_runs`)."""
    runs = pd.DataFrame(deduplicate(records, warn))
    return page(comparison(runs), runs, records, unplaced=unplaced)
