"""Which numbers of a run record a table may use: an accuracy is a finite percentage in [0, 100], a
throughput, a memory peak or a time a finite number ≥ 0 (a time above 0 once the run has trained a step),
a step count a whole one, the steps a run was resumed at a list of them. A value that is none of these
(``Infinity``, ``NaN``, −3, 250, a string) is left out of every statistic, and the table says so: the cell
counts it (``1 invalid``), a note under the table and a ``note:`` line on standard error name the run and
the value. A table never averages it into ``inf ± nan``."""

from __future__ import annotations

import math
from typing import Callable, Dict, Iterable, List, Optional

# Fields every table reads; lra-table adds its --metric.
TABLE_FIELDS = ("test_accuracy", "best_val_accuracy", "train_tokens_per_second", "peak_memory_mb", "wall_time_seconds",
                "num_parameters")
INVALID = "invalid_values"  # the record's key: {field: what is wrong with its value}
# No measurement of this harness comes near 10^15 (tokens/s a thousand times any GPU's, an exabyte of memory,
# 30 million years, parameters beyond any model); a larger value is damage, and a mean of two would overflow.
LARGEST = 1e15
WHOLE = ("num_parameters", "steps")  # counts
STEP_LISTS = ("resumed_at_steps",)  # the steps a run was resumed at (lra.training)
# The step counts lra-table --runs lists of a run besides the table's fields: its steps, and the step lists.
STEP_FIELDS = ("steps", *STEP_LISTS)
FLAGS = ("stuck_at_chance",)  # yes-or-no fields (lra.chance): true or false
STATUSES = ("running", "completed", "failed", "interrupted")  # lra.records
AVERAGE = "average"  # a table's column after the tasks: no task takes its name


def problem(field: str, value) -> Optional[str]:
    """What is wrong with ``value`` as the record's ``field`` (None when nothing, or when it is absent)."""
    if value is None:
        return None
    if field in FLAGS:
        return None if isinstance(value, bool) else f"{field} is {value!r}, not true or false"
    if field in STEP_LISTS:
        return None if isinstance(value, list) and not any(problem("steps", step) for step in value) \
            else f"{field} is {value!r}, not a list of steps"
    if not is_number(value):
        return f"{field} is {value!r}, not a number"
    if not math.isfinite(value):
        return f"{field} is {value}, not a finite number"
    if field.endswith("accuracy") and not 0 <= value <= 100:
        return f"{field} is {value}, outside 0 … 100 (percent)"
    if not field.endswith("accuracy") and not 0 <= value <= LARGEST:
        return f"{field} is {value}, " + ("below 0" if value < 0 else f"beyond {LARGEST:.0e}, no measurement of a run")
    if field in WHOLE and value != int(value):
        return f"{field} is {value}, not a whole number"
    return None


def unplaceable(record: dict) -> Optional[str]:
    """Why a record cannot take a place in a table at all (its seed or status is no seed or status), or
    None: a table keeps one run per (backend, task, seed) and sorts them by status."""
    seed, status, task = record.get("seed"), record.get("status"), record.get("task")
    if seed is not None and (not is_number(seed) or seed != int(seed) or seed < 0):
        return f"its seed is {seed!r}, not a whole number ≥ 0"
    if status not in STATUSES:
        return f"its status is {status!r}, not one of {', '.join(STATUSES)}"
    if task == AVERAGE:
        return f"its task is {task!r}, the name of the table's column of each row's average over the tasks"
    return None


TIMES = ("wall_time_seconds", "gpu_seconds")  # a run's times: above 0 once it has trained a step


def problem_in(record: dict, field: str) -> Optional[str]:
    """What is wrong with the record's ``field``, its other fields considered: :func:`problem`, or a time of 0
    for a run that trained steps (no step takes no time: a 0 would cost a table's row nothing)."""
    value, steps = record.get(field), record.get("steps")
    why = problem(field, value)
    if why is None and field in TIMES and value == 0 and problem("steps", steps) is None and (steps or 0) > 0:
        why = f"{field} is 0 for a run that trained {steps} steps"
    return why


def screen(record: dict, fields: Iterable[str], warn: Callable[[str], None], where: str,
           consequences: Optional[Dict[str, str]] = None) -> None:
    """Set each field of ``fields`` whose value is invalid to None in ``record`` and name it in
    ``record[INVALID]``, with a ``warn`` line naming ``where`` (the record's file) and what becomes of the
    value: ``consequences[field]`` where the caller's report says otherwise than a table."""
    found = record.setdefault(INVALID, {})
    for field in dict.fromkeys(fields):
        why = problem_in(record, field)
        if why is not None:
            found[field] = why
            record[field] = None
            default = "taken as unknown (not counted)" if field in FLAGS else "left out of the table"
            warn(f"{where}: {why}; {(consequences or {}).get(field, default)}")


def require(record: dict, field: str, warn: Callable[[str], None], where: str) -> None:
    """A completed record holds its result: one without ``field`` (one of :data:`TABLE_FIELDS`; a record
    edited, or cut short) is counted invalid as a bad value is, not shown as a cell without runs."""
    if field in TABLE_FIELDS and record.get("status") == "completed" and record.get(field) is None \
            and field not in record.get(INVALID, {}):
        why = f"{field} is missing from a completed record"
        record.setdefault(INVALID, {})[field] = why
        record[field] = None
        warn(f"{where}: {why}; left out of the table")


HIGHER, LOWER = "higher", "lower"


def better(metric: str) -> Optional[str]:
    """Which way ``metric`` is better: :data:`HIGHER` (an accuracy, a throughput), :data:`LOWER` (a loss, a
    time, a memory peak), or None (a count such as steps or parameters, whose best no table can name)."""
    if metric.endswith(("accuracy", "tokens_per_second")):
        return HIGHER
    if metric.endswith(("loss", "seconds", "memory_mb")):
        return LOWER
    return None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def invalid_count(group, field: str) -> int:
    """How many records of ``group`` (a DataFrame of records) had ``field`` invalid."""
    if INVALID not in group:
        return 0
    return int(group[INVALID].map(lambda found: isinstance(found, dict) and field in found).sum())


def notes(records: Iterable[dict]) -> str:
    """One line per record with an invalid value (the run and what is wrong), for under a table."""
    from lra.results.formats import visible

    lines: List[str] = [visible(f"- {r['run_dir']}: {'; '.join(r[INVALID].values())}") for r in records
                        if r.get(INVALID)]
    return "invalid values, left out of the table (the record is damaged or was edited):\n" + "\n".join(lines) \
        if lines else ""
