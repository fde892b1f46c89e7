"""ListOps TSV rows into a cache split, tokenised and checked a batch of rows at a time.

Each row must hold one well-formed expression whose value is its label, as the LRA generator wrote every row
of the release: an operator ``[MIN``, ``[MAX``, ``[MED`` or ``[SM`` followed by its arguments (digits or
expressions) and a ``]``, or a lone digit (a generator run with ``min_length`` 0 keeps those); values as the
generator computes them (:func:`lra.data.listops.apply_operator`). Rows are tokenised and judged with numpy
over many rows at once: the release holds about 100 million tokens, and a Python step per token costs seconds.
A row the fast tokeniser does not take (any character beyond the official ones, e.g. another whitespace) is
tokenised by :func:`lra.data.listops.release_ids`, which gives the same ids or refuses it; a row found wrong is
walked token by token (:func:`lra.data.listops.expression_value`) to say what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from lra.data.listops import OPERATORS, TOKEN_TO_ID, VOCABULARY, expression_value, read_tsv_rows, release_ids
from lra.errors import UserError

ROWS_PER_BATCH = 2048
FIX = "the file is damaged or not the LRA release; re-extract listops-1000 from it"
FIRST_OPERATOR_ID = TOKEN_TO_ID[OPERATORS[0]]  # the operators' ids follow in OPERATORS' order
MEDIAN = OPERATORS.index("[MED")
CLOSE_ID = TOKEN_TO_ID["X"]

# The fast tokeniser reads the bytes of many rows at once, parentheses deleted, through BYTE_TO_ID: a digit, ']'
# and 'X' are tokens, '[' starts an operator whose letters follow it (OPERATOR_LETTER), spaces and the rows'
# separator stand between tokens; any other byte (NOT_A_TOKEN) leaves its row to release_ids.
ROW_SEPARATOR = b" \n "
NOT_A_TOKEN, OPERATOR_LETTER, ROW_END, SPACE = 250, 251, 253, 254  # above every id; the separators highest
BYTE_TO_ID = np.full(256, NOT_A_TOKEN, dtype=np.uint8)
for _digit in range(10):
    BYTE_TO_ID[ord(str(_digit))] = TOKEN_TO_ID[str(_digit)]
BYTE_TO_ID[ord("]")] = BYTE_TO_ID[ord("X")] = CLOSE_ID
BYTE_TO_ID[ord(" ")], BYTE_TO_ID[ord("\n")] = SPACE, ROW_END

# Per id: the depth step (+1 an operator, −1 its closing ']') and the value of a digit.
STEP = np.zeros(256, dtype=np.int8)
STEP[FIRST_OPERATOR_ID:FIRST_OPERATOR_ID + len(OPERATORS)], STEP[CLOSE_ID] = 1, -1
DIGIT_VALUE = np.zeros(256, dtype=np.int8)
DIGIT_VALUE[[TOKEN_TO_ID[str(d)] for d in range(10)]] = np.arange(10)
# The digits a group of arguments holds as the bits of a number: its smallest and largest digit by table.
DIGIT_BIT = (1 << np.arange(10)).astype(np.uint16)
LOWEST_BIT = np.array([0] + [(bits & -bits).bit_length() - 1 for bits in range(1, 1024)], dtype=np.int8)
HIGHEST_BIT = np.array([0] + [bits.bit_length() - 1 for bits in range(1, 1024)], dtype=np.int8)


def add_tsv_rows(path: Path, writer, progress: Callable[[Iterable], Iterable] = lambda rows: rows) -> None:
    """Every row of the ListOps TSV ``path`` into ``writer`` (a cache split writer) as its ids; the file's first
    wrong row raises one line naming ``path`` and its line, whatever is wrong with it."""
    rows = iter(progress(read_tsv_rows(path)))
    batch: List[Tuple[int, str, int]] = []
    while True:
        try:
            row = next(rows, None)
        except UserError:
            _add_batch(path, batch, writer)  # a row before the one the reader refused may be wrong too
            raise
        if row is not None:
            batch.append(row)
        if row is None or len(batch) == ROWS_PER_BATCH:
            _add_batch(path, batch, writer)
            batch = []
        if row is None:
            return


def _add_batch(path: Path, batch: Sequence[Tuple[int, str, int]], writer) -> None:
    ids = fast_ids([source for _, source, _ in batch])
    taken = [row_ids for row_ids in ids if row_ids is not None]
    well_formed, values = (row_values(np.concatenate(taken), np.array([len(row_ids) for row_ids in taken]))
                           if taken else (np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)))
    judged = 0
    for (line, source, label), row_ids in zip(batch, ids):
        where = f"{path}:{line}"
        if row_ids is None:
            row_ids = release_ids(source, where)
            right = expression_value([VOCABULARY[i] for i in row_ids.tolist()]) == (label, None)
        else:
            right = bool(well_formed[judged]) and values[judged] == label
            judged += 1
        writer.add([row_ids], label, where=where)
        if not right:
            raise UserError(_problem(where, row_ids, label))


def _problem(where: str, ids: np.ndarray, label: int) -> str:
    value, malformed = expression_value([VOCABULARY[i] for i in ids.tolist()])
    if malformed is not None:
        return f"{where}: the expression is malformed ({malformed}, of {len(ids):,} tokens); {FIX}"
    return (f"{where}: the label is {label}, but the expression's value is {value} (MIN, MAX, MED = int(median), "
            f"SM = sum mod 10, as the LRA generator computes it); {FIX}")


def fast_ids(sources: Sequence[str]) -> List[Optional[np.ndarray]]:
    """Per source its ids as :func:`lra.data.listops.release_ids` gives them, or None where this tokeniser does
    not take the row (a byte beyond the official ones, tokens not apart, no token)."""
    text = ROW_SEPARATOR.join(source.encode() for source in sources).translate(None, b"()")
    chars = np.frombuffer(text + b"   ", dtype=np.uint8)  # (spaces: an operator's letters are read past the end)
    codes = BYTE_TO_ID[chars]
    brackets = np.flatnonzero(chars == ord("["))
    following = (chars[brackets + 1].astype(np.int32) << 16) | (chars[brackets + 2].astype(np.int32) << 8) \
        | chars[brackets + 3]
    for operator in OPERATORS:
        letters = operator[1:].encode()
        at = brackets[(following >> 8 * (3 - len(letters))) == int.from_bytes(letters, "big")]
        codes[at] = TOKEN_TO_ID[operator]
        for offset in range(1, len(letters) + 1):
            codes[at + offset] = OPERATOR_LETTER
    row_ends = np.flatnonzero(codes == ROW_END)
    if len(row_ends) != len(sources) - 1:  # a source holding a line break (the TSV reader yields none)
        return [None] * len(sources)
    in_token = codes < ROW_END
    is_token = codes <= CLOSE_ID
    starts_token = in_token & (codes != OPERATOR_LETTER)
    refused = set(np.searchsorted(row_ends, np.flatnonzero(codes == NOT_A_TOKEN)).tolist())
    refused.update(np.searchsorted(row_ends, np.flatnonzero(in_token[:-1] & starts_token[1:])).tolist())  # not apart
    tokens = codes[is_token]
    bounds = [0, *np.cumsum(np.add.reduceat(is_token, np.concatenate(([0], row_ends)), dtype=np.int64)).tolist()]
    return [None if index in refused or first == end else tokens[first:end]
            for index, (first, end) in enumerate(zip(bounds[:-1], bounds[1:]))]


def row_values(tokens: np.ndarray, lengths: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(well formed, value) per row of ``tokens`` (the rows' ids one after another; each row at least one id, all
    ids those of digits, operators and ``X``): :func:`lra.data.listops.expression_value`'s verdicts, the value −1 where a row is
    malformed."""
    ends = np.cumsum(lengths)
    starts, last = ends - lengths, ends - 1
    step = STEP[tokens]
    depth = np.cumsum(step, dtype=np.int32)  # operators open after each token
    depth -= np.repeat(depth[starts] - step[starts], lengths)  # counted from each row's start
    # Well formed: the depth stays above 0 until the row's last token and is 0 after it (one expression, every
    # operator closed, no ']' too many), and no operator is followed at once by its ']'.
    depth_before_last = depth.copy()
    depth_before_last[last] = 1
    well_formed = (depth[last] == 0) & (np.minimum.reduceat(depth_before_last, starts) >= 1)
    well_formed[np.searchsorted(last, np.flatnonzero((step[:-1] == 1) & (step[1:] == -1)))] = False
    values = np.full(len(lengths), -1, dtype=np.int64)
    if well_formed.all():
        values[:] = _values_of_well_formed(tokens, depth, step)[last]
    elif well_formed.any():  # rare: a damaged file
        kept = np.repeat(well_formed, lengths)
        values[well_formed] = row_values(tokens[kept], lengths[well_formed])[1]
    return well_formed, values


def _values_of_well_formed(tokens: np.ndarray, depth: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The value of each digit and of each ``X`` (the value of the operator it closes) of well-formed rows.

    An operator and its arguments (digits, and the ``X`` closing each argument expression) are exactly the tokens
    at its depth from it on to its ``X``, which follows its last argument: ordered by depth, then position, the
    tokens fall into groups, each an operator and its arguments, evaluated from the deepest level up."""
    levels = depth.astype(np.uint8 if depth.max() < 256 else np.int32)
    order = np.argsort(levels, kind="stable")[np.count_nonzero(levels == 0):]  # depth 0: a row's last token
    starts_group = step[order] == 1
    group_at = np.flatnonzero(starts_group)  # where each group starts in ``order``
    counts = np.diff(group_at, append=len(order)) - 1
    arguments = order[~starts_group]
    offsets = group_at - np.arange(len(group_at))  # where each group's arguments start in ``arguments``
    closing = arguments[offsets + counts - 1] + 1
    group_operators = order[group_at]
    operator = tokens[group_operators].astype(np.intp) - FIRST_OPERATOR_ID
    level_starts = np.searchsorted(levels[group_operators], np.arange(int(levels.max()) + 2))
    value = DIGIT_VALUE[tokens]
    for level in range(int(levels.max()), 0, -1):
        first, end = level_starts[level], level_starts[level + 1]
        if first == end:
            continue
        at = offsets[first:end] - offsets[first]
        argument_values = value[arguments[offsets[first]:offsets[end - 1] + counts[end - 1]]]
        present = np.bitwise_or.reduceat(DIGIT_BIT[argument_values], at)  # which digits a group holds
        result = np.choose(operator[first:end], [LOWEST_BIT[present], HIGHEST_BIT[present], 0,
                                                 np.add.reduceat(argument_values, at, dtype=np.int32) % 10])
        median = operator[first:end] == MEDIAN
        if median.any():
            result[median] = _medians(argument_values[np.repeat(median, counts[first:end])], counts[first:end][median])
        value[closing[first:end]] = result
    return value


def _medians(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``int(np.median)`` of each group of digits (``values`` group after group, ``counts`` long): the floor of
    the mean of its middle pair, found through how many of its digits are at most each digit."""
    group = np.repeat(np.arange(len(counts)), counts)
    at_most = np.cumsum(np.bincount(values.astype(np.intp) * len(counts) + group, minlength=10 * len(counts))
                        .reshape(10, len(counts)), axis=0)
    lower = (at_most <= (counts - 1) // 2).sum(axis=0)  # the k-th smallest: how many digits have ≤ k at most them
    upper = (at_most <= counts // 2).sum(axis=0)
    return (lower + upper) // 2

