"""The projection of ``lra-table --cost``: a preset × seeds in H100-hours, from the runs :mod:`lra.results.cost`
read. A cell with completed runs of the preset's setup is their mean, labelled as :func:`cost.basis_of
<lra.results.cost.basis_of>` labels it (measured, or derived where any run's GPU-seconds were derived from
wall time at an assumed share); every other cell is projected, from H100-seconds per training token."""

from __future__ import annotations

from typing import Dict, List, Optional

from lra.results import setups
from lra.results.cost import DERIVED, MEASURED, PROJECTED, UNKNOWN, RunCost, _apart, _cell, _tokens, basis_of
from lra.results.cost_preset import Cell
from lra.results.rows import MISSING


def projection(costs: List[RunCost], preset: str, cells: List[Cell], seeds: int) -> str:
    """The H100-hours of ``preset``'s cells × ``seeds``: a cell with completed runs of the preset's setup
    (:func:`of_cell`) on a converted GPU is their mean (its runs' H100-seconds per training token × the
    cell's training tokens), measured or derived as its runs are; a cell with only runs of another setup
    (trainer.max_steps=10, say) is projected from theirs; any other cell from the rate of its row's cells
    with runs, else of every such cell. A completed run of a cell that gives no rate (its GPU time unknown or
    unconverted, or its training tokens unknown) is named in a note."""
    by_cell = {(cell.label, cell.task): cell for cell in cells}
    own: Dict[tuple, List[RunCost]] = {}
    other: Dict[tuple, List[RunCost]] = {}
    left_out = dict.fromkeys(("unconverted", UNKNOWN, "on CPU", "without training tokens"), 0)  # runs with no rate
    for c in costs:
        key = (c.label, c.task)
        if c.preset != preset or key not in by_cell or c.record.get("status") != "completed":
            continue
        if c.h100_seconds is None or not c.tokens:
            why = _apart(c) or "without training tokens"
            left_out[why] += 1
            continue
        (own if of_cell(c, by_cell[key]) else other).setdefault(key, []).append(c)
    runs_of = {**other, **own}  # a cell's own runs where it has some, else its runs of another setup
    header = f"Projection: experiment={preset} × {seeds} seed{'s' * (seeds != 1)}, in H100-hours"
    if not runs_of:
        return (f"{header}: none, as no completed run of {preset}'s cells has H100 time (runs of the preset, on a GPU "
                "with a known factor, with their training tokens)")
    label = {key: PROJECTED if key not in own else basis_of(runs) for key, runs in runs_of.items()}
    rate = {key: sum(c.h100_seconds / c.tokens for c in runs) / len(runs) for key, runs in runs_of.items()}
    row_rates: Dict[str, List[float]] = {}
    for (row, _), value in rate.items():
        row_rates.setdefault(row, []).append(value)
    overall = sum(rate.values()) / len(rate)
    rows = list(dict.fromkeys(cell.label for cell in cells))
    tasks = list(dict.fromkeys(cell.task for cell in cells))
    hours: Dict[tuple, float] = {}
    lines = [header + ":", "", "| backend | " + " | ".join(map(_cell, tasks)) + " | row |",
             "|:--|" + "--:|" * (len(tasks) + 1)]
    for row in rows:
        texts = []
        for task in tasks:
            key = (row, task)
            cell = by_cell.get(key)
            if cell is None:
                texts.append(MISSING)
                continue
            per_token = rate.get(key)
            if per_token is None:  # the row's rate, else every cell's with runs
                per_token = _mean(row_rates[row]) if row in row_rates else overall
            hours[key] = per_token * cell.tokens * seeds / 3600
            label.setdefault(key, PROJECTED)
            texts.append(f"{hours[key]:.2f} {label[key]}")
        row_total = sum(hours.get((row, task), 0.0) for task in tasks)
        lines.append(f"| {_cell(row)} | " + " | ".join(texts) + f" | {row_total:.2f} |")
    total = sum(hours.values())
    lines.append("| all rows | " + " | ".join(f"{sum(h for (_, t), h in hours.items() if t == task):.2f}"
                                             for task in tasks) + f" | {total:.2f} |")
    tokens: Dict[str, set] = {}
    for cell in cells:
        tokens.setdefault(cell.task, set()).add(cell.tokens)
    used = [c for runs in runs_of.values() for c in runs]
    derived = sum(c.basis == DERIVED for c in used)
    lines += ["", f"**Total: {total:.1f} H100-hours** for {len(hours)} cells × {seeds} seeds: "
              + _split(hours, label) + ".", "",
              "- projected: the H100-seconds per training token of the cell's own runs where they trained another "
              "setup than the preset's, else of the row's cells with runs ("
              + ", ".join(f"{_cell(row)} {_mean(row_rates[row]):.3g}" for row in sorted(row_rates, key=rows.index))
              + f" s/token), else the mean over every cell with runs ({overall:.3g} s/token), × the cell's training "
              "tokens (steps × batch × length × documents, from the preset's schedule); how attention's cost grows "
              "with length and how evaluation's share differs between tasks are not modelled",
              f"- the runs these hours rest on: {len(used)}, their GPU-seconds {len(used) - derived} {MEASURED} and "
              f"{derived} {DERIVED}" + (" (wall time × an assumed GPU share: the per-run table's note)" if derived
                                        else ""),
              *([f"- not in these hours, completed runs of {preset}'s cells: "
                 + ", ".join(f"{n} {why}" for why, n in left_out.items() if n) + " (the per-run table says why)"]
                if any(left_out.values()) else []),
              *_apart_note([other[key][0] for key in by_cell if key in other and key not in own], by_cell),
              "- training tokens of a run: " + ", ".join(
                  f"{_cell(task)} {' / '.join(_tokens(n) for n in sorted(tokens[task]))}" for task in tasks)]
    if any(cell.pretrains for cell in cells):
        lines.append("- self-pretraining's stage 1 is not in these hours (its runs record no GPU time for it)")
    return "\n".join(lines)


def _split(hours: Dict[tuple, float], label: Dict[tuple, str]) -> str:
    """The total by label: measured and projected always, derived where a cell is."""
    parts = []
    for name in (MEASURED, DERIVED, PROJECTED):
        keys = [key for key in hours if label[key] == name]
        if name == DERIVED and not keys:
            continue
        part = sum(hours[key] for key in keys)
        count = f"{len(keys)} cell{'s' * (len(keys) != 1)}"
        parts.append(f"{part:.1f} {name} ({count})" if name == PROJECTED else
                     f"{part:.2f} {name} ({count}{', the mean of their runs' * bool(keys)})")
    return ", ".join(parts)


def of_cell(cost: RunCost, cell: Cell) -> bool:
    """Whether a run of the preset trained ``cell`` as the preset does: its training tokens, and its setup
    (:mod:`lra.results.setups`) where both are known (a record without a config, or a cell whose job cannot
    be resolved, is taken by its tokens alone)."""
    config = cost.record.get("setup_config")
    return cost.tokens == cell.tokens and (config is None or cell.setup_config is None or not setups.differences(
        setups.as_preset_sources(config, cell.setup_config), cell.setup_config))


def _apart_note(runs: List[RunCost], by_cell: Dict[tuple, Cell]) -> List[str]:
    """The note on the cells projected from their own runs of another setup: how each cell's first run differs
    from the preset's job (its setup's keys, else its training tokens)."""
    apart = []
    for run in runs:
        cell, config = by_cell[(run.label, run.task)], run.record.get("setup_config")
        found = setups.differences(setups.as_preset_sources(config, cell.setup_config), cell.setup_config) \
            if config and cell.setup_config else []
        found = found or [f"training tokens {run.tokens:,} ≠ {cell.tokens:,}"]
        apart.append(f"{_cell(cell.label)} on {_cell(cell.task)} ({setups.compact(found)})")
    if not apart:
        return []
    return ["- another setup than the preset's (a run's against the preset's job): " + "; ".join(apart)]


def _mean(values: Optional[List[float]]) -> Optional[float]:
    return sum(values) / len(values) if values else None
