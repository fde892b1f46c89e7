"""``lra-table DIR...``: aggregate run records into a comparison table.

Markdown and LaTeX (booktabs) give the formatted table; CSV and JSON give the numbers behind it,
one record per (backend, task): mean, std, seeds, failed, and the paper value and delta with
``--reference``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from lra.commands.config_errors import at_the_edge
from lra.errors import UserError
from lra.io import atomic_write_text, check_output_file
from lra.records import HISTORY, METRICS
from lra.results import chart, validity
from lra.run import CHECKPOINTS, LOCK, LOG, PRETRAIN, RESOLVED
from lra.results.table import (REFERENCES, collect_wandb, comparison, deduplicate, failures, load_reference, numbers,
                               read_records, record_files, run_list, side_by_side, status_counts, to_latex,
                               to_markdown, validation_notes)


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="lra-table", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("directories", nargs="*", type=Path,
                        help="run or sweep directories (or metrics.json files); each run counts once")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also read the runs of a W&B project")
    parser.add_argument("--format", choices=["markdown", "latex", "csv", "json"], default="markdown")
    parser.add_argument("--metric", default="test_accuracy", help="metrics.json field to tabulate")
    parser.add_argument("--reference", help=f"deltas against a published table: {', '.join(REFERENCES)} or a CSV "
                        "(method,<task>...,avg)")
    parser.add_argument("--efficiency", nargs="?", const="", metavar="TASK",
                        help="add training tokens/s and peak memory of TASK's runs (default: the first task column)")
    parser.add_argument("--statistic", choices=["mean", "median"], default="mean",
                        help="each cell's centre over seeds (default mean; the spread is the std either way)")
    parser.add_argument("--exclude-stuck", action="store_true",
                        help="leave seeds stuck at chance (stuck_at_chance in their record) out of the statistic; "
                             "each cell still says how many there were")
    parser.add_argument("--side-by-side", action="store_true",
                        help="one row per attention: each task from scratch beside self-pretrained (+SPT) and the change")
    parser.add_argument("--runs", action="store_true",
                        help="markdown: also list every run, a row each: seed, status, test accuracy, steps, the "
                             "steps it was resumed at, wall time, device and commit (a results page's per-run list)")
    parser.add_argument("--output", type=Path, help="write here instead of standard output")
    parser.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="also draw the LRA paper's Figure 3: accuracy against training speed, bubble area = peak "
                        "memory (both relative to Softmax), the YOSO paper's points faint behind")
    parser.add_argument("--plot-task", metavar="TASK", help="the chart's accuracy: this task (default: the only task, "
                        "else the average over every task, speed and memory from the first)")
    args = parser.parse_args(argv)
    if args.runs and args.format != "markdown":
        parser.exit(2, f"error: --runs lists the runs in markdown, not {args.format}; drop --format or --runs\n")
    missing = [d for d in args.directories if not d.exists()]
    if missing:
        parser.exit(2, f"error: no such directory: {', '.join(map(str, missing))}; pass run or sweep folders under runs/\n")
    if not args.directories and not args.wandb:
        parser.exit(2, "error: give run or sweep directories, or --wandb ENTITY/PROJECT\n")
    try:
        reference = load_reference(args.reference) if args.reference else None
    except (OSError, ValueError, KeyError) as exc:
        parser.exit(2, f"error: cannot read the reference table {args.reference!r} ({exc}); use one of "
                       f"{', '.join(REFERENCES)} or a CSV with a 'method' column\n")
    warn = lambda message: print(f"note: {message}", file=sys.stderr)  # noqa: E731
    files = record_files(args.directories)
    _check_outputs(args, files)
    records = read_records(files, warn, args.metric) if args.directories else []
    if args.directories and not records and not args.wandb:
        where = ", ".join(map(str, args.directories))
        if not files:
            parser.exit(2, f"error: no run records (metrics.json) under {where}; pass run or sweep folders (runs/<date>/"
                           "<time>, runs/multirun/<date>/<time>)\n")
        parser.exit(1, f"error: none of the {len(files)} run records under {where} can be tabulated (the notes above "
                       "say why); pass the folders of runs whose metrics.json is whole\n")
    screened = [*validity.TABLE_FIELDS, *_numeric_metric(records, args.metric, warn)]
    frames = [pd.DataFrame(deduplicate(records, warn))] if args.directories else []
    if args.wandb:
        try:
            frames.append(collect_wandb(args.wandb))
        except Exception as exc:  # no key, no network, no such project: the W&B client's reason
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            parser.exit(1, f"error: cannot read the W&B project {args.wandb!r} ({reason}); log in with "
                           "`wandb login` (or set WANDB_API_KEY) and check ENTITY/PROJECT\n")
    runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for field in (f for f in screened if f in runs):  # numbers or None once screened (None when all were invalid)
        runs[field] = pd.to_numeric(runs[field])
    if not runs.empty:
        numeric = sorted(c for c in runs.columns if pd.api.types.is_numeric_dtype(runs[c]) and c != "seed")
        if args.metric not in runs.columns:
            parser.exit(2, f"error: no run record has the metric {args.metric!r}; choose --metric from "
                           f"{', '.join(numeric)}\n")
        if args.metric not in numeric:
            parser.exit(2, f"error: --metric {args.metric} is not a number in the run records; choose --metric "
                           f"from {', '.join(numeric)}\n")
        if args.efficiency and args.efficiency not in set(runs["task"]):
            parser.exit(2, f"error: no runs of task {args.efficiency!r} for --efficiency; choose one of "
                           f"{', '.join(sorted(set(runs['task'])))}\n")
    table = comparison(runs, args.metric, reference, efficiency_task=args.efficiency or None,
                       efficiency=args.efficiency is not None, statistic=args.statistic,
                       exclude_stuck=args.exclude_stuck)
    if args.side_by_side and not table.empty:
        table = side_by_side(table)
    if table.empty:
        text = "(no runs found)"
    elif args.format == "markdown":
        failed = failures(records)
        notes = "\n\n".join(n for n in (validation_notes(runs), validity.notes(records)) if n)
        text = (to_markdown(table) + f"\n\nruns: {status_counts(runs)}" + (f"\n\n{notes}" if notes else "")
                + (f"\n\n{failed}" if failed else "") + (f"\n\n{run_list(runs)}" if args.runs else ""))
    elif args.format == "latex":
        text = to_latex(table)
    else:
        records = numbers(table, reference)
        text = (records.to_csv(index=False) if args.format == "csv"
                else records.astype(object).where(records.notna(), None).to_json(orient="records", indent=2))
    if args.plot and not table.empty:
        _plot(parser, args, table, set(runs["task"]), warn)
    if args.output:
        try:
            atomic_write_text(args.output, text.rstrip("\n") + "\n")
        except OSError as exc:
            parser.exit(1, f"error: {_write_error(exc, args.output, '--output')}\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")


# What a run folder holds (lra.run, lra.records): a table written there takes none of these names.
RUN_FILES = (METRICS, HISTORY, LOG, LOCK, RESOLVED.parts[0], CHECKPOINTS, PRETRAIN)


def _numeric_metric(records, metric: str, warn) -> list:
    """[metric] when it is a number in some record (then each record's value is screened like the
    table's own fields, :mod:`lra.results.validity`), else [] (e.g. --metric label: refused later)."""
    if metric in validity.TABLE_FIELDS or not any(validity.is_number(r.get(metric)) for r in records):
        return []
    for record in records:
        validity.screen(record, [metric], warn, str(Path(record["run_dir"]) / METRICS))
    return [metric]


def _check_outputs(args, records) -> None:
    """--output and --plot, before anything is read or written: a file name in a folder this process
    may write (missing folders are made), never a file lra-table reads (a run record, the reference
    CSV), never named ``metrics.json`` (the next table would read it as a run record), and never one
    of a run folder's own files (:data:`RUN_FILES`)."""
    reads = [*records, *([args.reference] if args.reference and args.reference not in REFERENCES else [])]
    outputs = [(option, path) for option, path in (("--output", args.output), ("--plot", args.plot)) if path]
    for option, path in outputs:
        path = check_output_file(path, option, reads=reads)
        if path.name == METRICS:
            raise UserError(f"{option}: {path} is named like a run record (lra-table would read it as one); "
                            f"give {option} another name")
        run = next((folder for folder in path.parents if (folder / METRICS).is_file()), None)
        if run is not None and path.relative_to(run).parts[0] in RUN_FILES:
            raise UserError(f"{option}: {path} is one of the files of the run in {run}, which lra-table never "
                            f"replaces; give {option} another name")
    if len(outputs) == 2 and args.output.resolve() == args.plot.resolve():
        raise UserError(f"--output and --plot are the same file ({args.output}); give them two names")


def _plot(parser, args, table, tasks, warn) -> None:
    """``--plot``: the chart of ``table``'s numbers, or one error line."""
    chart_task = args.plot_task or (next(iter(tasks)) if len(tasks) == 1 else None)
    if chart_task is not None and chart_task not in tasks:
        parser.exit(2, f"error: no runs of task {chart_task!r} to plot; --plot-task is one of {', '.join(sorted(tasks))}\n")
    try:
        chart.plot(table.attrs["numbers"], args.plot, chart_task, warn)
    except ValueError as exc:
        parser.exit(1, f"error: cannot draw {args.plot}: {exc}\n")
    except OSError as exc:
        parser.exit(1, f"error: {_write_error(exc, args.plot, '--plot')}\n")


def _write_error(exc: OSError, path: Path, option: str) -> str:
    """The one line for ``exc`` met writing ``path``: the edge's own (a full disk: free space, a read-only
    disk: write elsewhere), else what failed and the option to change."""
    from lra.commands.config_errors import os_error_line, path_kind_line

    return (os_error_line(exc) or path_kind_line(exc)
            or f"cannot write {path} ({exc.strerror or exc}); give {option} a path in a folder you may write to")


if __name__ == "__main__":
    main()
