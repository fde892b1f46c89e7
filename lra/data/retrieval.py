"""LRA Retrieval (ACL Anthology Network document pairs), from ``tsv_data/new_aan_pairs.*.tsv``.

Each line: ``label<TAB>id1<TAB>id2<TAB>text1<TAB>text2``, no header, no quoting (the texts contain
quote characters); the label is written as a float. Files are read as bytes, so the byte-level
encoding sees exactly the file's bytes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, Optional, Tuple

from lra.data.raw_text import without_byte_order_mark
from lra.errors import UserError

FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
RELEASE_PAIRS = {"train": 147_086, "val": 18_090, "test": 17_437}  # the lines of each file in the LRA release


def find_release(path: Optional[str]) -> Path:
    """The folder holding the three AAN TSVs: ``path``, ``path/tsv_data`` or ``path/lra_release/tsv_data``."""
    if not path:
        raise UserError("retrieval needs the LRA release: add --path /path/to/lra_release (task.path=...)")
    root = Path(path).expanduser().resolve()
    for candidate in (root, root / "tsv_data", root / "lra_release" / "tsv_data"):
        if all((candidate / name).is_file() for name in FILES.values()):
            return candidate
    raise UserError(f"no {', '.join(FILES.values())} under {root} (looked in ., tsv_data/, lra_release/tsv_data/); "
                    "point --path (lra-train's task.path) at the extracted LRA release")


LABEL = re.compile(rb"[01](\.0*)?")  # a float column in the release: 1 or 1.0


def read_pairs(path: Path) -> Iterator[Tuple[bytes, bytes, int]]:
    """(text1, text2, label) per line of one AAN TSV; a malformed line raises naming file and line. A leading
    byte-order mark is read past (:mod:`lra.data.raw_text`)."""
    with open(path, "rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line_number == 1:
                line = without_byte_order_mark(line)
            fields = line.rstrip(b"\r\n").split(b"\t")
            if len(fields) != 5:
                raise UserError(f"{path}:{line_number}: expected 5 tab-separated fields "
                                f"(label, id1, id2, text1, text2), found {len(fields)}")
            if not LABEL.fullmatch(fields[0]):  # 0.5, inf, nan, and what float() reads besides: "+1", "1_0", " 1"
                raise UserError(f"{path}:{line_number}: the label is {fields[0][:20].decode(errors='replace')!r}, "
                                "expected 0 or 1 (written 0, 1, 0.0 or 1.0): the file is damaged or not the LRA "
                                "release; re-extract it")
            yield fields[3], fields[4], int(fields[0][:1])


def count_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)
