"""``lra-table DIR...``: aggregate run records into a comparison table.

Markdown and LaTeX (booktabs) give the formatted table; CSV and JSON give the numbers behind it,
one record per (backend, task): mean, std, seeds, failed, and the paper value and delta with
``--reference``.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

import pandas as pd

from lra.commands.config_errors import at_the_edge
from lra.errors import UserError
from lra.io import atomic_write_text, check_output_file, kind
from lra.records import HISTORY, METRICS
from lra.results import chart, cost, validity, wandb_runs
from lra.results.formats import note, to_latex, visible
from lra.results.reading import read_found, record_files, shown_path
from lra.results.reference import REFERENCES, load_reference
from lra.results.listing import page
from lra.results.table import comparison, deduplicate, numbers, side_by_side
from lra.run import CHECKPOINTS, LOCK, LOG, PRETRAIN, RESOLVED


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="lra-table", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("directories", nargs="*",
                        help="run or sweep directories (or metrics.json files); each run counts once; a record that "
                        "is no regular file, is over 16 MiB or nests JSON over 32 levels is skipped with a note")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also read the runs of a W&B project")
    parser.add_argument("--format", choices=["markdown", "latex", "csv", "json"], default="markdown")
    parser.add_argument("--metric", default="test_accuracy", help="metrics.json field to tabulate")
    parser.add_argument("--reference", help=f"deltas against a published table: {', '.join(REFERENCES)} or a CSV "
                        "(method,<task>...,avg; one row per method, numbers or empty cells; # starts a comment line)")
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
    parser.add_argument("--output", type=Path, help="write here instead of standard output (a regular file, or a "
                        "link to where one is written)")
    parser.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="also draw the LRA paper's Figure 3: accuracy against training speed, bubble area = peak "
                        "memory (both relative to Softmax), the YOSO paper's points faint behind")
    parser.add_argument("--plot-task", metavar="TASK", help="the chart's accuracy: this task (default: the only task, "
                        "else the average over every task, speed and memory from the first)")
    cost.add_arguments(parser)
    args = parser.parse_args(argv)
    for option in ("--reference", "--wandb", "--plot-task", "--metric"):  # "$UNSET": not the same as leaving it out
        value = getattr(args, option.removeprefix("--").replace("-", "_"))
        if value is not None and not value.strip():
            parser.exit(2, f"error: {option} is empty (an unset shell variable?); give it a value, or leave {option} "
                           "out\n")
    if args.plot_task is not None and args.plot is None:
        parser.exit(2, "error: --plot-task chooses the accuracy of the chart --plot draws; add --plot FILE.png, or "
                       "leave --plot-task out\n")
    if args.runs and args.format != "markdown":
        parser.exit(2, f"error: --runs lists the runs in markdown, not {args.format}; drop --format or --runs\n")
    cost.check_arguments(parser, args)
    if any(not d.strip() for d in args.directories):  # Path("") is ".": an unset variable would table the cwd
        parser.exit(2, "error: a directory argument is empty (an unset shell variable?); give run or sweep folders, "
                       "or . for this one\n")
    args.directories = [Path(d) for d in args.directories]
    missing = [d for d in args.directories if not d.exists() and not d.is_symlink()]  # a link: the reader says why
    if missing:
        parser.exit(2, f"error: no such directory: {', '.join(map(shown_path, missing))}; pass run or sweep folders "
                       "under runs/\n")
    if not args.directories and not args.wandb:
        parser.exit(2, "error: give run or sweep directories, or --wandb ENTITY/PROJECT\n")
    reference = load_reference(args.reference) if args.reference else None  # a table it cannot use: one line
    warn = note
    unlisted = []
    jobs = []  # run folders without a record
    files = record_files(args.directories, lambda line: (unlisted.append(line), warn(line)), jobs)
    _check_outputs(args, files)
    records, unplaced = read_found(files, jobs, warn, args.metric) if args.directories else ([], [])
    if args.directories and not records and not args.wandb:
        where = ", ".join(map(shown_path, args.directories))
        if not files and not jobs and unlisted:
            many = len(unlisted) > 1
            parser.exit(1, f"error: no run record found under {where}, where {len(unlisted)} folder{'s' * many} could "
                           f"not be listed (the note{'s' * many} above name{'s' * (not many)} "
                           f"{'them' if many else 'it'}); give this user read access, or pass folders it can read\n")
        if not files and not jobs:
            parser.exit(2, f"error: no run records (metrics.json) under {where}; pass run or sweep folders (runs/<date>/"
                           "<time>, runs/multirun/<date>/<time>)\n")
        without = f" and {len(jobs)} run folders without one" if jobs else ""
        parser.exit(1, f"error: none of the {len(files)} run records{without} under {where} can be tabulated (the notes "
                       "above say why); pass the folders of runs whose metrics.json is whole\n")
    if args.cost:  # what the runs cost on a GPU, and a preset × seeds projected (lra/results/cost.py)
        return _emit(parser, args, cost.report(deduplicate(records, warn), args.cost_preset, args.cost_seeds,
                                               args.gpu_share, warn))
    if args.wandb:
        try:
            fetched = wandb_runs.fetch(args.wandb)
        except Exception as exc:  # no key, no network, no such project: the W&B client's reason
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            parser.exit(1, f"error: cannot read the W&B project {args.wandb!r} ({reason}); log in with "
                           "`wandb login` (or set WANDB_API_KEY) and check ENTITY/PROJECT\n")
        records = [*records, *wandb_runs.records(fetched, records, warn, args.metric)]
    screened = [*validity.TABLE_FIELDS, *_numeric_metric(records, args.metric, warn)]
    runs = pd.DataFrame(deduplicate(records, warn))
    for field in (f for f in screened if f in runs):  # numbers or None once screened (None when all were invalid)
        runs[field] = pd.to_numeric(runs[field])
    if not runs.empty:
        numeric = sorted(c for c in runs.columns if pd.api.types.is_numeric_dtype(runs[c])
                         and not pd.api.types.is_bool_dtype(runs[c]) and c not in ("seed", "row_rank"))
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
        text = page(table, runs, records, every_run=args.runs, unplaced=unplaced)
    elif args.format == "latex":
        text = to_latex(table)
    else:
        records = numbers(table, reference)
        text = (records.to_csv(index=False) if args.format == "csv"
                else records.astype(object).where(records.notna(), None).to_json(orient="records", indent=2))
    if args.plot and not table.empty:
        _plot(parser, args, table, set(runs["task"]), warn)
    _emit(parser, args, text)


def _emit(parser, args, text: str) -> None:
    """``text`` to --output, else to standard output."""
    if args.output:
        try:
            atomic_write_text(args.output, text.rstrip("\n") + "\n")
        except OSError as exc:
            parser.exit(1, f"error: {_write_error(exc, args.output, '--output')}\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")


# What a run folder holds (lra.run, lra.records): a table written there takes none of these names.
RUN_FILES = (METRICS, HISTORY, LOG, LOCK, RESOLVED.parts[0], CHECKPOINTS, PRETRAIN)
SWEEP_RECORD = "multirun.yaml"  # Hydra's record of a sweep, in its folder


def _numeric_metric(records, metric: str, warn) -> list:
    """[metric] when it is a number in some record (then each record's value is screened like the
    table's own fields, :mod:`lra.results.validity`), else [] (e.g. --metric label: refused later)."""
    if metric in validity.TABLE_FIELDS or not any(validity.is_number(r.get(metric)) for r in records):
        return []
    for record in records:
        validity.screen(record, [metric], warn, wandb_runs.where(record))
    return [metric]


def _check_outputs(args, records) -> None:
    """--output and --plot, before anything is read or written: a file name in a folder this process
    may write (missing folders are made), never a file lra-table reads (a run record, the reference
    CSV), never named ``metrics.json`` (the next table would read it as a run record), and never one
    of a run folder's own files (:data:`RUN_FILES`)."""
    reads = [*records, *([args.reference] if args.reference and args.reference not in REFERENCES else [])]
    reads = [path for path in reads if _resolves(path)]  # a loop of links named metrics.json: nothing to overwrite
    outputs = [(option, path) for option, path in (("--output", args.output), ("--plot", args.plot)) if path]
    for option, path in outputs:
        path = check_output_file(_output_target(path, option), option, reads=reads)
        setattr(args, option.removeprefix("--"), path)  # where it is written
        if path.name == METRICS:
            raise UserError(f"{option}: {path} is named like a run record (lra-table would read it as one); "
                            f"give {option} another name")
        run = next((folder for folder in path.parents if (folder / METRICS).is_file()), None)
        if run is not None and path.relative_to(run).parts[0] in RUN_FILES:
            raise UserError(f"{option}: {path} is one of the files of the run in {run}, which lra-table never "
                            f"replaces; give {option} another name")
        if (path.name == SWEEP_RECORD and path.exists()) or RESOLVED.parts[0] in path.parts:
            raise UserError(f"{option}: {path} is a file Hydra keeps of a sweep or run, which lra-table never "
                            f"replaces; give {option} another name (table.md beside it, say)")
    if len(outputs) == 2 and args.output.resolve() == args.plot.resolve():
        raise UserError(f"--output and --plot are the same file ({args.output}); give them two names")


def _output_target(path: Path, option: str) -> Path:
    """Where --output or --plot ``path`` is written: a symbolic link's target (the link stays a link, as with a
    shell's ``>``). Refused, as the table's file is written whole and renamed over the name, which would
    replace what is there: an open file of a process (/dev/stdout, /dev/fd/1, /proc/self/fd/1), a file that is
    no regular file nor folder (a device such as /dev/null, a named pipe, a socket), a loop of links."""
    import errno
    import re

    current, hops = os.path.abspath(path), 0
    while True:
        if re.fullmatch(r"/proc/[^/]+/fd", os.path.realpath(os.path.dirname(current))):
            raise UserError(f"{option}: {path} is a file a process has open (standard output or another), which "
                            f"lra-table cannot replace whole; give {option} a file name"
                            + (", or leave --output out to write to standard output" if option == "--output" else ""))
        if not os.path.islink(current) or hops > 40:
            break
        current, hops = os.path.join(os.path.dirname(current), os.readlink(current)), hops + 1
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{option}: {path} is a loop of symbolic links; give {option} another name") from None
        return _followed(path)  # missing (made, where a link points), or for check_output_file to name
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UserError(f"{option}: {path} is {kind(mode)}, not a regular file (lra-table writes a file whole and "
                        f"renames it over the name, which would replace it); give {option} a file name"
                        + (", or leave --output out to write to standard output" if option == "--output" else ""))
    return _followed(path)


def _followed(path: Path) -> Path:
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def _resolves(path) -> bool:
    try:
        Path(path).expanduser().resolve()
        return True
    except (OSError, RuntimeError):  # a loop of symbolic links: RuntimeError before Python 3.13
        return False


def _plot(parser, args, table, tasks, warn) -> None:
    """``--plot``: the chart of ``table``'s numbers, or one error line."""
    chart_task = args.plot_task or (next(iter(tasks)) if len(tasks) == 1 else None)
    if chart_task is not None and chart_task not in tasks:
        parser.exit(2, f"error: no runs of task {chart_task!r} to plot; --plot-task is one of {', '.join(sorted(tasks))}\n")
    try:
        chart.plot(table.attrs["numbers"], args.plot, chart_task, warn)
    except ValueError as exc:
        reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        parser.exit(1, f"error: cannot draw {args.plot}: {visible(reason)}\n")
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
