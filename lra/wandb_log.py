"""A W&B offline run's transaction log (``wandb/offline-run-*/run-<id>.wandb``), checked whole before it is
uploaded.

The file is a 7-byte header (``:W&B``, the magic 0xBEE1, a version byte) followed by LevelDB's log
framing: 32 KiB blocks of chunks, each a 7-byte header (a CRC-32 of its type byte and payload, the
payload's length, its type: a full record, or the first, a middle or the last piece of one) and its
payload; a block's tail too short for a header is zeros. A run killed while writing (or still being
written) ends in a cut chunk or a record's first piece without its last: ``wandb sync`` uploads what
comes before and reports the rest with an error, yet exits 0.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Optional

BLOCK = 32 * 1024
HEADER = struct.Struct("<4sHB")  # ":W&B", 0xBEE1, version
CHUNK = struct.Struct("<IHB")  # CRC-32 of type + payload, payload length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAGIC = (b":W&B", 0xBEE1)
MAX_BYTES = 2**30  # an LRA run's log is kB to MB; what is bigger is read by wandb alone
PARTLY_READABLE = ("ends with an incomplete record", "is damaged")  # problems that leave a readable part


def problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a whole W&B transaction log (one phrase, its subject the file), or None."""
    from lra.results.reading import Unreadable, read_bytes

    try:
        data = read_bytes(Path(path), limit=MAX_BYTES)
    except Unreadable as exc:  # a named pipe (reading it would wait for ever), a device, a link loop, …
        return f"cannot be read: {exc}"
    if len(data) < HEADER.size or HEADER.unpack_from(data)[:2] != MAGIC:
        return "is not a W&B transaction log (its header is not :W&B's)"
    position, in_record, records = HEADER.size, False, 0
    while position < len(data):
        left = BLOCK - position % BLOCK
        if left < CHUNK.size or not any(data[position:position + min(left, CHUNK.size)]):
            if any(data[position:position + left]):
                return f"is damaged at byte {position:,} (bytes after a block's zero padding)"
            position += left  # a block's zero tail
            continue
        if len(data) - position < CHUNK.size:
            return _cut(position, len(data))
        checksum, length, kind = CHUNK.unpack_from(data, position)
        end = position + CHUNK.size + length
        if end > len(data):
            return _cut(position, len(data))
        if length > left - CHUNK.size or kind not in (FULL, FIRST, MIDDLE, LAST):
            return f"is damaged at byte {position:,} (a chunk that cannot be: type {kind}, {length:,} bytes)"
        if zlib.crc32(data[position + CHUNK.size - 1:end]) != checksum:
            return f"is damaged at byte {position:,} (a chunk's checksum does not match its contents)"
        if (kind in (FULL, FIRST)) == in_record:
            return f"is damaged at byte {position:,} (a record's pieces out of order)"
        in_record = kind in (FIRST, MIDDLE)
        records += kind in (FULL, LAST)
        position = end
    if in_record:
        return _cut(position, len(data))
    if not records:
        return "holds no record (the run ended before W&B wrote anything)"
    return None


def _cut(position: int, size: int) -> str:
    return (f"ends with an incomplete record (cut at byte {position:,} of {size:,}: the run was killed while W&B "
            "wrote it, or is still writing)")
