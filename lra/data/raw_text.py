"""A UTF-8 byte-order mark at the start of one of the user's raw text files (ListOps' and Retrieval's TSVs,
Pathfinder's metadata) is read past, by every reader alike: an editor or a Windows tool that saved the file may
have put it there, and it is no character of the data. The rest of the file must still be in the official
layout, which each reader checks as it would without the mark."""

from __future__ import annotations

import codecs


def without_byte_order_mark(start: bytes) -> bytes:
    """``start`` (a file's first line, or the whole file) without a leading UTF-8 byte-order mark."""
    return start.removeprefix(codecs.BOM_UTF8)
