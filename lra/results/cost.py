"""``lra-table DIR... --cost``: what the runs cost on a GPU, and what a preset's table would.

From the records: each run's GPU-seconds and their H100-seconds; the mean H100-seconds of a completed run
per row × task, a row being one setup as in the table (:func:`lra.results.setups.name_rows`: runs of one
label trained differently are separate rows), every completed run of the cell counted in it; then a
preset × seeds in H100-hours.

Every figure says what it rests on, in one vocabulary (:func:`basis_of` decides it): **measured**, the
record's ``gpu_seconds`` (:mod:`lra.gpus`: wall time weighted by the run's counted share of the GPU);
**derived**, a record from before ``gpu_seconds`` (a CUDA run with a wall time): wall time × processes × an
*assumed* share of the GPU, ``--gpu-share`` or :data:`DEFAULT_GPU_SHARE`; a mean is measured only when every
run in it is, derived when any is. A projected cell is **projected** (the H100-seconds per training token of
runs, times the cell's training tokens), whatever its runs' basis, which a note gives. A GPU other than the
H100 is converted only with a known factor (:data:`H100_FACTORS`); without one its runs are counted
unconverted and left out of the projection.

The record's numbers this report reads are screened as the table's are (:mod:`lra.results.validity`), and
further: ``processes`` a whole number ≥ 1, ``train_tokens`` a whole number, ``gpu_seconds`` no more than
wall time × processes (a share of the GPU above 1 is no measurement). A bad value is a note naming the
record and the value, and what it would have given is shown as unknown, never guessed.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pandas as pd

from lra.errors import ConfigError
from lra.results import setups, validity
from lra.results.cost_preset import preset_cells, preset_of, presets, run_tokens
from lra.results.formats import markdown_cell
from lra.results.rows import MISSING, TASK_ORDER, label_key

# H100-seconds per second of a GPU, by the name CUDA gives it (a record's gpu_name). Only the reference GPU
# itself: another is converted once a measurement of the same runs on both gives its factor.
H100 = "NVIDIA H100 80GB HBM3"
H100_FACTORS = {H100: 1.0}
# The share of its GPU a CUDA record without gpu_seconds is taken to have had: 4 runs to a GPU, as
# `lra-gpu-check --reference` packs the reference runs (--jobs-per-gpu 4) and as the committed GPU records
# ran (docs/gpu/*/records; docs/reference-setup.md). --gpu-share sets another.
DEFAULT_GPU_SHARE = Fraction(1, 4)
DEFAULT_SEEDS = 3
# The smallest --gpu-share: 1,024 runs to a GPU, far beyond any packing; a smaller share is a typo (1e-4 for
# 1/4) or too small for a float (1e-400 is 0.0).
SMALLEST_SHARE = Fraction(1, 1024)
MOST_SEEDS = 1000  # --cost-seeds: a table is run with a few seeds; more than this is a typo
# gpu_seconds may exceed wall time × processes by a float's rounding (each stretch is summed apart), no more.
SHARE_ROUNDING = 1e-6
COST_FIELDS = ("gpu_seconds", "train_tokens")  # the record's numbers this report reads besides the table's
UNKNOWN_WHEN_INVALID = {"gpu_seconds": "its GPU time is taken as unknown",
                        "train_tokens": "its training tokens are taken as unknown"}
# What a figure rests on (:func:`basis_of`), and a run without GPU time: what each table prints.
MEASURED, DERIVED, PROJECTED = "measured", "derived", "projected"
UNKNOWN, CPU = "unknown", "cpu"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cost", action="store_true",
                        help="instead of the table: each run's GPU time (GPU-seconds, H100-seconds), the mean "
                        "H100-seconds of a run per row x task, and a preset x seeds projected in H100-hours")
    parser.add_argument("--cost-preset", metavar="NAME", help="with --cost: the preset to project (an experiment "
                        "that sweeps rows x tasks, e.g. yoso_table3; default: the one the records name)")
    parser.add_argument("--cost-seeds", type=int, metavar="N", help=f"with --cost: seeds per cell in the projection "
                        f"(default {DEFAULT_SEEDS})")
    parser.add_argument("--gpu-share", metavar="SHARE", help="with --cost: the share of its GPU a CUDA record "
                        "without gpu_seconds had (1/4: four runs at once; 1: alone); default "
                        f"{DEFAULT_GPU_SHARE}, as the committed GPU records ran")


# The table's options that --cost does not use, with their defaults.
TABLE_OPTIONS = (("--wandb", "wandb", None), ("--format", "format", "markdown"),
                 ("--metric", "metric", "test_accuracy"),
                 ("--reference", "reference", None), ("--efficiency", "efficiency", None),
                 ("--statistic", "statistic", "mean"), ("--exclude-stuck", "exclude_stuck", False),
                 ("--side-by-side", "side_by_side", False), ("--runs", "runs", False), ("--plot", "plot", None),
                 ("--plot-task", "plot_task", None))


def check_arguments(parser: argparse.ArgumentParser, args) -> None:
    """The --cost options together, each mistake one line (exit 2); ``args.gpu_share`` becomes a Fraction."""
    if not args.cost:
        given = [o for o, value in (("--cost-preset", args.cost_preset), ("--cost-seeds", args.cost_seeds),
                                    ("--gpu-share", args.gpu_share)) if value is not None]
        if given:
            parser.exit(2, f"error: {', '.join(given)} only go with --cost; add --cost, or leave them out\n")
        return
    clashing = [option for option, name, default in TABLE_OPTIONS if getattr(args, name, default) != default]
    if clashing:
        parser.exit(2, f"error: --cost prints what the runs cost (markdown), not the table that {', '.join(clashing)} "
                       f"shape{'s' * (len(clashing) == 1)}; run lra-table twice, with --cost and without\n")
    if not args.directories:
        parser.exit(2, "error: --cost reads run records: give run or sweep directories\n")
    if args.cost_preset is not None and not args.cost_preset.strip():
        parser.exit(2, "error: --cost-preset is empty (an unset shell variable?); give it a preset, or leave it out "
                       "(default: the preset the records name)\n")
    if args.cost_seeds is not None and args.cost_seeds < 1:
        parser.exit(2, f"error: --cost-seeds {args.cost_seeds}: a preset's table needs at least 1 seed; give "
                       f"--cost-seeds N with N >= 1\n")
    if args.cost_seeds is not None and args.cost_seeds > MOST_SEEDS:  # not echoed: it may have hundreds of digits
        parser.exit(2, f"error: --cost-seeds is above {MOST_SEEDS} (a table is run with a few seeds per cell); give "
                       f"--cost-seeds N with 1 <= N <= {MOST_SEEDS}\n")
    if args.gpu_share is not None:
        args.gpu_share = parse_share(args.gpu_share, lambda line: parser.exit(2, f"error: {line}\n"))


def parse_share(text: str, fail: Callable[[str], None]) -> Fraction:
    """``1/4`` or ``0.25``: a share of a GPU in [:data:`SMALLEST_SHARE`, 1]."""
    try:
        share = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        share = None
    if share is None or not SMALLEST_SHARE <= share <= 1:
        fail(f"--gpu-share {text!r}: give the share of its GPU a run had, a number from {SMALLEST_SHARE} to 1 such "
             "as 1/4 (four runs at once) or 1 (alone)")
    return share


@dataclass
class RunCost:
    """One record's GPU time. ``basis``: :data:`MEASURED` (its gpu_seconds), :data:`DERIVED` (wall time ×
    an assumed share × processes), :data:`CPU` (no GPU time) or :data:`UNKNOWN` (a CUDA record without a
    usable wall time or gpu_seconds)."""

    record: dict
    basis: str
    gpu_name: Optional[str] = None
    gpu_seconds: Optional[float] = None
    share: Optional[float] = None
    tokens: Optional[int] = None
    preset: Optional[str] = None
    row: Optional[str] = None  # the table's row (:func:`name_rows`); its label until named
    row_rank: int = 0  # the row's place among its label's rows (its main setup first)

    @property
    def label(self) -> str:
        return self.record["label"]

    @property
    def row_name(self) -> str:
        return self.row if self.row is not None else self.label

    @property
    def task(self) -> str:
        return self.record["task"]

    @property
    def factor(self) -> Optional[float]:
        return H100_FACTORS.get(self.gpu_name)

    @property
    def h100_seconds(self) -> Optional[float]:
        return None if self.gpu_seconds is None or self.factor is None else self.gpu_seconds * self.factor


def gpu_name(record: dict) -> Optional[str]:
    """The GPU a record ran on: its ``gpu_name``, else the name in its device ("cuda (NVIDIA H100 80GB HBM3)",
    lra.records.describe_device); None for a CPU record."""
    if isinstance(record.get("gpu_name"), str) and record["gpu_name"].strip():
        return record["gpu_name"]
    device = record.get("device")
    if isinstance(device, str) and device.startswith("cuda"):
        inside = device[len("cuda"):].strip()
        return inside[1:-1] if inside.startswith("(") and inside.endswith(")") else (inside or "CUDA device")
    return None


def run_cost(record: dict, gpu_share: Optional[Fraction], warn: Callable[[str], None]) -> RunCost:
    """What ``record`` (read by :func:`lra.results.reading.read_records`) cost on its GPU."""
    where = str(Path(record["run_dir"]) / "metrics.json")
    validity.screen(record, COST_FIELDS, warn, where, consequences=UNKNOWN_WHEN_INVALID)
    name = gpu_name(record)
    screen_counts(record, name is not None, warn, where)
    invalid = record.get(validity.INVALID, {})
    tokens = record.get("train_tokens")
    if tokens is None and "train_tokens" not in invalid:  # a record from before train_tokens: from its config
        tokens = run_tokens(Path(record["run_dir"]), record.get("steps"), warn)
    cost = RunCost(record, CPU, name, tokens=None if tokens is None else int(tokens),
                   preset=preset_of(Path(record["run_dir"]), warn))
    if name is None:
        return cost
    wall = record.get("wall_time_seconds")
    processes = int(record["processes"]) if record.get("processes") is not None else 1  # absent: one
    if "processes" in invalid or "gpu_seconds" in invalid:
        cost.basis = UNKNOWN
    elif record.get("gpu_seconds") is not None:
        cost.basis, cost.gpu_seconds = MEASURED, float(record["gpu_seconds"])
        cost.share = cost.gpu_seconds / (wall * processes) if wall else None
    elif wall is not None:
        share = gpu_share if gpu_share is not None else DEFAULT_GPU_SHARE
        cost.basis, cost.share, cost.gpu_seconds = DERIVED, float(share), wall * processes * float(share)
    else:
        cost.basis = UNKNOWN
    return cost


def basis_of(runs: List[RunCost]) -> str:
    """The label of a figure computed from ``runs``' GPU-seconds: :data:`MEASURED` only when every one is the
    record's gpu_seconds; :data:`DERIVED` when any was derived from wall time at an assumed share. The one
    place the per-run table, the row × task table and the projection take their labels from."""
    bases = {c.basis for c in runs}
    if not bases or not bases <= {MEASURED, DERIVED}:
        raise ValueError(f"no GPU-seconds to label: runs of basis {sorted(bases)}")
    return MEASURED if bases == {MEASURED} else DERIVED


def screen_counts(record: dict, on_gpu: bool, warn: Callable[[str], None], where: str) -> None:
    """What :func:`lra.results.validity.screen` does not check of the numbers this report reads, after it: a
    whole ``train_tokens``; on a GPU, ``processes`` a whole number ≥ 1 (absent: one) and ``gpu_seconds`` at
    most wall time × processes (a share of the GPU above 1). Each bad value is set to None and named in
    ``record[INVALID]``, with a ``warn`` naming ``where`` and what becomes unknown."""
    found = record.setdefault(validity.INVALID, {})
    problems = {}
    tokens = record.get("train_tokens")
    if tokens is not None and tokens != int(tokens):
        problems["train_tokens"] = (f"train_tokens is {tokens}, not a whole number",
                                    UNKNOWN_WHEN_INVALID["train_tokens"])
    if on_gpu:
        processes, why = record.get("processes"), None
        if processes is not None and not (validity.is_number(processes) and math.isfinite(processes)
                                          and processes == int(processes) and processes >= 1):
            why = f"processes is {processes!r}, not a whole number ≥ 1"
        elif processes is not None:
            why = validity.problem("processes", processes)  # beyond any run
        if why is not None:
            problems["processes"] = (why, UNKNOWN_WHEN_INVALID["gpu_seconds"])
        gpu, wall = record.get("gpu_seconds"), record.get("wall_time_seconds")
        processes = 1 if processes is None else processes
        if why is None and gpu is not None and wall is not None and gpu > wall * processes * (1 + SHARE_ROUNDING):
            problems["gpu_seconds"] = (f"gpu_seconds is {gpu:g} for {wall:g} s of wall time × {processes:g} "
                                       f"process{'es' * (processes != 1)}: a share of its GPU above 1",
                                       UNKNOWN_WHEN_INVALID["gpu_seconds"])
    for field, (why, what) in problems.items():
        found[field] = why
        record[field] = None
        warn(f"{where}: {why}; {what}")


# ----------------------------------------------------------------------------- the report
def report(records: List[dict], preset: Optional[str], seeds: Optional[int], gpu_share: Optional[Fraction],
           warn: Callable[[str], None]) -> str:
    """The per-run table, the row × task table and the projection of ``preset`` (default: the one the records
    name) × ``seeds``, as markdown; :class:`ConfigError` for a preset that cannot be projected."""
    costs = [run_cost(r, gpu_share, warn) for r in records]
    setup_lines = name_rows(costs)
    costs.sort(key=_order)
    parts = [per_run_table(costs, gpu_share), per_cell_table(costs, setup_lines)]
    if preset is None:
        preset = _named_preset(costs)
        if preset is not None and preset not in presets():
            raise ConfigError(f"the records name the preset {preset}, which is no table this checkout knows; choose "
                              f"the one to project with --cost-preset NAME ({', '.join(presets())})")
    if preset is None:
        parts.append("no projection: the records name no preset (their overrides hold no experiment=); pass "
                     "--cost-preset NAME")
    else:
        from lra.results.cost_projection import projection  # it reads this module's runs and labels

        parts.append(projection(costs, preset, preset_cells(preset), seeds or DEFAULT_SEEDS))
    return "\n\n".join(parts)


def _named_preset(costs: List[RunCost]) -> Optional[str]:
    named = sorted({c.preset for c in costs if c.preset is not None})
    if len(named) > 1:
        raise ConfigError(f"the records come from the presets {', '.join(named)}; choose the one to project with "
                          "--cost-preset NAME")
    return named[0] if named else None


def name_rows(costs: List[RunCost]) -> List[str]:
    """Give each run its row as the table names it (:func:`lra.results.setups.name_rows`: its label, and what
    sets its setup apart where its label has several on its task), in place; the note lines on those setups."""
    if not costs:
        return []
    rows, ranks, lines = setups.name_rows(pd.DataFrame([c.record for c in costs]))
    for c, row, rank in zip(costs, rows, ranks):
        c.row, c.row_rank = row, int(rank)
    return lines


def _order(cost: RunCost):
    """The table's row order (:func:`lra.results.rows.label_key`, then the row's rank), then task and seed."""
    task, seed = cost.task, cost.record.get("seed")
    return (label_key(cost.label), cost.row_rank, cost.row_name,
            TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER), task,
            seed if validity.is_number(seed) else math.inf)


def per_run_table(costs: List[RunCost], gpu_share: Optional[Fraction]) -> str:
    lines = ["GPU time of each run (GPU-seconds: wall time × the run's share of its GPU; H100-seconds: GPU-seconds "
             "× the GPU's factor, 1 on an H100):", "",
             "| backend | task | seed | status | device | wall s | GPU share | GPU-seconds | H100-seconds | steps | "
             "training tokens |", "|:--|:--|--:|:--|:--|--:|--:|--:|--:|--:|--:|"]
    for c in costs:
        r = c.record
        device = c.gpu_name if c.gpu_name is not None else "CPU"
        gpu = {CPU: "none (CPU)", UNKNOWN: UNKNOWN}.get(c.basis) or f"{_number(c.gpu_seconds)} {basis_of([c])}"
        h100 = (_number(c.h100_seconds) if c.h100_seconds is not None else
                "unconverted" if c.gpu_seconds is not None else MISSING)
        lines.append(f"| {_cell(c.row_name)} | {_cell(c.task)} | {_cell(r.get('seed'))} | {_cell(r.get('status'))} | "
                     f"{_cell(device)} | {_number(r.get('wall_time_seconds'))} | "
                     f"{_share(c)} | {gpu} | {h100} | "
                     f"{_count(r.get('steps'))} | {_tokens(c.tokens)} |")
    notes = []
    if any(c.basis == MEASURED for c in costs):
        notes.append(f"{MEASURED}: the record's gpu_seconds, its wall time at the share of its GPU counted while it "
                     "ran")
    if any(c.basis == DERIVED for c in costs):
        notes.append(f"{DERIVED}: a record from before gpu_seconds, wall time × processes × an assumed GPU share of "
                     f"{gpu_share if gpu_share is not None else DEFAULT_GPU_SHARE}"
                     + (" (--gpu-share)" if gpu_share is not None else
                        f" (the default: {DEFAULT_GPU_SHARE.denominator} runs to a GPU, as lra-gpu-check --reference "
                        "packs them and the committed GPU records ran; --gpu-share to change)"))
    unconverted = sorted({c.gpu_name for c in costs if c.gpu_seconds is not None and c.factor is None})
    if unconverted:
        notes.append(f"unconverted: no H100 factor is known for {', '.join(map(_cell, unconverted))}; their runs' "
                     "GPU-seconds are listed as they are, and left out of the H100-seconds and the projection")
    if any(c.basis == UNKNOWN for c in costs):
        notes.append(f"{UNKNOWN}: a CUDA record without a valid gpu_seconds or wall time, or with an invalid processes "
                     "(a note on standard error names the value)")
    if any(r.get("pretrain_wall_time_seconds") for r in (c.record for c in costs)):
        notes.append("self-pretraining's stage 1 is not counted: its time is pretrain_wall_time_seconds, no GPU "
                     "time")
    return "\n".join(lines) + ("\n\n" + "\n".join(f"- {note}" for note in notes) if notes else "")


def per_cell_table(costs: List[RunCost], setup_lines: List[str]) -> str:
    """Mean H100-seconds of a completed run per row × task, labelled by :func:`basis_of` with its run count,
    and every other completed run of the cell counted beside it (unconverted, unknown, on CPU), a row being
    one setup as in the table (``costs`` in its row order; ``setup_lines``: :func:`name_rows`'s notes)."""
    completed = [c for c in costs if c.record.get("status") == "completed"]
    if not any(c.gpu_seconds is not None for c in completed):
        return "H100-seconds per run, row × task: none (no completed run has a known GPU time)"
    rows: Dict[str, Dict[str, List[RunCost]]] = {}
    for c in completed:
        rows.setdefault(c.row_name, {}).setdefault(c.task, []).append(c)
    tasks = sorted({t for cells in rows.values() for t in cells}, key=lambda t: (TASK_ORDER.index(t) if t in
                                                                                 TASK_ORDER else len(TASK_ORDER), t))
    lines = ["H100-seconds of a completed run, row × task (mean, what it rests on, the runs in it in brackets; + "
             "the cell's other completed runs):", "",
             "| backend | " + " | ".join(map(_cell, tasks)) + " |", "|:--|" + "--:|" * len(tasks)]
    for row, cells in rows.items():
        lines.append(f"| {_cell(row)} | " + " | ".join(_cell_text(cells.get(task, [])) for task in tasks) + " |")
    labels = {basis_of(converted) for cells in rows.values() for runs in cells.values()
              if (converted := [c for c in runs if c.h100_seconds is not None])}
    meaning = {MEASURED: "every run in the mean recorded its gpu_seconds",
               DERIVED: "some or all of the runs' GPU-seconds derived from wall time at an assumed GPU share"}
    notes = ["- " + "; ".join(f"{name}: {meaning[name]}" for name in (MEASURED, DERIVED) if name in labels)] \
        if labels else []  # none when each run with GPU time is unconverted
    apart = [(n, what) for what in ("unconverted", UNKNOWN, "on CPU")
             if (n := sum(_apart(c) == what for c in completed))]
    if apart:
        notes.append("- not in a mean: " + ", ".join(f"{n} {what}" for n, what in apart)
                     + " (the per-run table says why)")
    unfinished = len(costs) - len(completed)
    if unfinished:
        notes.append(f"- not in these cells: {unfinished} run{'s' * (unfinished != 1)} not completed (the per-run "
                     "table lists them)")
    notes = ["\n".join(notes), *setups.setup_notes(setup_lines, pd.DataFrame())]  # the setups apart (not the bare)
    return "\n".join(lines) + "".join(f"\n\n{note}" for note in notes)


def _apart(cost: RunCost) -> Optional[str]:
    """Why a completed run is in no mean of H100-seconds (None: it is in one)."""
    if cost.h100_seconds is not None:
        return None
    return {CPU: "on CPU", UNKNOWN: UNKNOWN}.get(cost.basis, "unconverted")


def _cell_text(runs: List[RunCost]) -> str:
    """A row × task cell: ``mean basis (n)``, then `` + k unconverted``, `` + k unknown``, `` + k on CPU``, so
    that every completed run of the cell is counted."""
    converted = [c for c in runs if c.h100_seconds is not None]
    text = MISSING
    if converted:
        mean = sum(c.h100_seconds for c in converted) / len(converted)
        text = f"{_number(mean)} {basis_of(converted)} ({len(converted)})"
    for what in ("unconverted", UNKNOWN, "on CPU"):
        count = sum(_apart(c) == what for c in runs)
        text += f" + {count} {what}" if count else ""
    return text


def _share(cost: RunCost) -> str:
    """The per-run table's GPU share: the measured one, or the one a derived run is assumed to have had."""
    if cost.share is None:
        return MISSING
    return f"{cost.share:.2f}" + (" assumed" if cost.basis == DERIVED else "")


def _cell(value) -> str:
    return MISSING if value is None else markdown_cell(value)


def _number(value) -> str:
    if value is None or not validity.is_number(value) or not math.isfinite(value):
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:.2f}"


def _count(value) -> str:
    return f"{int(value):,}" if validity.is_number(value) and math.isfinite(value) else MISSING


def _tokens(count: Optional[int]) -> str:
    if count is None:
        return MISSING
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return str(count)
