"""What a cache was prepared from, recorded so that a later change to the user's raw files is noticed.

A cache built from the user's files (the LRA release, aclImdb, the CIFAR-10 pickles, Pathfinder release
images) records two digests of them in its manifest (``raw_files``), both over the files' paths below the
folder they share (a folder moved or copied keeps them): of every file's size and modification time, and
of their bytes. The files are taken to be unchanged when the first matches or, when it does not (the files
were copied or touched), the second does, and then the first is recorded anew (the next start reads no
bytes; a read-only data folder keeps the old one); otherwise the cache is stale: lra-prepare rebuilds it, and
lra-train, which checks the sources of a few files (ListOps' and Retrieval's TSVs, the CIFAR pickles; not
aclImdb's 100,000 reviews or Pathfinder's 200,000 images, whose listing alone costs seconds a start),
rebuilds ListOps' release cache itself and refuses the others with the command that rebuilds them. Raw
files that are gone or unreadable are not judged: a user may delete them once prepared, and the cache is
checked against its own digests.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from lra.data.cache import hash_into, refresh_manifest
from lra.errors import UserError

RAW_FILES = "raw_files"  # the manifest's field


def _names(files: Sequence[Path]) -> List[str]:
    """The files' paths below the folder they share: the same files moved or copied elsewhere keep them."""
    if not files:
        return []
    common = os.path.commonpath([str(file) for file in files]) if len(files) > 1 else str(files[0].parent)
    return [os.path.relpath(file, common) for file in files]


def _stat_digest(files: Sequence[Path], names: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for name, file in zip(names, files):
        status = file.stat()
        digest.update(f"{name}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _content_digest(files: Sequence[Path], names: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for name, file in zip(names, files):
        digest.update(f"{name}\0".encode())
        hash_into(digest, file)
    return digest.hexdigest()


def signature(list_files: Callable[[], List[Path]]) -> Optional[dict]:
    """The manifest's record of the files ``list_files`` names: their count and the two digests; None where
    they cannot be listed or read (the build that reads them says what is wrong)."""
    try:
        files = list_files()
        names = _names(files)
        return {"count": len(files), "stat": _stat_digest(files, names), "content": _content_digest(files, names)}
    except (UserError, OSError):
        return None


def change(list_files: Callable[[], List[Path]], recorded: Optional[dict]) -> Tuple[Optional[str], Optional[str]]:
    """How the raw files differ from ``recorded`` (a manifest's :data:`RAW_FILES`), or None: unchanged, nothing
    recorded, or the files cannot be listed or read now; and, where only their contents showed them unchanged,
    their stat digest now (else None)."""
    if not isinstance(recorded, dict):
        return None, None
    try:
        files = list_files()
        if len(files) != recorded.get("count"):
            return f"now {len(files):,} files where the cache was prepared from {recorded.get('count')!r}", None
        names = _names(files)
        stat = _stat_digest(files, names)
        if stat == recorded.get("stat"):
            return None, None
        if _content_digest(files, names) == recorded.get("content"):
            return None, stat
    except (UserError, OSError):
        return None, None
    return "their contents changed since the cache was prepared from them", None


def stale(task: str, list_files: Callable[[], List[Path]], locate: Callable[[], Optional[str]], cache_dir: Path,
          manifest: dict, command: str, announce: Callable[[str], None], rebuild_allowed: bool) -> bool:
    """Whether the cache in ``cache_dir`` (its ``manifest``) must be rebuilt because the raw files it was
    prepared from changed since; where the harness may not rebuild it (``rebuild_allowed`` off: lra-train over
    the user's large files), one line naming ``command`` --force instead."""
    recorded, prepared_from = manifest.get(RAW_FILES), manifest.get("raw_folder")
    try:
        folder = locate()
    except UserError:
        return False  # the raw folder is gone: the cache stands on its own digests
    if prepared_from != folder:
        return False  # prepared from another folder: lra-prepare rebuilds it, lra-train refuses it
    changed, stat_now = change(list_files, recorded)
    if changed is None:
        if stat_now is not None:
            refresh_manifest(cache_dir, manifest, {RAW_FILES: {**recorded, "stat": stat_now}})
        return False
    if not rebuild_allowed:
        raise UserError(f"the raw {task} files in {folder} differ from those {cache_dir} was prepared from "
                        f"({changed}); prepare it again with: {command} --force")
    announce(f"the raw {task} files in {folder} differ from those the cache was prepared from ({changed}); "
             "rebuilding it")
    return True
