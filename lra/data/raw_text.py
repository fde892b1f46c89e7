"""The user's raw text files (ListOps' and Retrieval's TSVs, Pathfinder's metadata), as every reader takes them.

A UTF-8 byte-order mark at the start is read past: an editor or a Windows tool that saved the file may have put
it there, and it is no character of the data. The rest of the file must still be in the official layout, which
each reader checks as it would without the mark. A release file cut at a line boundary reads as whole, so its
row count is held to the release's (:func:`note_unlike_release`)."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Callable


def without_byte_order_mark(start: bytes) -> bytes:
    """``start`` (a file's first line, or the whole file) without a leading UTF-8 byte-order mark."""
    return start.removeprefix(codecs.BOM_UTF8)


def note_unlike_release(path: Path, rows: int, released: int, announce: Callable[[str], None]) -> None:
    """A note when ``path``, read as a file of the LRA release, held ``rows`` rows where the release's holds
    ``released``: a download or extraction cut at a line boundary reads as whole (a note, not a refusal: an
    edited copy may be meant)."""
    if rows == released:
        return
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        handle.seek(max(size - 1, 0))
        ends = size == 0 or handle.read(1) == b"\n"
    cut = "" if ends else " and its last line has no line end (cut inside it?)"
    announce(f"note: {path} holds {rows:,} rows where the LRA release's holds {released:,}{cut}: if it should be "
             "the release, it is cut or edited; re-extract the release")
