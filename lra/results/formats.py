"""How lra-table writes what it read: every text from a record (a label, a task, a device, an error) is
escaped for the format it goes into, so that no record can shift a table's columns, end a line early or
send a terminal its own commands.

- Everywhere: control characters (a newline, a tab, a terminal's escape, a text-direction override) are
  written as Python writes them in a string (``\\n``, ``\\x1b``, ``\\u202e``): visible, one line.
- Markdown: a ``|`` is ``\\|`` and a ``\\`` is ``\\\\`` inside a table's cells (GitHub's rule).
- LaTeX: ``\\ & % $ # _ { } ~ ^ < > |`` are written as LaTeX prints them.
- CSV and JSON: pandas quotes and escapes them (the csv and json modules' rules).
"""

from __future__ import annotations

import sys
from typing import Optional

import pandas as pd

LATEX = {"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "$": "\\$", "#": "\\#", "_": "\\_", "{": "\\{",
         "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "<": "\\textless{}",
         ">": "\\textgreater{}", "|": "\\textbar{}", "±": "$\\pm$", "Δ": "$\\Delta$", "—": "--", "≠": "$\\neq$",
         "×": "$\\times$", "…": "\\ldots{}", "≥": "$\\geq$", "≤": "$\\leq$"}


def visible(text) -> str:
    """``text`` with each control character (and any other character that prints nothing, but a space)
    written as its escape: "two\\nlines" → "two\\\\nlines"."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def markdown_cell(text) -> str:
    """``text`` for a cell of a Markdown table: one line, its ``\\`` and ``|`` escaped."""
    return visible(text).replace("\\", "\\\\").replace("|", "\\|")


def latex_text(text) -> str:
    """``text`` for LaTeX: one line, each of its special characters written as LaTeX prints it."""
    return "".join(LATEX.get(c, c) for c in visible(text))


def note(message: str) -> None:
    """A ``note:`` line on standard error (one line, whatever the message holds)."""
    print(f"note: {visible(message)}", file=sys.stderr)


def _bolded(table: pd.DataFrame, best, wrap) -> pd.DataFrame:
    """``table`` with the first word of each cell that ``best`` marks (the best mean) wrapped by ``wrap``;
    ``best`` lines up with ``table`` by position (escaping may make two labels alike)."""
    out = table.copy()
    if best is None:
        return out
    for i in range(len(out.index)):
        for j in range(len(out.columns)):
            if best.iat[i, j]:
                value, _, rest = out.iat[i, j].partition(" ")
                out.iat[i, j] = wrap(value) + (" " + rest if rest else "")
    return out


def _escaped(table: pd.DataFrame, escape) -> pd.DataFrame:
    """``table`` with every cell, row label and column name escaped, positions (and so the marks of the best)
    unchanged."""
    out = table.map(escape)
    out.index = pd.Index([escape(label) for label in table.index], name=table.index.name)
    out.columns = [escape(column) for column in table.columns]
    return out


def _best(table: pd.DataFrame):
    """Which cells of ``table`` hold their column's best, in ``table``'s own order (None: no marks)."""
    best = table.attrs.get("best")
    return None if best is None else best.reindex(index=table.index, columns=table.columns, fill_value=False)


def to_markdown(table: pd.DataFrame) -> str:
    if table.empty:
        return "(no runs found)"
    bold = _bolded(_escaped(table, markdown_cell), _best(table), lambda v: f"**{v}**")
    return bold.to_markdown(disable_numparse=True)


def to_latex(table: pd.DataFrame, caption: Optional[str] = None) -> str:
    """A booktabs table (pandas' Styler), best per column in bold; its caption says what a cell holds (the
    table's metric and statistic over seeds, n in parentheses) unless ``caption`` is given."""
    if table.empty:
        return "% no runs found"
    if caption is None:
        metric = table.attrs.get("metric", "test_accuracy")
        what = "Test accuracy (\\%)" if metric == "test_accuracy" else latex_text(metric)
        caption = (f"{what}, {table.attrs.get('statistic', 'mean')} $\\pm$ std over seeds (in parentheses: n, the "
                   "seeds counted)")
    bold = _bolded(_escaped(table, latex_text), _best(table), lambda v: f"\\textbf{{{v}}}").rename_axis("Backend")
    bold = bold.reset_index()
    return bold.style.hide(axis="index").to_latex(hrules=True, column_format="l" + "r" * (len(bold.columns) - 1),
                                                  caption=caption, position="t", position_float="centering")
