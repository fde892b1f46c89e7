"""ListOps (Nangia & Bowman 2018, as packaged by LRA): a seeded generator, the TSV format, and
the original tokenisation with a fixed vocabulary.

The generator follows the published sampling process exactly (see ``../shared/spec/lra-data.md``):
recursion from depth 1; below ``max_depth`` a node is an operator with probability 0.25, otherwise a
digit 0–9; an operator picks one of MIN/MAX/MED/SM and ``randint(2, max_args)`` children; a tree is
kept only when ``min_length < length < max_length`` tokens, and duplicates are dropped. Unlike the
original it draws from a seeded ``random.Random``, so the same settings give the same files.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from attention_zoo.options import number, whole
from lra.data.cache import sha256_file
from lra.data.raw_text import without_byte_order_mark
from lra.errors import UserError
from lra.faults import fault_point
from lra.io import atomic_write_text, naming, remove_stale

# Draws in a row without a new kept tree after which the length window is taken to be exhausted.
STALL_LIMIT = 1_000_000

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
SPLITS = ("train", "val", "test")
RELEASE_ROWS = {"train": 96_000, "val": 2_000, "test": 2_000}  # the rows of each basic_*.tsv in the LRA release

# Fixed vocabulary: 0 padding, 1 out-of-vocabulary, then digits, operators and the closing token
# (``]`` is written ``X`` by the original tokeniser). 17 ids in all.
PAD_ID, OOV_ID = 0, 1
DIGITS = tuple(map(str, range(10)))
VOCABULARY: Tuple[str, ...] = ("<pad>", "<oov>", *DIGITS, *OPERATORS, "X")
TOKEN_TO_ID = {token: i for i, token in enumerate(VOCABULARY)}

Tree = Union[str, list]  # a leaf digit, or [operator, child, …]


@dataclass
class GeneratorSettings:
    """Parameters of the official generator; the defaults made ``listops-1000``."""

    seed: int = 0
    num_train: int = 96_000
    num_val: int = 2_000
    num_test: int = 2_000
    min_length: int = 500
    max_length: int = 2_000
    max_depth: int = 10
    max_args: int = 10
    operator_probability: float = 0.25

    def __post_init__(self):
        whole(self, 0, "seed", "min_length", "num_val", "num_test")
        whole(self, 1, "num_train", "max_depth")
        whole(self, 2, "max_args")
        # Kept trees have min_length < length < max_length; an operator node has at least 4 tokens.
        whole(self, max(self.min_length + 2, 5), "max_length")
        number(self, "operator_probability", 0.0, 1.0, low_open=True)

    def sizes(self) -> dict:
        return {"train": self.num_train, "val": self.num_val, "test": self.num_test}

    def as_dict(self) -> dict:
        return asdict(self)


def tree_sampler(rng: random.Random, s: GeneratorSettings) -> Callable[[], Tuple[Optional[Tree], int]]:
    """One draw of the recursive process per call: (tree, token length), the tree an operator node
    ``[op, child, …]`` or a leaf digit (a one-character string).

    A draw stops as soon as its length reaches ``max_length`` (it will be rejected anyway) and returns
    ``None`` as its tree. Each draw is independent, so stopping early changes which random numbers later
    draws use but not the distribution of the trees that are kept. The draws are ``random.Random``'s
    (``random()``; ``randint`` and ``choice`` as their rejection sampling on ``getrandbits`` computes them,
    inlined: the same numbers from the same seed, a third of the time).
    """
    chance, getrandbits = rng.random, rng.getrandbits
    max_depth, max_length, probability = s.max_depth, s.max_length, s.operator_probability
    arities = s.max_args - 1  # randint(2, max_args): 2 + a draw below max_args − 1
    arity_bits, operator_bits, digit_bits = arities.bit_length(), len(OPERATORS).bit_length(), 10 .bit_length()

    def digit() -> str:
        drawn = getrandbits(digit_bits)
        while drawn >= 10:
            drawn = getrandbits(digit_bits)
        return DIGITS[drawn]

    def operator_node(depth: int) -> Tuple[Optional[Tree], int]:
        """The node at ``depth`` once its draw made it an operator: its children, then its operator."""
        arity = getrandbits(arity_bits)
        while arity >= arities:
            arity = getrandbits(arity_bits)
        node: list = [None]
        length, below, branches = 2, depth + 1, depth + 1 < max_depth
        for _ in range(arity + 2):
            if branches and chance() < probability:
                child, child_length = operator_node(below)
                length += child_length
                if child is None or length >= max_length:
                    return None, length
            else:  # a leaf: digit() without the call
                drawn = getrandbits(digit_bits)
                while drawn >= 10:
                    drawn = getrandbits(digit_bits)
                child, length = DIGITS[drawn], length + 1
                if length >= max_length:
                    return None, length
            node.append(child)
        operator = getrandbits(operator_bits)
        while operator >= len(OPERATORS):
            operator = getrandbits(operator_bits)
        node[0] = OPERATORS[operator]
        return node, length

    def draw() -> Tuple[Optional[Tree], int]:
        return operator_node(1) if 1 < max_depth and chance() < probability else (digit(), 1)

    return draw


def to_string(tree: Tree) -> str:
    """The official string form: an operator over children c1 … ck nested as binary pairs, each pair written
    ``( left right )``: ``[MAX 2 9 ]`` is ``( ( ( [MAX 2 ) 9 ) ] )``."""
    if not isinstance(tree, list):
        return tree
    parts = ["( " * len(tree), tree[0]]
    for child in tree[1:]:
        parts += [" ", child if child.__class__ is str else to_string(child), " )"]
    parts.append(" ] )")
    return "".join(parts)


def value_of(tree: Tree) -> int:
    """The value of a tree (the label), as :func:`evaluate_tokens` computes it from its tokens."""
    if not isinstance(tree, list):
        return int(tree)
    return apply_operator(tree[0], [int(child) if child.__class__ is str else value_of(child)
                                    for child in tree[1:]])


def tokenize(source: str) -> List[str]:
    """The original tokenisation: ``]`` → ``X``, parentheses dropped, split on whitespace."""
    return source.replace("]", "X").replace("(", "").replace(")", "").split()


def encode(source: str) -> np.ndarray:
    return np.fromiter((TOKEN_TO_ID.get(t, OOV_ID) for t in tokenize(source)), dtype=np.uint8)


def release_ids(source: str, where: str) -> np.ndarray:
    """The ids of one expression of a user's file; one with no token, or a token outside the vocabulary (the
    official files have neither: a lowercased or otherwise altered file would train on <oov> alone), raises
    naming ``where``."""
    ids = encode(source)
    if not len(ids):
        raise UserError(f"{where}: the expression has no token; the file is damaged or not a ListOps TSV")
    if (ids == OOV_ID).any():
        unknown = next(token for token in tokenize(source) if token not in TOKEN_TO_ID)
        raise UserError(f"{where}: {unknown[:40]!r} is not a ListOps token (digits 0-9, [MIN [MAX [MED [SM ] and "
                        "parentheses); the file is damaged or not a ListOps TSV")
    return ids


def evaluate_tokens(tokens: Sequence[str]) -> int:
    """The value of a tokenised expression (``[OP a b … X``); a malformed one raises ValueError saying why."""
    value, malformed = expression_value(tokens)
    if malformed is not None:
        raise ValueError(f"malformed ListOps expression: {malformed}")
    return value


def expression_value(tokens: Sequence[str]) -> Tuple[Optional[int], Optional[str]]:
    """(value, None) of a tokenised expression (``]`` written ``X``), or (None, what makes it malformed)."""
    open_operators: List[Tuple[str, int, List[int]]] = []  # (operator, its token number, its arguments' values)
    value, ended_at = None, None
    for position, token in enumerate(tokens, start=1):
        if ended_at is not None:
            shown = "]" if token == "X" else token
            return None, f"token {position} ({shown!r}) follows the end of the expression at token {ended_at}"
        if token in OPERATORS:
            open_operators.append((token, position, []))
            continue
        if token == "X":
            if not open_operators:
                return None, f"the ']' at token {position} closes no operator"
            operator, opened_at, arguments = open_operators.pop()
            if not arguments:
                return None, f"{operator!r} at token {opened_at} has no arguments"
            token_value = apply_operator(operator, arguments)
        else:
            token_value = int(token)
        if open_operators:
            open_operators[-1][2].append(token_value)
        else:
            value, ended_at = token_value, position
    if open_operators:
        operator, opened_at, _ = open_operators[-1]
        return None, f"{operator!r} at token {opened_at} is never closed by a ']'"
    if value is None:
        return None, "it has no token"
    return value, None


def apply_operator(op: str, args: Sequence[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        return int(statistics.median(args))  # floor of the mean of the middle pair, like int(np.median)
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def generate(settings: GeneratorSettings) -> Iterator[Tuple[str, str, int]]:
    """Yield (split, source string, label) for ``num_train + num_val + num_test`` distinct trees."""
    draw = tree_sampler(random.Random(settings.seed), settings)
    seen: set = set()
    for split, count in settings.sizes().items():
        produced, stalled = 0, 0
        while produced < count:
            stalled += 1
            if stalled > STALL_LIMIT:
                raise UserError(
                    f"the ListOps generator found only {len(seen):,} distinct expressions with "
                    f"{settings.min_length} < length < {settings.max_length} in {STALL_LIMIT:,} draws in a row, but "
                    f"{sum(settings.sizes().values()):,} are asked for; widen task.generator.min_length/max_length "
                    "or ask for fewer examples")
            tree, length = draw()
            if tree is None or not settings.min_length < length < settings.max_length:
                continue
            source = to_string(tree)
            if source in seen:
                continue
            stalled = 0
            seen.add(source)
            produced += 1
            yield split, source, value_of(tree)


def write_tsv_files(settings: GeneratorSettings, folder: Path, progress=None) -> None:
    """Write ``basic_{train,val,test}.tsv`` (header ``Source<TAB>Target``) into ``folder``.

    Files are written under temporary names and renamed at the end, so an interrupted generation
    leaves no partial file under an official name.
    """
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale(folder, r"\.basic_\w+\.tsv\.(?P<pid>\d+)\.partial")  # left by a killed generation
    # Per-process temporary names: concurrent jobs of a sweep may generate the same (seeded) files.
    temporary = {split: folder / f".basic_{split}.tsv.{os.getpid()}.partial" for split in SPLITS}
    handles = {}
    try:
        for split, path in temporary.items():
            handles[split] = open(path, "w", newline="")
        writers = {split: csv.writer(h, delimiter="\t", lineterminator="\n") for split, h in handles.items()}
        for writer in writers.values():
            writer.writerow(["Source", "Target"])
        for split, source, label in generate(settings):
            writers[split].writerow([source, label])
            fault_point("listops_example", temporary[split])
            if progress is not None:
                progress.update(1)
        for handle in handles.values():
            handle.close()  # flushes: a full disk is met here too
        for split, path in temporary.items():
            path.replace(folder / f"basic_{split}.tsv")
    except BaseException:  # a full disk, ctrl-C, bad settings, a folder in a file's way: no partial file stays
        for handle in handles.values():
            with contextlib.suppress(OSError):  # closing flushes, and a full disk fails that too
                handle.close()
        for path in temporary.values():
            path.unlink(missing_ok=True)
        named = naming(sys.exc_info()[1], folder)
        if named is not None:
            raise named from sys.exc_info()[1]
        raise


GENERATED = "generator.json"  # the generator's record: its settings and the SHA-256 of each file it wrote
NOT_GENERATED = "not generated"


def write_generated(settings: GeneratorSettings, folder: Path, progress=None) -> None:
    """:func:`write_tsv_files`, then the record (:data:`GENERATED`) that :func:`generated_problem`
    checks the files against before they are read."""
    write_tsv_files(settings, folder, progress)
    files = {f"basic_{split}.tsv": sha256_file(folder / f"basic_{split}.tsv") for split in SPLITS}
    atomic_write_text(folder / GENERATED, json.dumps({"settings": settings.as_dict(), "files": files}, indent=2) + "\n")


def generated_problem(settings: GeneratorSettings, folder: Path) -> Optional[str]:
    """None when ``folder`` holds the files ``settings`` generate, as its record says they were written;
    :data:`NOT_GENERATED` when it holds none of them; otherwise what differs (a file changed, truncated
    or missing, a record missing or of other settings)."""
    names = [f"basic_{split}.tsv" for split in SPLITS]
    if not (folder / GENERATED).exists() and not any((folder / name).exists() for name in names):
        return NOT_GENERATED
    try:
        record = json.loads((folder / GENERATED).read_text())
        recorded = record["files"]
        if record["settings"] != settings.as_dict():
            return f"{GENERATED} records other settings"
    except FileNotFoundError:
        return f"has no {GENERATED} (the record of what was generated)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"has an unreadable {GENERATED} (or one written before checksums were recorded)"
    for split, name in zip(SPLITS, names):
        path = folder / name
        if not path.is_file():
            return f"lacks {name}"
        if sha256_file(path) != recorded.get(name):
            with open(path, "rb") as handle:
                rows = max(sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b"")) - 1, 0)
            return (f"{name} changed since it was generated ({rows:,} rows on disk, {settings.sizes()[split]:,} "
                    "generated)")
    return None


def find_release(path: Optional[str], strict: bool = True) -> Path:
    """Accept the release root at either nesting level, or the ``listops-1000`` folder itself; with
    ``strict`` off, a folder without the files is taken as it is (the cache prepared from it, which the files
    may have left since, is still found by its name)."""
    if not path:
        raise UserError("task.source=lra_release needs the release folder: add task.path=/path/to/lra_release")
    root = Path(path).expanduser().resolve()
    for candidate in (root, root / "listops-1000", root / "lra_release" / "listops-1000"):
        if all((candidate / f"basic_{s}.tsv").is_file() for s in SPLITS):
            return candidate
    if not strict:
        return root
    raise UserError(
        f"no basic_{{train,val,test}}.tsv under {root} (looked in ., listops-1000/, lra_release/listops-1000/); "
        "point task.path (lra-prepare's --path) at the extracted LRA release"
    )


def read_tsv_rows(path: Path) -> Iterator[Tuple[int, str, int]]:
    """Yield (line number, source, label) of an official ListOps TSV file; an empty file, a missing
    header, a malformed row, a label that is not a whole number, bytes that are not UTF-8 or a carriage
    return other than a CRLF line ending raise a :class:`UserError` naming the file and line. A leading
    byte-order mark is read past (:mod:`lra.data.raw_text`)."""

    def decoded(handle):
        for line, raw in enumerate(handle, start=1):
            if line == 1:
                raw = without_byte_order_mark(raw)
            if b"\r" in raw and b"\r" in raw.removesuffix(b"\n").removesuffix(b"\r"):
                raise UserError(f"{path}:{line}: a carriage return (CR) inside a line: the file's lines end in CR "
                                "alone (old Mac line endings) or it is damaged; the release's end in LF: convert them "
                                "(tr '\\r' '\\n' < old.tsv > new.tsv) or re-extract the release")
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{line}: not UTF-8 text ({exc.reason}); the file is damaged or not a "
                                "ListOps TSV") from None

    with open(path, "rb") as handle:
        # ListOps has no quoting: a stray '"' is a character of its row, not a field running on to the end
        reader = csv.reader(decoded(handle), delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            header = next(reader, None)
            if header is None:
                raise UserError(f"{path} is empty; expected the header 'Source<TAB>Target' and one row per example")
            if header != ["Source", "Target"]:
                raise UserError(f"{path}:1: expected the header 'Source<TAB>Target', found {header!r}; the file is "
                                "damaged or not a ListOps TSV (the release's basic_*.tsv start with that header)")
            for row in reader:
                line_number = reader.line_num
                if len(row) != 2:
                    raise UserError(f"{path}:{line_number}: expected 2 tab-separated fields (Source, Target), "
                                    f"found {len(row)}")
                yield line_number, row[0], _label(row[1], f"{path}:{line_number}")
        except csv.Error as exc:
            raise UserError(f"{path}:{reader.line_num}: not a well-formed TSV row ({exc})") from None


def _label(text: str, where: str) -> int:
    """The label column as the release writes it, ASCII digits alone: ``int`` would also take ``+2``, ``0_2``,
    `` 2 `` and other scripts' digits."""
    if not (text.isascii() and text.isdigit()):
        raise UserError(f"{where}: the label {ascii(text[:20])} is not a whole number written in the digits 0-9; the "
                        "file is damaged or not a ListOps TSV")
    return int(text)


def read_tsv(path: Path) -> Iterator[Tuple[str, int]]:
    """Yield (source, label) rows of an official ListOps TSV file (see :func:`read_tsv_rows`)."""
    for _, source, label in read_tsv_rows(path):
        yield source, label
