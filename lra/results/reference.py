"""A published table for ``lra-table --reference``: one of the papers' tables shipped in
``lra/results/paper_numbers/`` or the user's CSV (``method,<task>...,avg``; lines that start with ``#``
are comments). It is checked whole before any delta is drawn from it: one row per method, every value a
finite number (an empty cell: the paper has none). A table that is not is refused with one line naming the
file, its line and the fix, never reported as a bug or drawn half."""

from __future__ import annotations

import csv
import math
import re
from importlib import resources
from io import StringIO
from pathlib import Path

import pandas as pd

from lra.errors import ConfigError
from lra.results.reading import Unreadable, read_text
from lra.results.validity import AVERAGE

REFERENCES = {  # --reference NAME → the shipped CSV
    "yoso": "yoso_icml2021_table3_lra.csv",
    "lra": "lra_iclr2021_table1.csv",
    "lha": "lha_iclr2022_table3_lra.csv",
}
METHOD = "method"
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")  # what a paper prints; not nan, inf, 1_0


def load_reference(name: str) -> pd.DataFrame:
    """A published table (``yoso``, ``lra``, ``lha``, or a CSV path): method × task, percent; the columns
    ``avg…`` are called ``average``. Raises :class:`ConfigError` (one line) for a file it cannot use."""
    if name in REFERENCES:
        text = resources.files("lra.results").joinpath("paper_numbers", REFERENCES[name]).read_text()
    else:
        try:
            text = read_text(Path(name)).removeprefix("\ufeff")  # the byte-order mark a spreadsheet may write
        except Unreadable as exc:
            raise ConfigError(f"cannot read the reference table {name!r} ({exc}); use one of {', '.join(REFERENCES)} "
                              f"or a CSV file with a '{METHOD}' column (method,<task>...,avg)") from None
    table = parse_reference(text, name)
    table.attrs["reference"] = name  # which paper's preset its deltas are checked against (lra.results.paper_setup)
    return table


def parse_reference(text: str, name: str) -> pd.DataFrame:
    """:func:`load_reference`'s table from the CSV ``text`` of the file ``name``."""
    def refuse(line: int, problem: str, fix: str):
        raise ConfigError(f"the reference table {name!r}, line {line}: {problem}; {fix}")

    lines = ["" if line.lstrip().startswith("#") else line for line in text.split("\n")]  # keeps line numbers
    reader = csv.reader(StringIO("\n".join(lines)), strict=True)
    header, rows, first_line = None, {}, {}
    try:
        for fields in reader:
            line = reader.line_num
            if not any(field.strip() for field in fields):
                continue
            fields = [field.strip() for field in fields]
            if header is None:
                header = _header(fields, line, refuse)
                continue
            if len(fields) != len(header):
                refuse(line, f"{len(fields)} values for the header's {len(header)} columns ({', '.join(header)})",
                       "give each row one value per column (an empty one where the paper has none)")
            method = fields[header.index(METHOD)]
            if not method:
                refuse(line, "no method name", f"name the row's method in its '{METHOD}' column")
            if method in rows:
                refuse(line, f"the method {method!r} a second time (first on line {first_line[method]})",
                       "keep one row per method")
            values = {}
            for column, value in zip(header, fields):
                if column == METHOD:
                    continue
                if value and not (NUMBER.fullmatch(value) and math.isfinite(float(value))):
                    refuse(line, f"its {column} value for {method} is {value!r}, not a number",
                           "write the paper's number there, or leave the cell empty where the paper has none")
                values[column] = float(value) if value else math.nan
            rows[method], first_line[method] = values, line
    except csv.Error as exc:
        refuse(reader.line_num, f"not CSV ({exc})", "write one row per line, fields separated by commas")
    if header is None or not rows:
        refuse(reader.line_num or 1, "no rows" if header else "no header",
               f"its first line names the columns ({METHOD},<task>...,avg), then one row per method")
    columns = [column for column in header if column != METHOD]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns, dtype=float).rename_axis(METHOD)
    return table.rename(columns={c: AVERAGE for c in columns if c.startswith("avg")})


def _header(fields: list, line: int, refuse) -> list:
    """The column names on the header ``line``: a ``method`` column, a name for every column, each name once
    (``avg…`` counted as ``average``)."""
    if METHOD not in fields:
        refuse(line, f"no '{METHOD}' column in its header ({', '.join(fields)})",
               f"its first line names the columns: {METHOD},<task>...,avg")
    names = [AVERAGE if field.startswith("avg") else field for field in fields]
    for position, column in enumerate(names):
        if not column:
            refuse(line, f"column {position + 1} of its header has no name", "name every column (a task, or avg)")
        if column in names[:position]:
            refuse(line, f"the column {fields[position]!r} twice in its header" + (
                   " (every avg… column is the average)" if column == AVERAGE else ""), "keep one of them")
    if len(fields) < 2:
        refuse(line, "no column besides the method", "add a column per task (listops, text, …) and avg")
    return fields
